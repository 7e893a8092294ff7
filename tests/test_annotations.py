"""prometheus/make_annotations.py: one pattern for every runbook link and step lookup, and drift caught."""

import importlib.util
import shutil
import subprocess

import pytest
import yaml

from runwatch.core.names import RUNBOOK_BASE
from runwatch.core.paths import REPO
from tests.conftest import edit, need

SCRIPT = REPO / "prometheus" / "make_annotations.py"
RULES = REPO / "prometheus" / "rules"


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def module():
    spec = importlib.util.spec_from_file_location("make_annotations", SCRIPT)
    found = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(found)
    return found


@pytest.fixture
def rules(tmp_path):
    shutil.copytree(RULES, tmp_path / "rules")
    return tmp_path / "rules"


def alerts_of(rules):
    return [r for f in sorted(rules.glob("*.yml")) for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]
            if "alert" in r]  # fmt: skip


@pytest.mark.integration
def test_the_shipped_rules_are_written_from_the_pattern():
    res = make("--check")
    assert res.returncode == 0, res.stderr


def test_the_pattern_is_the_pagers_address(module):
    assert module.BASE_URL == RUNBOOK_BASE  # the pager serves the runbooks the links open


@pytest.mark.integration
def test_a_drifted_link_or_step_is_named_and_rewritten_keeping_every_comment(rules):
    shipped = {f.name: f.read_text() for f in rules.glob("*.yml")}
    edit(rules / "alerts.yml", "runbooks/HeldOutGap.md", "runbooks/HeldOutGapp.md")
    edit(rules / "cluster.yml", '| printf "%.0f" }}{{ end }}\'', '| printf "%.1f" }}{{ end }}\'', 1)
    edit(rules / "alerts.yml", "At step {{ with printf", "At step {{with printf", 1)
    res = make("--check", "--rules", str(rules))
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert (
        sum("alerts.yml: line" in line for line in lines) == 2
        and sum("cluster.yml: line" in line for line in lines) == 1
    )
    assert any("HeldOutGapp" in line for line in lines), lines
    assert make("--rules", str(rules)).returncode == 0
    assert {f.name: f.read_text() for f in rules.glob("*.yml")} == shipped  # comments and all
    again = make("--rules", str(rules))
    assert again.returncode == 0 and again.stdout == ""  # idempotent: nothing left to write


@pytest.mark.integration
def test_an_alert_without_a_link_gets_one_under_its_annotations(rules):
    edit(rules / "meta.yml", "          runbook_url: http://127.0.0.1:9095/runbooks/PagerDown.md\n", "")
    assert make("--check", "--rules", str(rules)).returncode == 1
    assert make("--rules", str(rules)).returncode == 0
    assert make("--check", "--rules", str(rules)).returncode == 0
    [down] = [r for r in alerts_of(rules) if r["alert"] == "PagerDown"]
    assert down["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}/PagerDown.md"


@pytest.mark.integration
def test_another_base_url_renders_every_link_and_the_rules_stay_valid(rules, tmp_path):
    """What a Kubernetes chart will do: the pager's in-cluster address, written to another folder."""
    base = "http://pager.runwatch.svc:9095/runbooks"
    out = tmp_path / "rendered"
    assert make("--rules", str(rules), "--base-url", base + "/", "--out", str(out)).returncode == 0
    assert {r["annotations"]["runbook_url"] for r in alerts_of(out)} == {
        f"{base}/{r['alert']}.md" for r in alerts_of(out)
    }
    assert (rules / "alerts.yml").read_text() == (RULES / "alerts.yml").read_text()  # the source is left alone
    res = subprocess.run([need("promtool"), "check", "rules", *map(str, sorted(out.glob("*.yml")))],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_step_annotation_and_described_step_is_its_alerts_lookup(module):
    for rule in alerts_of(RULES):
        ann, lookup = rule["annotations"], module.step_of(rule["alert"])
        if "step" in ann:
            assert ann["step"] == lookup, rule["alert"]
        if "At step" in ann["description"]:
            assert f"At step {lookup}" in ann["description"], rule["alert"]


def test_every_alert_of_a_run_states_a_step_read_from_its_episode_record():
    """Item 3 of issue 27: a page's step is the step its alert fired at, for the cluster's alerts
    too; and (issue 37, item 4) the step its own episode began at, not the run's first."""
    for rule in alerts_of(RULES):
        if "run_id" not in yaml.safe_dump(rule["annotations"]) or rule["alert"] in ("TrainerDown",):
            continue
        assert "episode_fired{run_id=%q,alertname=%q}" in rule["annotations"].get("step", ""), rule["alert"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, message",
    [
        (["--base-url", "pager/runbooks"], "--base-url: expected http(s)://host/path"),
        (["--rules", "/nonexistent"], "--rules: no .yml rule files in /nonexistent"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(args, message):
    res = make(*args)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and message in res.stderr, res.stderr


@pytest.mark.integration
def test_an_alert_defined_twice_in_a_file_is_refused(rules):
    text = (rules / "meta.yml").read_text()
    (rules / "meta.yml").write_text(text + text[text.index("      - alert: Watchdog") :])
    res = make("--rules", str(rules))
    assert res.returncode == 2 and "meta.yml: line" in res.stderr and "Watchdog is defined twice" in res.stderr
