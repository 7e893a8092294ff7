"""On-call drills end to end on a native lab: hidden incident, ack, diagnosis, postmortem.

A seeded drill is reproducible in its state directory only (its draw is keyed by drill.key);
these tests write a known key. Seeds are chosen for a short wait: with it, seed 516 hides a
corrupt_shard from step 247, seed 42 a healthy run (onsets are drawn in 240-360). Each drill is
a lab of its own, on free ports (`runwatch drill --ports free`), found through its lab.json.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import requests

from runwatch.core import credentials
from runwatch.core.addresses import lab_url
from runwatch.drill.confirm import notification_window_s
from runwatch.oncall.page_log import read_pages
from runwatch.prom.server import instant
from tests.conftest import as_the_lab_s_alertmanager, runwatch, wait_for

INCIDENT_NAMES = ("lr_spike", "corrupt_shard", "repeated_batch", "slow_node")


@pytest.fixture
def state(lab_state):
    return lab_state


DRILL_KEY = "runwatch-tests"


def drill(tmp_path, state, seed: int, fast_forward: int = 220) -> str:
    """Start a drill; 220 leaves the alerts' baselines 20-30 steps of history before onset 247."""
    return start_drill(tmp_path, state, seed, fast_forward)[0]


def printed_ack(printed: str, alert: str) -> list[str]:
    """The ack command a drill prints, for this alert, as the learner would paste it."""
    found = re.search(r"`runwatch (ack [^`]*ALERT[^`]*)`", printed)
    assert found, printed
    return shlex.split(found[1].replace("ALERT", alert))


def start_drill(tmp_path, state, seed: int, fast_forward: int = 220) -> tuple[str, str]:
    """Start a drill: (its run id, what it printed)."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "drill.key").write_text(DRILL_KEY + "\n")
    res = runwatch(
        "drill",
        "--state-dir",
        str(state),
        "--seed",
        str(seed),
        "--fast-forward",
        str(fast_forward),
        "--ports",
        "free",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads((state / "drill.json").read_text())["run_id"], res.stdout


FORGED = {
    "alertname": "ForgedPage",
    "summary": "| forged | row |\n## Forged heading <script>alert(1)</script> [link](http://x)",
}


def forge_a_page(state, run_id: str) -> None:
    """A page posted to the pager for the drill's run: refused from a process without the lab's
    token, stored from one that read it in the state directory (shown in the postmortem, inert)."""
    alert = {
        "status": "firing", "fingerprint": "f0f0", "startsAt": "2026-01-01T00:00:00Z",
        "labels": {"alertname": FORGED["alertname"], "run_id": run_id, "severity": "page"},
        "annotations": {"summary": FORGED["summary"]},
    }  # fmt: skip
    pager = f"{lab_url(state, 'pager')}/webhook"
    assert requests.post(pager, json={"alerts": [alert]}, timeout=5).status_code == 401
    resp = requests.post(pager, json={"alerts": [alert]}, headers=as_the_lab_s_alertmanager(state), timeout=5)
    assert resp.status_code == 200


@pytest.mark.slow  # a drill of its own for 80 s: make test keeps within its 5 minutes
def test_a_hidden_corrupt_shard_acked_diagnosed_and_written_up(tmp_path, state):
    run_id, printed = start_drill(tmp_path, state, 516)
    am = lab_url(state, "alertmanager")
    metrics = requests.get(f"{lab_url(state, 'trainer')}/metrics", timeout=5).text
    assert not any(name in metrics for name in INCIDENT_NAMES) and 'incident="hidden"' in metrics
    assert "incident_active" not in metrics and "learning_rate" not in metrics
    # run.json names neither the incident nor its onset (247): not as a value of its config, nor
    # anywhere but in its run id (a time, HHMMSS) and its progress (steps and times so far)
    record = json.loads(next((state / "runs").glob("*/run.json")).read_text())
    assert record["config"]["onset"] == -1 and record["config"]["incident"] == "hidden"
    assert 247 not in record["config"].values() and "corrupt_shard" not in json.dumps(record)
    trainer = json.loads((state / "pids" / "trainer.json").read_text())  # what `ps` shows of it
    assert "--drill-seed" not in trainer["argv"] and "corrupt_shard" not in trainer["argv"]
    # nor its training seed (issue 28): drawn in secret, a replay of it would name the onset
    assert "--seed" not in trainer["argv"] and 'seed="hidden"' in metrics and record["config"]["seed"] == -1
    forge_a_page(state, run_id)

    res = runwatch("drill", "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 2 and "already running" in res.stderr

    def paged() -> list[dict]:
        return [
            p for p in read_pages(state / "pages.jsonl")
            if p["status"] == "firing" and p["run_id"] == run_id and p["alert"] != FORGED["alertname"]
        ]  # fmt: skip

    # Acked at once, while TrainingLossJump fires (for about 10 s after its page): the ack makes
    # its silence too. (An incident whose alert has resolved is acked in test_console_e2e.py.)
    page = wait_for(lambda: [p for p in paged() if p["alert"] == "TrainingLossJump"], 60, "the loss's page")[0]
    # the ack the drill printed, pasted as printed (it once lacked the --comment ack requires)
    res = runwatch(*printed_ack(printed, page["alert"]), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    first = paged()[0]
    for checkpoint in (state / "runs" / run_id / "checkpoints").glob("*.npz"):  # 49, 99, ... 199 at least
        assert checkpoint.stat().st_mode & 0o077 == 0
        with np.load(checkpoint) as saved:
            assert not any(name in str(saved[key]) for key in saved.files for name in INCIDENT_NAMES)
    assert not any(name in json.dumps(p) for p in paged() for name in INCIDENT_NAMES)  # the page text hides it too
    res = runwatch("ack", "ThroughputDrop", "--comment", "slow?", "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 2 and "has no incident" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = runwatch("ack", page["alert"], "--state-dir", str(state), cwd=tmp_path)  # an ack says what you know
    assert res.returncode == 2 and res.stderr.startswith("runwatch ack: --comment:"), res.stderr
    res = runwatch("ack", page["alert"], "--comment", "again", "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 2 and "already acknowledged" in res.stderr
    silences = requests.get(f"{am}/api/v2/silences", timeout=5, auth=credentials.basic_auth(state)).json()
    (silence,) = [s for s in silences if s["status"]["state"] == "active"]
    assert silence["comment"] == "what you know so far"
    assert {(m["name"], m["value"]) for m in silence["matchers"]} == {("alertname", page["alert"]), ("run_id", run_id)}

    res = runwatch("diagnose", "meteor", "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 2 and "unknown incident" in res.stderr
    # Two diagnoses at the same moment: one is graded, the other refused.
    both = [
        subprocess.Popen(
            [sys.executable, "-m", "runwatch", "diagnose", "corrupt_shard", "--step", "250", "--state-dir", str(state)],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]  # fmt: skip
    outcomes = sorted((proc.wait(60), *proc.communicate()) for proc in both)
    assert [code for code, _, _ in outcomes] == [0, 2] and "already diagnosed" in outcomes[1][2]
    res = subprocess.CompletedProcess([], *outcomes[0])
    assert res.stdout.startswith("CORRECT: you said corrupt_shard; it was corrupt_shard from step 247.")
    assert "+3 steps off" in res.stdout
    grade = json.loads((state / "drill.json").read_text())["grade"]
    # onset is the scrape that first saw the onset step. The phase from scrape to rule evaluation
    # is fixed per host: 0.8 s here, but on CI's host the evaluation came right after the scrape
    # and the page landed within 50 ms, which rounds to 0.0 s
    assert grade["onset_to_first_page_s"] is not None
    assert 0 <= grade["onset_to_first_page_s"] < 10
    assert 0 < grade["first_page_to_ack_s"] < grade["first_page_to_diagnosis_s"]
    assert grade["first_page"] == first["alert"]  # not the forged page, which came first
    # each time beside its par (runwatch/drill/coach.py): reading the first page's runbook, then its table
    assert 0 < grade["par_first_page_to_ack_s"] < grade["par_first_page_to_diagnosis_s"], grade
    ack_line = res.stdout.split("first page -> ack: ")[-1].splitlines()[0]
    assert f"; par {grade['par_first_page_to_ack_s']:.1f} s (reading " in ack_line, res.stdout
    record = json.loads((state / "drill.json").read_text())
    (state / "drill.json").write_text(json.dumps({**record, "diagnosis": None}))  # a hand-edit for a retry
    res = runwatch("diagnose", "corrupt_shard", "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 2 and "already diagnosed" in res.stderr
    (state / "drill.json").write_text(json.dumps(record))

    # Issue 28: a page of a real alert forged after it stopped firing was a confirmed "Page".
    # Forged at once, within the window in which Alertmanager's own retry could still come,
    # time cannot tell it from a real one: without the lab's token the pager refuses it.
    resolved = wait_for(
        lambda: [p for p in read_pages(state / "pages.jsonl") if p["status"] == "resolved" and p["run_id"] == run_id],
        120, "a resolution of the run's",
    )[0]  # fmt: skip
    soon = {
        "status": "firing", "fingerprint": "soon", "startsAt": "2026-01-01T00:00:00Z",
        "labels": {"alertname": resolved["alert"], "run_id": run_id, "severity": "page"},
        "annotations": {"summary": "a forgery at once"},
    }  # fmt: skip
    assert requests.post(f"{lab_url(state, 'pager')}/webhook", json={"alerts": [soon]}, timeout=5).status_code == 401
    # Posted with the token, once ALERTS has not had the alert firing for the longest
    # Alertmanager may take to page (notification_window_s, from alertmanager.yml): unconfirmed.
    window = notification_window_s(state / "alertmanager" / "alertmanager.yml")

    def resolved_a_window_ago() -> str | None:
        for name in {p["alert"] for p in read_pages(state / "pages.jsonl") if p["status"] == "resolved"}:
            recent = f'ALERTS{{alertname="{name}",run_id="{run_id}",alertstate="firing"}}[{int(window) + 2}s]'
            if name != FORGED["alertname"] and not instant(lab_url(state, "prometheus"), f"count_over_time({recent})"):
                return name
        return None

    gone = wait_for(resolved_a_window_ago, 120, "an alert of the run resolved a notification window ago")
    late = {
        "status": "firing", "fingerprint": "late", "startsAt": "2026-01-01T00:00:00Z",
        "labels": {"alertname": gone, "run_id": run_id, "severity": "page"},
        "annotations": {"summary": "a late forgery"},
    }  # fmt: skip
    resp = requests.post(f"{lab_url(state, 'pager')}/webhook", json={"alerts": [late]},
                         headers=as_the_lab_s_alertmanager(state), timeout=5)  # fmt: skip
    assert resp.status_code == 200

    out = tmp_path / "pm.md"
    res = runwatch("postmortem", "--out", str(out), "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    for section in ("Overview", "What happened", "Contributing factors", "Resolution", "Impact", "Timeline",
                    "Action items"):  # fmt: skip
        assert f"## {section}" in text
    assert f"first page to ack: {grade['first_page_to_ack_s']:g} s (par " in text
    rows = re.findall(r"^\| (\S+Z) \| (.+) \|$", text, re.M)
    order = ("Drill started", "Incident began", "Fired in Prometheus", "Page", "Acknowledged", "Diagnosed")
    kinds = [next((k for k in order if event.startswith(k)), "") for _, event in rows]
    firsts = [kinds.index(k) for k in order]
    assert firsts == sorted(firsts), rows
    assert [t for t, _ in rows] == sorted(t for t, _ in rows)
    assert "a forgery at once" not in text  # refused, never stored
    (late_row,) = [event for _, event in rows if "a late forgery" in event]
    assert late_row.startswith("Unconfirmed page") and f": {gone} (step" in late_row, late_row
    forged = [event for _, event in rows if "ForgedPage" in event]  # shown, but inert
    assert (
        len(forged) == 1
        and forged[0].startswith("Unconfirmed page")
        and "<script>" not in text
        and "\n## Forged" not in text
        and not re.search(r"(?<!\\)\]\(", forged[0])  # no link: its bracket is escaped
    )
    assert (tmp_path / "pm-plate.png").stat().st_size > 20_000
    res = runwatch("postmortem", "--state-dir", str(state), cwd=tmp_path)  # by default, in the state dir
    assert res.returncode == 0 and (state / f"postmortem-{run_id}.md").exists(), res.stderr
    assert not list(tmp_path.glob("postmortem-*"))  # not in the directory it was run from (a checkout)


@pytest.mark.slow  # a drill of its own in the browser
def test_a_healthy_drill_diagnosed_in_the_console_is_graded_and_written_up(tmp_path, state, tab):
    """The whole drill in the browser: the console `runwatch drill` serves offers the diagnosis
    once, shows the grade, then writes the postmortem and shows it with its plate."""
    run_id = drill(tmp_path, state, 42, fast_forward=235)
    step = f'runwatch_train_step{{run_id="{run_id}"}} >= 255'
    wait_for(lambda: instant(lab_url(state, "prometheus"), step), 40, "twenty steps of the run")
    assert [p for p in read_pages(state / "pages.jsonl") if p["run_id"] == run_id] == []
    tab.goto(f"{lab_url(state, 'console')}/")  # the drill's run is the default
    assert tab.get_attribute("#console", "data-run") == run_id
    tab.wait_for_function("() => window.runwatchConsole.state.plate !== null")
    assert tab.evaluate("() => window.runwatchConsole.state.plate.drill") is True
    assert (
        "a drill" in tab.inner_text("#run-state")
        and tab.evaluate("() => window.runwatchConsole.state.plate.incident") == []
    )
    # The form makes the learner choose (no default answer) among the one-rank incidents only
    assert tab.input_value("#diagnose-incident") == ""
    offered = tab.eval_on_selector_all("#diagnose-incident option", "os => os.map(o => o.value)")
    assert "none" in offered and "straggler" not in offered and "hang" not in offered
    tab.select_option("#diagnose-incident", "none")
    tab.click("#diagnose-submit")
    notice = tab.wait_for_selector("#notice").inner_text()
    assert notice.startswith("CORRECT: you said none; it was none.") and "scoreboard: 1/1" in notice
    assert tab.query_selector("#diagnose-form") is None  # once: the form is gone
    assert "none" in tab.inner_text("#diagnosed")
    tab.click("#postmortem-submit")  # writes it, and shows it
    tab.wait_for_selector("article.postmortem h2")
    headings = [h.inner_text() for h in tab.query_selector_all("article.postmortem h2")]
    assert "Timeline" in headings and "Action items" in headings
    image = tab.wait_for_selector("article.postmortem img")
    tab.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image)  # the plate, served
    assert (state / f"postmortem-{run_id}.md").exists()


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, names",
    [(["drill", "--fast-forward", "240"], "--fast-forward"), (["ack", "HeldOutGap", "--expires", "0"], "--expires"),
     (["ack", "HeldOutGap", "--expires", "1e300"], "--expires"), (["ack", "HeldOutGap"], "no lab"),
     (["diagnose", "meteor"], "unknown incident"), (["drill", "--fast-forward", "-5"], "--fast-forward"),
     (["drill", "--seed", "-1"], "--seed"), (["diagnose", "none", "--step", "1e9"], "--step"),
     (["diagnose", "none"], "no drill"), (["postmortem"], "no drill")],
)  # fmt: skip
def test_drill_commands_refuse_bad_input_in_one_line(tmp_path, args, names):
    state = tmp_path / "state"
    res = runwatch(*args, "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 2 and names in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not state.exists()  # nothing was started or written


def test_the_confirmation_window_is_alertmanagers_own(tmp_path):
    """The longest group_wait (5 s, warnings) and group_interval (5 s, inherited by every route)
    of alertmanager.yml, plus Prometheus's resend delay (2 s); Alertmanager's defaults where the
    file says nothing (30 s and 5 m)."""
    from runwatch.core.paths import REPO

    assert notification_window_s(REPO / "alertmanager" / "alertmanager.yml") == 5 + 5 + 2
    (tmp_path / "am.yml").write_text("route:\n  receiver: x\n  routes:\n    - receiver: y\n      group_wait: 1m\n")
    assert notification_window_s(tmp_path / "am.yml") == 60 + 300 + 2
