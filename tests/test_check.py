"""`runwatch check` on the repository and on a copy with a learner's broken edit."""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runwatch.core.paths import REPO
from tests.conftest import edit, keep_unit_tests, threshold

pytestmark = pytest.mark.integration


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runwatch", "check", "--root", str(root)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for d in ("prometheus", "alertmanager", "runbooks"):
        shutil.copytree(REPO / d, tmp_path / d)
    return tmp_path


def test_the_repository_passes_and_names_every_binary_it_uses_with_its_version(copy):
    from runwatch.prom.tools import BINARIES, binary, version

    res = check(copy)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ok  ") == 4
    (tested,) = [line.split()[4:] for line in res.stdout.splitlines() if line.startswith("ok    promtool test rules")]
    assert tested == [f"prometheus/tests/{f.name}" for f in sorted((REPO / "prometheus" / "tests").glob("*.test.yml"))]
    for name, line in zip(BINARIES, res.stdout.splitlines()[1:5], strict=True):
        found = binary(name)
        assert line.split() == [name, version(found), found], line
        assert int(version(found).split(".")[0]) >= (3 if name.startswith("prom") else 0), line


def test_broken_yaml_in_a_rule_file_names_the_file(copy):
    alerts = copy / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, "    rules:\n", "    rules:\n  - broken: [\n", 1)
    res = check(copy)
    assert res.returncode == 1
    assert "FAIL  promtool check rules" in res.stdout
    assert "alerts.yml" in res.stdout


def test_bad_promql_is_promtools_own_message(copy):
    alerts = copy / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, "> scalar(", ">> scalar(", 1)
    res = check(copy)
    assert res.returncode == 1
    assert "parse error" in res.stdout and "alerts.yml" in res.stdout
    # Once, not once per rule file and test group as promtool prints it (it was ~30 times), and
    # the unit tests, which cannot load the rules, are skipped.
    assert res.stdout.count("parse error") == 1, res.stdout
    assert "skip  promtool test rules" in res.stdout
    assert "does not exist" not in res.stdout  # prometheus/targets/ is empty in a checkout on purpose


def test_a_threshold_edit_that_breaks_a_unit_test_is_reported(copy):
    keep_unit_tests(copy, alerts=("GradientNormJump",), baselines=())
    alerts = copy / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, threshold("GradientNormJump", "3"), threshold("GradientNormJump", "3.5"))
    res = check(copy)
    assert res.returncode == 1
    assert "ok    promtool check rules" in res.stdout
    assert "FAIL  promtool test rules" in res.stdout and "GradientNormJump" in res.stdout


def test_a_failing_unit_test_comes_first_as_its_file_alert_time_and_exact_difference(copy):
    """The learner is told which case to change: the first line under the FAIL names the test
    file, the alert, the time and what differs, and no SUCCESS line comes before it. The labels
    of `got`, though repeated from `exp`, are all shown in promtool's output below."""
    keep_unit_tests(copy, cluster=(), baselines=(), meta=())  # the others would pass, as baselines and meta do
    tests = copy / "prometheus" / "tests" / "cluster.test.yml"
    edit(tests, 'step: "140"', 'step: "141"', 1)
    res = check(copy)
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FAIL  promtool test rules"))
    assert lines[at + 1].strip() == (
        'prometheus/tests/cluster.test.yml: RankDown at 40s: {alertname="RankDown", instance="r1", job="ranks", '
        'node="node0", rank="1", run_id="x", severity="critical"}: annotation step: exp \'141\', got \'140\''
    )
    assert "SUCCESS" not in res.stdout
    assert res.stdout.count('Labels:{alertname="RankDown", instance="r1"') == 2  # exp and got, both shown


def test_broken_alertmanager_config_is_amtools_message(copy):
    keep_unit_tests(copy, baselines=())  # amtool's message is this case's subject, not promtool's tests
    am = copy / "alertmanager" / "alertmanager.yml"
    edit(am, "receiver: oncall-ticket", "receiver: nobody", 1)
    res = check(copy)
    assert res.returncode == 1
    assert "FAIL  amtool check-config" in res.stdout and "nobody" in res.stdout


def test_a_hung_tool_is_killed_and_named_in_one_line():
    from runwatch.core.command import UsageError
    from runwatch.prom.tools import run_tool

    t0 = time.monotonic()
    with pytest.raises(UsageError) as err:
        run_tool(["sleep", "30"], timeout=0.3)
    assert str(err.value) == "sleep 30 did not finish in 0.3s; killed"
    assert time.monotonic() - t0 < 10


def old_binary(folder: Path, name: str, version: str) -> None:
    """An executable that reports an old version, as Debian 12's promtool 2.42 does: the check
    refuses it from its --version answer alone, before running it for anything else."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{name}, version {version} (branch: debian/sid, revision: {version}-5)'\n")
    path.chmod(0o755)


def run_with(path: str, fetched: Path, copy: Path) -> subprocess.CompletedProcess:
    env = {"PATH": path, "RUNWATCH_BIN": str(fetched), "HOME": str(copy)}
    return subprocess.run([sys.executable, "-m", "runwatch", "check", "--root", str(copy)], capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip


def test_a_prometheus_older_than_3_on_path_is_refused_with_what_to_run(copy, tmp_path):
    old = tmp_path / "debian12"
    for name in ("prometheus", "promtool"):
        old_binary(old, name, "2.42.0+ds")
    res = run_with(str(old), tmp_path / "nothing-fetched", copy)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert f"{old}/prometheus is prometheus 2.42.0+ds" in line and "need prometheus 3 or later" in line
    assert "make binaries" in line


def test_no_binaries_at_all_says_what_to_run(copy, tmp_path):
    res = run_with(str(tmp_path / "empty"), tmp_path / "nothing-fetched", copy)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert "prometheus not found in" in line and "nothing-fetched" in line and "make binaries" in line
