"""docker-compose.yml: its structure, its agreement with the native runner, and a real Compose parser."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from runwatch.lab import ALERTMANAGER_FLAGS, PROMETHEUS_FLAGS
from runwatch.paths import REPO

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


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
    assert "test" in svc["healthcheck"]
    for dep, cond in svc.get("depends_on", {}).items():
        assert dep in SERVICES and cond == {"condition": "service_healthy"}


def test_prometheus_and_alertmanager_flags_match_the_native_runner():
    prom = SERVICES["prometheus"]["command"]
    assert [
        f for f in prom if f not in ("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus")
    ] == PROMETHEUS_FLAGS
    assert set(ALERTMANAGER_FLAGS) <= set(SERVICES["alertmanager"]["command"])


def test_grafana_has_no_default_password_and_anonymous_viewers():
    env = SERVICES["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


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


def test_a_real_compose_parser_accepts_the_file(tmp_path):
    cli = compose_cli()
    if cli is None:
        pytest.fail("no Compose parser: apt-get install --no-install-recommends docker-compose")
    env = {"GRAFANA_ADMIN_PASSWORD": "test", "PATH": "/usr/bin:/bin:/usr/local/bin"}
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


def test_compose_refuses_to_start_without_an_admin_password():
    cli = compose_cli()
    if cli is None:
        pytest.fail("no Compose parser: apt-get install --no-install-recommends docker-compose")
    res = subprocess.run(
        [*cli, "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert res.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in res.stderr
