"""The rule workbench in the terminal: `runwatch backtest --strengths` and `--sweep`, through a
real Prometheus. A sweep's value is the backtest of the same edit, run by run.

The backtests that train and sweep are in the slow tier (`make test-slow`, about 2 minutes on
2 workers): `make test` keeps the parsers and one bad input of each flag."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.backtest.plan import Strengths, parse_strengths
from runwatch.backtest.variants import parse_sweep
from runwatch.core.command import UsageError
from runwatch.core.paths import REPO
from tests.conftest import edit, threshold

# Few runs, every strength band of the list, the incidents the loss alert should catch and the
# healthy one it should stay silent in.
SEEDS, INCIDENTS, STRENGTHS = "100-103", "none,lr_spike,repeated_batch", "0.1,0.3,1"


def backtest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runwatch", "backtest", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def fires(doc: dict, alert: str) -> dict:
    return {r["run_id"]: r["first_fire"][alert] for r in doc["runs"]}


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("sweep")
    res = backtest("--seeds", SEEDS, "--incidents", INCIDENTS, "--strengths", STRENGTHS,
                   "--sweep", "TrainingLossJump=1.5,2,4", "--plot", "sweep.png", "--json", "s.json",
                   cwd=tmp)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return {"tmp": tmp, "stdout": res.stdout, "doc": json.loads((tmp / "s.json").read_text())}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("value", ["1.5", "4"])
def test_a_sweeps_value_is_the_backtest_of_the_same_edit(swept, tmp_path, value):
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", threshold("TrainingLossJump", "3"), threshold("TrainingLossJump", value))
    res = backtest("--seeds", SEEDS, "--incidents", INCIDENTS, "--strengths", STRENGTHS, "--rules", str(rules),
                   "--json", "e.json", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    single = fires(json.loads((tmp_path / "e.json").read_text()), "TrainingLossJump")
    rows = {r["alert"]: r for r in swept["doc"]["summary"]["sweep"]["rows"]}
    variant = f"TrainingLossJump@{value}"
    # run by run: the variant's first fire is the edited rule's, and so are its pages
    assert fires(swept["doc"], variant) == single
    began = {r["run_id"]: r["began"]["TrainingLossJump"] for r in json.loads((tmp_path / "e.json").read_text())["runs"]}
    assert {r["run_id"]: r["began"][variant] for r in swept["doc"]["runs"]} == began
    # and the sweep's row counts them as the single backtest's report does
    edited = json.loads((tmp_path / "e.json").read_text())["summary"]
    assert rows[variant]["caught_total"] == sum(
        s is not None and s >= 300 for rid, s in single.items() if not rid.startswith("none")
    )
    assert rows[variant]["false_alarms"]["runs"] == sum(
        s is not None for rid, s in single.items() if rid.startswith("none")
    )
    assert edited["incidents"]["lr_spike"]["alerts"]["TrainingLossJump"]["fired"] == sum(
        s is not None for rid, s in single.items() if rid.startswith("lr_spike")
    )
    assert any(v is not None for v in single.values())


@pytest.mark.slow
@pytest.mark.integration
def test_the_rule_in_force_reads_the_same_in_its_row_and_as_a_variant(swept):
    rows = swept["doc"]["summary"]["sweep"]["rows"]
    assert rows[0]["alert"] == "TrainingLossJump" and rows[0]["value"] == "3" and rows[0]["in_force"]
    # a lower threshold catches at least as many runs as a higher one, and pages at least as often
    caught = [r["caught_total"] for r in rows[1:]]
    assert caught == sorted(caught, reverse=True) and caught[0] > caught[-1]
    assert (swept["tmp"] / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sweep of TrainingLossJump's threshold" in swept["stdout"] and "\n3 *" in swept["stdout"]
    # the strengths drawn, as the runs say, and the table by band
    doc = swept["doc"]
    assert {r["strength"] for r in doc["runs"] if r["incident"] != "none"} == {0.1, 0.3, 1.0}
    assert {r["strength"] for r in doc["runs"] if r["incident"] == "none"} == {1.0}
    assert set(doc["summary"]["by_strength"]["lr_spike"]) == {"0.1", "0.3", "1"}


@pytest.mark.slow
@pytest.mark.integration
def test_a_for_sweep_reads_each_for(tmp_path):
    res = backtest("--seeds", "100-101", "--incidents", "none,repeated_batch", "--sweep", "HeldOutGap.for=20s,30s",
                   "--json", "f.json", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = {r["alert"]: r for r in json.loads((tmp_path / "f.json").read_text())["summary"]["sweep"]["rows"]}
    assert rows["HeldOutGap"]["value"] == "10s"
    medians = [rows[a]["median"] for a in ("HeldOutGap", "HeldOutGap@for=20s", "HeldOutGap@for=30s")]
    # 10 s more of `for:` is 10 steps later while the gap holds (one run's closes before 30 s)
    assert medians[0] + 10 == medians[1] < medians[2], medians


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, flag",
    [(["--sweep", "Meteor=1,2"], "--sweep"), (["--strengths", "0-1"], "--strengths"),
     (["--sweep", "HeldOutGap=1,2", "--plot", "no/such/dir/x.png"], "--plot")],
)  # fmt: skip
def test_bad_workbench_flags_are_one_line_and_write_nothing(tmp_path, args, flag):
    res = backtest("--seeds", "0", "--incidents", "none", *args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_an_alert_without_its_threshold_recording_cannot_sweep_it(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", '> scalar(alert:runwatch_threshold:ratio{alertname="HeldOutGap"})', "> 2")
    res = backtest("--seeds", "0", "--incidents", "none", "--rules", str(rules), "--sweep", "HeldOutGap=1,2",
                   cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2 and "HeldOutGap.for=" in res.stderr, res.stderr


@pytest.mark.parametrize(
    "text", ["TrainingLossJump=a,b", "TrainingLossJump", "HeldOutGap.for=5", "HeldOutGap.for=1.5s", "=1,2",
             "HeldOutGap=5-2:1", "HeldOutGap=1-2:0"],
)  # fmt: skip
def test_each_bad_sweep_is_refused_naming_the_flag(text):
    with pytest.raises(UsageError, match="^--sweep: "):
        parse_sweep(text)


@pytest.mark.parametrize("text", ["0-1", "1-0.5", "0.5,2", "a-b", "0.5,", "nan", "0.0001,1"])
def test_each_bad_strengths_is_refused_naming_the_flag(text):
    with pytest.raises(UsageError, match="^--strengths: "):
        parse_strengths(text)


def test_the_parsers():
    assert parse_sweep("TrainingLossJump=2-3:0.5").values == ("2", "2.5", "3")
    assert parse_sweep("HeldOutGap.for=0s-20s:10s").values == ("0s", "10s", "20s")
    assert parse_sweep("HeldOutGap = 1.5, 2").names == ["HeldOutGap@1.5", "HeldOutGap@2"]
    with pytest.raises(UsageError, match="twice"):
        parse_sweep("HeldOutGap=2,2")
    with pytest.raises(UsageError, match="at most 32"):
        parse_sweep("HeldOutGap=1-100:1")
    drawn = parse_strengths("0.05-1")
    assert drawn == Strengths(0.05, 1.0) and drawn.of(3, "none") == 1.0 and drawn.of(3, "hang") == 1.0
    assert drawn.of(3, "lr_spike") == drawn.of(3, "lr_spike") and 0.05 <= drawn.of(3, "lr_spike") <= 1
    assert [drawn.band(s) for s in (0.05, 0.28, 0.3, 1.0)] == ["0.05-0.29", "0.05-0.29", "0.29-0.53", "0.76-1.00"]


@pytest.mark.parametrize(
    "args, said",
    [(["--plot", "x.png"], "--plot: draws a sweep's trade-off"),
     (["--sweep", "HeldOutGap=1,2", "--plot", "x.svg"], "--plot: writes a PNG"),
     (["--edit-of", "."], "--edit-of: compares a sweep's alert: give --sweep too"),
     (["--sweep", "HeldOutGap=1,2", "--edit-of", "nowhere"], "--edit-of: nowhere is not a directory")],
)  # fmt: skip
def test_a_plot_or_an_edit_of_without_what_it_needs_is_refused_before_anything_runs(tmp_path, monkeypatch, args, said):
    """--plot needs a sweep and a PNG; --edit-of a sweep and a folder."""
    import argparse

    from runwatch.backtest import backtest as bt

    monkeypatch.chdir(tmp_path)
    p = argparse.ArgumentParser()
    command = bt.add_arguments(p)
    with pytest.raises(UsageError, match=f"^{re.escape(said)}"):
        command(p.parse_args(["--seeds", "0", *args]))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_a_backtest_of_an_edit_marks_the_edit_and_the_rule_in_force(tmp_path):
    """The console's Backtest (issue 36, item 2): the sweep of an edit of TrainingLossJump to 2.5
    runs through the value in force (3), the edit is its first row, the rule in force (evaluated
    beside it from --edit-of's rules) its second, and the sweep's 3 says it is the value in force."""
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", threshold("TrainingLossJump", "3"), threshold("TrainingLossJump", "2.5"))
    res = backtest("--seeds", "100-101", "--incidents", INCIDENTS, "--rules", str(rules),
                   "--edit-of", str(REPO / "prometheus" / "rules"), "--sweep", "TrainingLossJump=2,3,4",
                   "--json", "e.json", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    sweep = json.loads((tmp_path / "e.json").read_text())["summary"]["sweep"]
    assert [(r["alert"], r["value"], r["role"]) for r in sweep["rows"]] == [
        ("TrainingLossJump", "2.5", "edit"), ("TrainingLossJump@in-force", "3", "in force"),
        ("TrainingLossJump@2", "2", ""), ("TrainingLossJump@3", "3", "= in force"), ("TrainingLossJump@4", "4", ""),
    ]  # fmt: skip
    in_force, as_3 = sweep["rows"][1], sweep["rows"][3]
    assert (in_force["caught"], in_force["false_alarms"]) == (as_3["caught"], as_3["false_alarms"])
    assert [row[0] for row in sweep["table"]["rows"]] == [
        "threshold", "2.5 (the edit)", "3 * in force", "2", "3 (= in force)", "4"
    ]  # fmt: skip
    assert "\n2.5 (the edit)" in res.stdout and "\n3 * in force" in res.stdout


def test_no_label_of_the_trade_off_plot_overlaps_another():
    """In `runwatch backtest --sweep TrainingLossJump=2,2.5,3,4,5 --plot`, 2.5, 3, 4 and 5 traded
    the same, and their labels printed on top of each other at (0, 2.0) (issue 36, item 2)."""
    from runwatch.backtest.sweep import figure
    from runwatch.backtest.variants import Sweep

    def row(value: str, role: str, fa: float, median: float) -> dict:
        return {"value": value, "role": role, "in_force": role == "in force", "median": median, "caught_total": 8,
                "should_catch": 8, "false_alarms": {"per_100_run_hours": fa}}  # fmt: skip

    rows = [
        row("3", "in force", 0, 2),
        *(row(v, "= in force" if v == "3" else "", 0, 2) for v in ("2.5", "3", "4", "5")),
    ]
    rows.insert(1, row("2", "", 45.2, 1))
    fig = figure(rows, Sweep("TrainingLossJump", "threshold", ("2", "2.5", "3", "4", "5")))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(lambda a: type(a).__name__ in ("Text", "Annotation")) if t.get_text().strip()]
    texts = [t for t in texts if t.get_visible() and not any(t in ax.get_xticklabels() + ax.get_yticklabels()
                                                            for ax in fig.axes)]  # fmt: skip
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    overlapping = [(a, b) for i, (a, p) in enumerate(boxes) for b, q in boxes[i + 1 :] if p.overlaps(q)]
    assert overlapping == [], overlapping
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["2", "2.5"] and "4, on 2.5's point" in legend and legend[-1] == "in force (3), on 2.5's point"
