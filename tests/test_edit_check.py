"""A learner's edit, checked by what it leaves true (runwatch.prom.edits; issue 36, item 1), with
the real promtool: `runwatch check --edit-of RULES` leaves out the unit-test groups that pin an
edited alert's shipped values, and says which; `runwatch check` alone stays strict."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.core.paths import REPO, Layout
from runwatch.prom.edits import changed_alerts, check_edit, groups
from tests.conftest import edit, keep_unit_tests, threshold

pytestmark = pytest.mark.integration


def check(root: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "runwatch", "check", "--root", str(root), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the configuration, with the rules as shipped kept beside it (the rules in force)."""
    for d in ("prometheus", "alertmanager"):
        shutil.copytree(REPO / d, tmp_path / d)
    shutil.copytree(REPO / "prometheus" / "rules", tmp_path / "in-force")
    return tmp_path


def test_a_threshold_edit_passes_as_an_edit_and_fails_the_repository_s_strict_check(copy):
    keep_unit_tests(copy, alerts=("TrainingLossJump", "HeldOutGap"), incidents=("TrainingLossJump",), two_runs=())
    alerts = copy / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, threshold("TrainingLossJump", "3"), threshold("TrainingLossJump", "2.5"))
    res = check(copy, f"--edit-of={copy / 'in-force'}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "left out, as they pin the values of TrainingLossJump as shipped" in res.stdout
    assert "incidents.test.yml group 1 (corrupt_shard seed 1000)" in res.stdout
    strict = check(copy)
    assert strict.returncode == 1 and "FAIL  promtool test rules" in strict.stdout


@pytest.mark.slow  # every unit test of the shipped rules, one promtool a group: half a minute of both cores
def test_each_group_alone_passes_on_the_rules_as_shipped(copy):
    """Run group by group, the unit tests pass as the files do (promtool reads `values: 0x100` as
    a hundred zeros, YAML 1.1 as 256: the groups are written out as promtool reads them)."""
    layout = Layout(copy)
    assert changed_alerts(copy / "in-force", layout.rules_dir) == set()
    ok, lines = check_edit(layout, copy / "in-force")
    assert ok and lines == [], lines
    assert len(groups(layout, set())) > 20


def test_an_edit_that_pages_on_two_healthy_runs_is_refused_by_the_two_runs_evaluation(copy):
    keep_unit_tests(copy, two_runs=(), baselines=())
    alerts = copy / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, threshold("TrainingLossJump", "3"), threshold("TrainingLossJump", "0.5"))
    ok, lines = check_edit(Layout(copy), copy / "in-force")
    assert not ok
    # first, as it says most plainly what is wrong: the edit pages on two healthy runs
    assert lines[0].startswith("tests/two_runs.test.yml group 1"), lines[0]
    assert any(line.startswith("tests/two_runs") and 'alertname="TrainingLossJump"' in line for line in lines), lines


def test_groups_an_earlier_edit_broke_are_left_out_and_named(copy):
    keep_unit_tests(copy, alerts=("TrainingLossJump", "HeldOutGap"), two_runs=())
    alerts = copy / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, threshold("TrainingLossJump", "3"), threshold("TrainingLossJump", "2.5"))
    shutil.rmtree(copy / "in-force")
    shutil.copytree(copy / "prometheus" / "rules", copy / "in-force")  # TrainingLossJump at 2.5 is in force
    edit(alerts, threshold("HeldOutGap", "2"), threshold("HeldOutGap", "1.5"))
    ok, lines = check_edit(Layout(copy), copy / "in-force")
    assert ok, lines
    assert any(line.startswith("left out, as they pin the values of HeldOutGap as shipped") for line in lines)
    earlier = [line for line in lines if "fail on the rules in force too" in line]
    assert earlier and "alerts.test.yml group 1" in earlier[0], lines


def test_edit_of_a_folder_that_is_not_there_is_one_line(copy):
    res = check(copy, f"--edit-of={copy / 'nowhere'}")
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert "--edit-of:" in res.stderr and "is not a folder of rule files" in res.stderr, res.stderr
