"""The rule files: promtool's checks and tests, their hygiene, and proof that the tests can fail."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runwatch.core.names import (
    CLUSTER_ALERTS,
    LESSON20_ALERTS,
    META_ALERTS,
    META_GROUP,
    PLATE_ALERTS,
    RUNBOOK_BASE,
    TARGET_ALERTS,
)
from runwatch.core.paths import REPO
from tests.conftest import edit, keep_unit_tests, need, threshold

RULES = REPO / "prometheus" / "rules"
TESTS = REPO / "prometheus" / "tests"


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([need("promtool"), *args], cwd=cwd, capture_output=True, text=True)


def rules_of(kind: str, group_name: str | None = None) -> list[dict]:
    out = []
    for f in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(f.read_text())["groups"]:
            if group_name in (None, group["name"]):
                out += [r for r in group["rules"] if kind in r]
    return out


training_alerts = rules_of("alert", "runwatch-training")


@pytest.mark.integration
def test_promtool_check_rules():
    res = promtool("check", "rules", *map(str, sorted(RULES.glob("*.yml"))))
    assert res.returncode == 0, res.stdout + res.stderr


# Every test file passing promtool on the repository: test_check.py, through `runwatch check`.


BASELINE_GUARDS = [
    "and count_over_time(runwatch_train_loss[30s] offset 5s) >= 15",
    "and count_over_time(runwatch_train_gradient_norm[60s]) >= 20",
    "and count_over_time(runwatch_train_loss[20s]) >= 10",
    "and runwatch_train_loss\n",
    "and count_over_time(runwatch_train_tokens_per_second[60s] offset 5s) >= 20",
    "and count_over_time(runwatch_train_logit_norm_max[60s]) >= 30",
]


@pytest.mark.integration
@pytest.mark.parametrize("guard", BASELINE_GUARDS, ids=range(len(BASELINE_GUARDS)))
def test_deleting_a_baseline_guard_fails_a_unit_test(tmp_path, guard):
    """Each guard of baselines.yml is held by a test: without it, baselines.test.yml goes red."""
    shutil.copytree(REPO / "prometheus", tmp_path / "prometheus")
    edit(tmp_path / "prometheus" / "rules" / "baselines.yml", guard, "\n" if guard.endswith("\n") else "", 1)
    res = promtool("test", "rules", str(tmp_path / "prometheus" / "tests" / "baselines.test.yml"))
    assert res.returncode == 1 and "FAILED" in res.stdout + res.stderr


@pytest.mark.parametrize("maker, out", [("make_incident_tests", "incidents"), ("make_two_runs_test", "two_runs")])
def test_generated_rule_tests_are_up_to_date(maker, out):
    spec = importlib.util.spec_from_file_location(maker, TESTS / f"{maker}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == (TESTS / f"{out}.test.yml").read_text(), f"run prometheus/tests/{maker}.py"


# A learner's rule that names each step-time alert with its seed, joined on `job`: with one run
# there is one run_info series per job and it evaluates cleanly, live and in every test file
# but one; with a second run (the lab's --control, a restarted lab) the join is many-to-many.
JOINED_ON_JOB = """      - alert: SlowStepsOfSeed
        expr: >-
          histogram_quantile(0.9, rate(runwatch_train_step_duration_seconds_bucket[1m]))
          * on(job) group_left(seed) runwatch_train_run_info > 1
        labels:
          severity: warning
        annotations:
          summary: "steps of seed {{ $labels.seed }} take over a second"
          runbook_url: http://127.0.0.1:9095/runbooks/ThroughputDrop.md
"""


@pytest.mark.integration
def test_a_rule_that_fails_only_once_a_second_run_exists_is_refused_by_check(tmp_path):
    """Issue 28, item 7: such a rule passed `check`, so `reload` (which runs what check runs)
    applied it while the lab had one run. two_runs.test.yml serves every exported series for
    two runs at once; the rule fails there, named, with Prometheus's own error."""
    for d in ("prometheus", "alertmanager"):
        shutil.copytree(REPO / d, tmp_path / d)
    keep_unit_tests(tmp_path, two_runs=(), baselines=(), first_fired=())  # one fails, the others pass
    alerts = tmp_path / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, "      - alert: TrainingLossJump\n", JOINED_ON_JOB + "      - alert: TrainingLossJump\n", 1)
    res = subprocess.run([sys.executable, "-m", "runwatch", "check", "--root", str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    # check runs each test file on its own and names each that fails: this one alone
    failing = {x.split(": ", 1)[0].strip() for x in res.stdout.split("promtool's output:")[0].splitlines()
               if x.strip().startswith("prometheus/tests/")}  # fmt: skip
    assert failing == {"prometheus/tests/two_runs.test.yml"}, res.stdout
    (line,) = [x.strip() for x in res.stdout.splitlines() if "SlowStepsOfSeed fails when evaluated" in x]
    assert re.match(r"prometheus/tests/two_runs\.test\.yml: SlowStepsOfSeed fails when evaluated \(from \d+s\): ", line)
    assert "many-to-many matching not allowed" in line


def test_the_alerts_exist_with_the_names_python_knows():
    """runwatch.core.names is the one list of alert names Python uses; the rule files must agree."""
    names = [r["alert"] for r in rules_of("alert")]
    assert names == [*PLATE_ALERTS, *LESSON20_ALERTS, *TARGET_ALERTS, *CLUSTER_ALERTS, *META_ALERTS]
    assert PLATE_ALERTS == ("TrainingLossJump", "GradientNormJump", "HeldOutGap", "ThroughputDrop")  # the plate's
    assert [g["name"] for g in yaml.safe_load((RULES / "meta.yml").read_text())["groups"]] == [META_GROUP]


@pytest.mark.parametrize("rule", rules_of("alert"), ids=lambda r: r["alert"])
def test_alert_hygiene(rule):
    # CamelCase; an acronym stays upper case, as in kubernetes-mixin's KubeAPIDown
    assert re.fullmatch(r"(?:[A-Z][a-z]+|[A-Z]{2,}(?=[A-Z][a-z]|$))+", rule["alert"])
    assert rule["labels"]["severity"] in ("critical", "page", "warning", "none")
    ann = rule["annotations"]
    assert ann["summary"] and ann["description"]
    # absolute: the link must open from Alertmanager's and Grafana's pages, and from a terminal
    assert ann["runbook_url"] == f"{RUNBOOK_BASE}/{rule['alert']}.md"
    assert (REPO / "runbooks" / f"{rule['alert']}.md").is_file()
    if rule in training_alerts:
        assert "$value" in ann["description"] and "runwatch_train_step" in ann["step"]


def test_recording_rules_are_named_level_metric_operations_with_a_comment():
    text = "".join(f.read_text() for f in sorted(RULES.glob("*.yml")))
    for rule in rules_of("record"):
        assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]
    # every rule, also each of the several that record one name (alerts.yml's thresholds)
    for m in re.finditer(r"- record: (\S+)", text):
        before = text[: m.start()].rstrip().splitlines()[-1]
        assert before.strip().startswith("#"), f"{m[1]} has no comment above it"


@pytest.mark.integration
@pytest.mark.parametrize(
    "old, new, failing",
    [
        (threshold("GradientNormJump", "3"), threshold("GradientNormJump", "12"), "GradientNormJump"),  # corrupt
        ("for: 10s", "for: 30s", "HeldOutGap"),  # the repeated batch is caught after 339
        (threshold("ThroughputDrop", "0.8"), threshold("ThroughputDrop", "0.5"), "ThroughputDrop"),  # slow node
    ],
)
def test_an_edited_threshold_breaks_the_plates_signature(tmp_path, old, new, failing):
    """The generated incident tests can fail: move a threshold and promtool says which alert (in
    the groups that name it: the others hold nothing it could break)."""
    shutil.copytree(REPO / "prometheus", tmp_path / "prometheus")
    keep_unit_tests(tmp_path, incidents=(failing,))
    alerts = tmp_path / "prometheus" / "rules" / "alerts.yml"
    edit(alerts, old, new)
    res = promtool("test", "rules", "prometheus/tests/incidents.test.yml", cwd=tmp_path)
    assert res.returncode != 0
    assert failing in res.stdout + res.stderr


def test_the_watcher_s_grace_is_counted_in_prometheus_s_scrape_intervals():
    """The live trainer's grace (trainer.live) and the console's "paused" are in scrape
    intervals of prometheus.yml: the constant Python holds is that file's."""
    from runwatch.core.durations import duration_seconds
    from runwatch.core.names import SCRAPE_INTERVAL_S, WATCH_GRACE_S

    config = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    assert duration_seconds(config["global"]["scrape_interval"]) == SCRAPE_INTERVAL_S
    assert WATCH_GRACE_S == 3 * SCRAPE_INTERVAL_S


def test_a_rule_file_reads_at_a_glance_no_line_over_120_characters():
    """Issue 39: the step lookups were 400-490 characters a line. make_annotations.py writes them
    over lines YAML folds back into one; the annotation Prometheus reads is unchanged."""
    long = [f"{f.name}:{n}" for f in sorted(RULES.glob("*.yml"))
            for n, line in enumerate(f.read_text().splitlines(), 1) if len(line) > 120]  # fmt: skip
    assert long == [], long
