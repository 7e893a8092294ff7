"""docker-compose.yml: its structure, its agreement with the native runner, and a real Compose parser."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from runwatch.core.paths import REPO
from runwatch.lab.supervise import ALERTMANAGER_FLAGS, PROMETHEUS_FLAGS, loopback
from tests.conftest import runwatch

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
# Services that run once and exit before the others start: no healthcheck, never restarted
ONE_SHOT = {"credentials"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_images_are_pinned(name):
    image = SERVICES[name]["image"]
    repo, _, tag = image.rpartition(":")
    assert repo and tag and tag != "latest" and re.search(r"\d", tag), image


def test_the_base_image_is_pinned_and_the_user_is_not_root():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, re.M)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), base
    assert re.search(r"^USER (?!root)\w+", text, re.M)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_bind_mounts_exist_and_config_is_read_only(name):
    for vol in SERVICES[name].get("volumes", []):
        source, target, *mode = vol.split(":")
        if source.startswith("."):
            assert (REPO / source).is_dir(), f"{name}: {source} must be a directory in the repo"
            assert mode == ["ro"], f"{name}: mount {source} read-only"
        else:
            assert source in COMPOSE["volumes"], f"{name}: {source} is not a named volume"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_ports_only_on_loopback(name):
    for port in SERVICES[name].get("ports", []):
        assert port.startswith("127.0.0.1:"), port


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_healthchecks_and_healthy_dependencies(name):
    svc = SERVICES[name]
    if name in ONE_SHOT:
        assert "healthcheck" not in svc and "ports" not in svc, name
        return
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD" and not any(" " in arg for arg in test), test  # Podman splits arguments at spaces
    for dep, cond in svc.get("depends_on", {}).items():
        wanted = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
        assert dep in SERVICES and cond == {"condition": wanted}
    # a trainer that fails must not keep Prometheus (and so TrainerDown) from starting
    assert "trainer" not in svc.get("depends_on", {})


def test_every_service_has_a_network_namespace_of_its_own():
    """A sidecar (network_mode: service:X) dies with X's restart: the pager must stay reachable."""
    assert not [n for n, svc in SERVICES.items() if "network_mode" in svc]


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_logs_to_capped_json_files(name):
    """A lab left running for days keeps at most max-file x max-size of each service's log."""
    logging = SERVICES[name]["logging"]
    assert logging["driver"] == "json-file", name
    assert re.fullmatch(r"\d+m", logging["options"]["max-size"]) and int(logging["options"]["max-file"]) >= 1


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_what_crashes_comes_back_but_a_run(name):
    """Every service is restarted by the engine after a crash, but the trainer: each start of it
    is a new run, and a run that dies is what TrainerDown is there to show."""
    expected = None if name == "trainer" or name in ONE_SHOT else "unless-stopped"
    assert SERVICES[name].get("restart") == expected, name


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_memory_limit_above_its_measured_peak(name):
    """The limits come from the measured peaks, with headroom (docs/compose.md, "Compose as a service")."""
    limit = SERVICES[name]["deploy"]["resources"]["limits"]["memory"]
    mb = int(re.fullmatch(r"(\d+)M", limit)[1])
    doc = (REPO / "docs" / "compose.md").read_text()
    row = re.search(rf"^ *\| `{name}` \| (\d+ MB|-) \| (\d+ MB|-) \| {mb} MB \|", doc, re.M)
    assert row, f"docs/compose.md's memory table has no row for {name} with its limit of {mb} MB"
    if name == "grafana":  # no Grafana image can be had here (compose/podman/README.md): not measured
        assert row[1] == row[2] == "-"
        return
    peak = max(int(r.split()[0]) for r in (row[1], row[2]) if r != "-")  # a one-shot is gone by a backtest
    assert mb >= 1.5 * peak, (name, mb, row[0])


def test_alertmanager_addresses_the_pager_by_name_and_the_native_lab_by_loopback():
    config = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())
    urls = [w["url"] for r in config["receivers"] for w in r.get("webhook_configs", [])]
    assert urls and all(u.startswith("http://pager:9095/") for u in urls)
    native = yaml.safe_load(loopback((REPO / "alertmanager" / "alertmanager.yml").read_text()))
    assert all(w["url"].startswith("http://127.0.0.1:9095/") for r in native["receivers"] for w in r["webhook_configs"])
    assert '"pager:9095"' in (REPO / "compose" / "targets" / "pager.json").read_text()


def test_the_run_is_chosen_by_environment_variables():
    command = " ".join(SERVICES["trainer"]["command"])
    for var in ("RUNWATCH_INCIDENT", "RUNWATCH_SEED", "RUNWATCH_PRECISION", "RUNWATCH_FAST_FORWARD"):
        assert "${" + var in command, var
    assert "--run-id" not in command  # each run is stamped with an id of its own
    assert "--wait-for-prometheus" in command


def test_prometheus_and_alertmanager_flags_match_the_native_runner():
    prom = SERVICES["prometheus"]["command"]
    assert [
        f for f in prom if f not in ("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus")
    ] == PROMETHEUS_FLAGS
    assert set(ALERTMANAGER_FLAGS) <= set(SERVICES["alertmanager"]["command"])


def test_grafana_has_no_default_password_and_anonymous_viewers():
    svc = SERVICES["grafana"]
    env = svc["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env  # set by grafana/bin/start.sh, never admin/admin
    assert svc["entrypoint"] == ["/bin/sh", "/usr/local/share/runwatch/start.sh"]
    assert "./grafana/bin:/usr/local/share/runwatch:ro" in svc["volumes"]
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert ".env" in (REPO / ".gitignore").read_text().split()


def start_grafana(tmp_path: Path, password: str | None) -> tuple[str, str]:
    """grafana/bin/start.sh with a stand-in for Grafana's /run.sh: (its output, the password file)."""
    fake = tmp_path / "run.sh"
    fake.write_text(
        '#!/bin/sh\necho "run.sh $* file=$GF_SECURITY_ADMIN_PASSWORD__FILE pw=${GRAFANA_ADMIN_PASSWORD:-}"\n'
    )
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "GF_PATHS_DATA": str(tmp_path), "GRAFANA_RUN": str(fake)}
    if password is not None:
        env["GRAFANA_ADMIN_PASSWORD"] = password
    res = subprocess.run(["sh", str(REPO / "grafana" / "bin" / "start.sh"), "--flag"], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return res.stdout, (tmp_path / "admin-password").read_text()


@pytest.mark.integration
def test_grafana_password_is_chosen_or_generated_once_and_kept(tmp_path):
    out, chosen = start_grafana(tmp_path, "s3cret")
    assert chosen == "s3cret" and f"run.sh --flag file={tmp_path}/admin-password pw=" in out  # not passed on
    assert oct((tmp_path / "admin-password").stat().st_mode & 0o777) == "0o600"
    (tmp_path / "admin-password").unlink()
    out, generated = start_grafana(tmp_path, None)
    assert re.fullmatch(r"[0-9a-f]{36}", generated) and "generated Grafana's admin password" in out
    out, again = start_grafana(tmp_path, "")  # an empty variable, as compose passes an unset one
    assert again == generated and "generated" not in out


def test_compose_targets_cover_every_file_sd_job():
    prom = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    wanted = {f for job in prom["scrape_configs"] for sd in job["file_sd_configs"] for f in sd["files"]}
    have = {p.name for p in (REPO / "compose" / "targets").glob("*.json")}
    for pattern in wanted:
        assert any(Path(pattern).match(h) or Path(h).match(Path(pattern).name) for h in have), pattern


def compose_cli() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.integration
def test_a_real_compose_parser_accepts_the_file(tmp_path):
    cli = compose_cli()
    if cli is None:
        pytest.fail("no Compose parser: apt-get install --no-install-recommends docker-compose")
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin"}
    res = subprocess.run(
        [*cli, "-f", str(REPO / "docker-compose.yml"), "config", "-q"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr
    # and it rejects a broken one
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        (REPO / "docker-compose.yml").read_text().replace("condition: service_healthy", "condition: sometimes", 1)
    )
    res = subprocess.run([*cli, "-f", str(broken), "config", "-q"], capture_output=True, text=True, env=env)
    assert res.returncode != 0


@pytest.mark.integration
def test_no_compose_command_needs_a_variable():
    """`docker compose down` (or config, ps, logs) must work with nothing set."""
    cli = compose_cli()
    if cli is None:
        pytest.fail("no Compose parser: apt-get install --no-install-recommends docker-compose")
    res = subprocess.run(
        [*cli, "-f", str(REPO / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0 and "WARNING" not in res.stderr, res.stderr
    trainer = yaml.safe_load(res.stdout)["services"]["trainer"]["command"]
    assert "--incident=none" in trainer and "--seed=0" in trainer and "--precision=fp64" in trainer


def test_every_client_of_alertmanager_carries_the_credentials_volumes_password():
    """Compose's Alertmanager asks for a password (issue 40, N19): the file `credentials` writes
    is the one each client names, inside the same volume mounted at the same place."""
    password = "/credentials/alertmanager/password"
    assert SERVICES["credentials"]["command"] == ["runwatch", "credentials", "/credentials"]
    assert "--web.config.file=/credentials/alertmanager/web.yml" in SERVICES["alertmanager"]["command"]
    assert SERVICES["alertmanager"]["depends_on"] == {"credentials": {"condition": "service_completed_successfully"}}
    assert f"--alertmanager-password-file={password}" in SERVICES["console"]["command"]
    for name in ("alertmanager", "prometheus", "console", "grafana"):
        assert any(v.startswith("credentials:/credentials") for v in SERVICES[name]["volumes"]), name
    prom = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    to_am = [
        *prom["alerting"]["alertmanagers"],
        *(j for j in prom["scrape_configs"] if j["job_name"] == "alertmanager"),
    ]
    assert [c["basic_auth"] for c in to_am] == [{"username": "runwatch", "password_file": password}] * 2
    sources = yaml.safe_load((REPO / "grafana" / "provisioning" / "datasources" / "datasources.yml").read_text())
    (am,) = [d for d in sources["datasources"] if d["type"] == "alertmanager"]
    assert am["basicAuth"] and am["basicAuthUser"] == "runwatch"
    assert am["secureJsonData"]["basicAuthPassword"] == f"$__file{{{password}}}"
    assert password in (REPO / "compose" / "bin" / "alertmanager-ready.sh").read_text()


@pytest.mark.integration
def test_runwatch_credentials_makes_the_password_once_readable_by_the_other_images(tmp_path):
    from runwatch.core import credentials

    first = runwatch("credentials", str(tmp_path), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    made = credentials.folder(tmp_path)
    assert {f.name: f.stat().st_mode & 0o777 for f in made.iterdir()} == {
        n: 0o644 for n in ("password", "web.yml", "http.yml")
    }
    password = credentials.password_file(tmp_path).read_text()
    assert runwatch("credentials", str(tmp_path), cwd=tmp_path).returncode == 0
    assert credentials.password_file(tmp_path).read_text() == password  # kept: a running Alertmanager asks the same
    bad = runwatch("credentials", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == f"runwatch credentials: DIR: {tmp_path / 'nowhere'} is not a directory"
    )
