"""The console's Rules page over real HTTP, without a lab: `runwatch console` over a state
directory whose lab.json names a copy of the configuration, Prometheus not answering. What it
lists, how it edits a rule file, and every input it refuses with nothing written. The browser
round-trip on a live lab is test_rules_console_e2e.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import requests
import yaml

from runwatch.console.rules import MAX_EDIT_EXPR, EditError, alerts_of, edit_text
from runwatch.core.paths import REPO, Layout
from runwatch.prom.server import free_port, wait_ready

SHIPPED = (REPO / "prometheus" / "rules" / "alerts.yml").read_text()


def comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith("#")]


def rule(text: str, alert: str) -> dict:
    return next(r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if r.get("alert") == alert)


def test_an_edit_changes_only_its_lines_and_keeps_every_comment():
    new = edit_text(SHIPPED, "HeldOutGap", "run:runwatch_train_heldout_to_train_loss:ratio20s\n  > 1.8", "5s", None)
    assert comments(new) == comments(SHIPPED)
    assert rule(new, "HeldOutGap")["expr"] == "run:runwatch_train_heldout_to_train_loss:ratio20s\n  > 1.8"
    assert rule(new, "HeldOutGap")["for"] == "5s"
    for other in ("TrainingLossJump", "GradientNormJump", "ThroughputDrop"):
        assert rule(new, other) == rule(SHIPPED, other)
    changed = [a for a, b in zip(SHIPPED.splitlines(), new.splitlines(), strict=False) if a != b]
    assert len(changed) <= 4, changed  # the expr's lines and the for:, nothing else


def test_a_for_is_added_and_removed_and_a_threshold_set():
    added = edit_text(SHIPPED, "TrainingLossJump", None, "3s", "2.5")
    assert rule(added, "TrainingLossJump")["for"] == "3s" and "for" not in rule(SHIPPED, "TrainingLossJump")
    assert "alertname: TrainingLossJump\n        expr: vector(2.5)\n" in added
    assert "for" not in rule(edit_text(SHIPPED, "HeldOutGap", None, "", None), "HeldOutGap")


def test_a_file_the_console_cannot_edit_in_place_is_refused():
    flow = SHIPPED.replace("      - alert: HeldOutGap\n", "      - {alert: HeldOutGap, expr: x}\n      - alert: Gone\n")
    with pytest.raises(EditError, match="alert: HeldOutGap is not written once"):
        edit_text(flow, "HeldOutGap", "x > 1", None, None)
    with pytest.raises(EditError, match="threshold: the file records no"):
        edit_text(SHIPPED, "TrainerDown", None, None, "2")


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """The console over a lab.json whose root is a copy of the configuration; nothing else runs."""
    tmp = tmp_path_factory.mktemp("rules-console")
    for d in ("prometheus", "alertmanager"):
        shutil.copytree(REPO / d, tmp / d)
    state = tmp / "state"
    state.mkdir()
    (state / "lab.json").write_text(json.dumps({"run_id": "r1", "root": str(tmp), "urls": {}}))
    nowhere, port = f"http://127.0.0.1:{free_port()}", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere,
         "--alertmanager", nowhere, "--pager", nowhere, "--state-dir", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 30, proc), proc.stderr.read()
        yield f"http://127.0.0.1:{port}", tmp
    finally:
        proc.terminate()
        proc.wait(10)


def token(base: str) -> str:
    return re.search(r'name="token" value="([^"]+)"', requests.get(f"{base}/rules/HeldOutGap", timeout=10).text)[1]


def unchanged(root) -> bool:
    rules = root / "prometheus" / "rules"
    return (rules / "alerts.yml").read_text() == SHIPPED and not list(rules.glob("*.previous"))


@pytest.mark.integration
def test_the_list_shows_every_alert_of_the_lab_s_rules(console):
    base, root = console
    html = requests.get(f"{base}/rules", timeout=10).text
    names = [a.name for a in alerts_of(Layout(root))]
    assert len(names) > 10 and all(f'data-alert="{n}"' in html for n in names)
    assert requests.get(f"{base}/rules/NoSuchAlert", timeout=10).status_code == 404
    assert 'data-promql="/rules/prometheus"' in requests.get(f"{base}/rules/HeldOutGap", timeout=10).text


@pytest.mark.integration
@pytest.mark.parametrize("action", ["apply", "backtest"])
def test_a_form_without_the_token_or_from_another_origin_is_refused(console, action):
    base, root = console
    form = {"expr": "x > 1", "for": "10s", "threshold": "2"}
    assert requests.post(f"{base}/rules/HeldOutGap/{action}", data=form, timeout=10).status_code == 403
    resp = requests.post(f"{base}/rules/HeldOutGap/{action}", data={**form, "token": token(base)},
                         headers={"Origin": "http://evil"}, timeout=10)  # fmt: skip
    assert resp.status_code == 403 and unchanged(root)


@pytest.mark.integration
@pytest.mark.parametrize(
    "alert, form, said",
    [("HeldOutGap", {"expr": ""}, "expr: an alert needs an expression"),
     ("HeldOutGap", {"expr": "x" * (MAX_EDIT_EXPR + 1)}, "expr: at most"),
     ("HeldOutGap", {"for": "ten seconds"}, "for: a duration"),
     ("HeldOutGap", {"threshold": "two"}, "threshold: a number"),
     ("TrainerDown", {"threshold": "2"}, "threshold: TrainerDown reads no threshold recording"),
     ("HeldOutGap", {"seeds": "all"}, "seeds: a range"),
     ("HeldOutGap", {"strengths": "big"}, "strengths: a range"),
     ("HeldOutGap", {}, "nothing to apply")],
)  # fmt: skip
def test_each_bad_input_is_refused_naming_its_field_and_writes_nothing(console, alert, form, said):
    base, root = console
    page = requests.get(f"{base}/rules/{alert}", timeout=10).text
    expr = re.search(r'<textarea name="expr"[^>]*>([^<]*)</textarea>', page)[1]
    hold = re.search(r'name="for" id="for" value="([^"]*)"', page)[1]
    base_form = {"token": token(base), "expr": expr.replace("&#34;", '"').replace("&gt;", ">").replace("&lt;", "<"),
                 "for": hold}  # fmt: skip
    action = "backtest" if "seeds" in form or "strengths" in form else "apply"
    resp = requests.post(f"{base}/rules/{alert}/{action}", data={**base_form, **form}, timeout=60)
    assert resp.status_code == 400 and said in resp.text.replace("&#39;", "'"), resp.text[-2000:]
    assert unchanged(root)


@pytest.mark.integration
def test_a_broken_expression_is_refused_with_promtool_s_message(console):
    base, root = console
    form = {"token": token(base), "expr": "run:runwatch_train_heldout_to_train_loss:ratio20s >> 2", "for": "10s"}
    resp = requests.post(f"{base}/rules/HeldOutGap/apply", data=form, timeout=120)
    assert resp.status_code == 400 and "promtool check rules" in resp.text and "parse error" in resp.text
    assert unchanged(root)


@pytest.mark.integration
def test_the_editor_s_completion_reads_only_prometheus_s_metadata(console):
    base, _ = console
    assert requests.get(f"{base}/rules/prometheus/api/v1/query?query=up", timeout=10).status_code == 404
    assert requests.get(f"{base}/rules/prometheus/api/v1/admin/tsdb/snapshot", timeout=10).status_code == 404
    resp = requests.get(f"{base}/rules/prometheus/api/v1/label/__name__/values", timeout=10)
    assert resp.status_code == 503 and "not answering" in resp.json()["error"]
