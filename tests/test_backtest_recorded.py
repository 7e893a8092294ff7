"""`runwatch backtest --from-prometheus`: recorded runs replayed through the rules (issue 37, item 6).

A Prometheus of the test's own holds a fabricated recorded history, written over remote write at
the times a lab's scrapes would have stamped it (a scrape phase of .237 s, one report a second of
16 steps): a healthy run with one gradient spike of its own, a shorter healthy run, and a run
that served nothing the rules read. The backtest reads them back, pages the spike as the one
false alarm of their history, catches a throughput cut overlaid on them, and sweeps.
"""

from __future__ import annotations

import html
import json
import math
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from runwatch.backtest import data, overlay
from runwatch.backtest.remote_write import push, write_request
from runwatch.core.command import UsageError
from runwatch.prom.server import free_port
from runwatch.prom.tools import binary

pytestmark = pytest.mark.integration

STEPS_PER_REPORT = 16
SPIKE_AT = 700  # the report whose gradient norm is 6x: the history's one false alarm


def history(run_id: str, seconds: int, end: float, spike_at: int | None = None, seed: int = 1) -> list:
    """One run's series as a lab's scrapes of a watched job stamp them: one a second, .237 s in."""
    rng = random.Random(seed)
    t0 = int(end) - seconds
    stamps = [(t0 + i) * 1000 + 237 for i in range(seconds)]
    loss = [2.0 + 1.5 * math.exp(-i / 300) + rng.gauss(0, 0.03) for i in range(seconds)]
    heldout = [loss[i - i % 10] + 0.1 for i in range(seconds)]
    grad = [1.0 + rng.gauss(0, 0.05) for _ in range(seconds)]
    if spike_at is not None:
        grad[spike_at] *= 6
    rate = [50_000 * (1 + rng.gauss(0, 0.02)) for _ in range(seconds)]
    tokens = [sum(rate[: i + 1]) for i in range(seconds)]
    labels = [("instance", "127.0.0.1:8000"), ("job", "trainer"), ("run_id", run_id)]
    return [
        ("runwatch_train_step", labels, [float(STEPS_PER_REPORT * (i + 1)) for i in range(seconds)], stamps),
        ("runwatch_train_loss", labels, loss, stamps),
        ("runwatch_train_heldout_loss", labels, heldout, stamps),
        ("runwatch_train_gradient_norm", labels, grad, stamps),
        ("runwatch_train_tokens_per_second", labels, rate, stamps),
        ("runwatch_train_tokens_total", labels, tokens, stamps),
        ("runwatch_train_learning_rate", labels, [3e-4] * seconds, stamps),
        ("runwatch_train_run_start_time_seconds", labels, [float(t0)] * seconds, stamps),
    ]


@pytest.fixture(scope="module")
def lab_prometheus(tmp_path_factory):
    """A Prometheus holding the recorded runs, as a lab's would, on a free port."""
    tmp = tmp_path_factory.mktemp("recorded")
    flags = ("--web.enable-remote-write-receiver", "--web.enable-admin-api")  # the admin API: a snapshot
    server = data.server(binary("prometheus"), tmp, "lab", "lab", 0, 0, *flags)
    end = time.time() - 60
    with server.running():
        series = history("my-run", 1200, end, SPIKE_AT) + history("quiet-run", 600, end, seed=2)
        series += history("short-run", 100, end, seed=3)  # too short for an onset
        labels = [("instance", "127.0.0.1:8001"), ("job", "trainer"), ("run_id", "no-samples")]
        series.append(("runwatch_train_run_info", labels, [1.0] * 5, [int(end - 5 + i) * 1000 for i in range(5)]))
        push(server.base, write_request(series)[0])
        yield server.base, tmp


def backtest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runwatch", "backtest", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_the_recorded_history_pages_its_own_spike_and_nothing_else(lab_prometheus):
    base, tmp = lab_prometheus
    out = tmp / "history.json"
    got = backtest("--from-prometheus", base, "--run-ids", "my-run,quiet-run", "--json", str(out), cwd=tmp)
    assert got.returncode == 0, got.stderr
    doc = json.loads(out.read_text())
    fa = doc["false_alarms"]
    assert fa["GradientNormJump"]["pages"] == 1, fa["GradientNormJump"]
    assert fa["GradientNormJump"]["at"] == [["my-run", STEPS_PER_REPORT * (SPIKE_AT + 1)]]
    assert {a: c["pages"] for a, c in fa.items() if c["pages"]} == {"GradientNormJump": 1}, fa
    assert [r["run_id"] for r in doc["runs"]] == ["my-run", "quiet-run"]
    row = next(line.split() for line in got.stdout.splitlines() if line.startswith("GradientNormJump"))
    assert row == ["GradientNormJump", "1", "2", "1/2", "my-run:", str(STEPS_PER_REPORT * (SPIKE_AT + 1))], row


def test_an_injected_throughput_cut_is_caught_with_its_delay_and_swept(lab_prometheus):
    base, tmp = lab_prometheus
    out = tmp / "inject.json"
    got = backtest("--from-prometheus", base, "--run-ids", "my-run", "--inject", "throughput_cut:0.5,gradient_spike",
                   "--onsets", "3", "--sweep", "ThroughputDrop=0.4,0.8", "--json", str(out), cwd=tmp)  # fmt: skip
    assert got.returncode == 0, got.stderr
    doc = json.loads(out.read_text())
    cut = doc["catches"]["throughput_cut:0.5"]["ThroughputDrop"]
    assert cut["caught"] == 3 and cut["copies"] == 3, cut
    # a steady job's first report below 0.8 pages (alerts.yml): the onset's own report, step onset+0
    assert cut["worst_steps"] <= 30 * STEPS_PER_REPORT, cut
    spike = doc["catches"]["gradient_spike:1"]["GradientNormJump"]
    assert (spike["caught"], spike["median_steps"]) == (3, 0), spike
    # at 0.4 a halving is not below the threshold: the sweep's row says so, beside the one in force
    assert doc["catches"]["throughput_cut:0.5"]["ThroughputDrop@0.4"]["caught"] == 0
    assert doc["catches"]["throughput_cut:0.5"]["ThroughputDrop@0.8"]["caught"] == 3
    assert "ThroughputDrop's threshold swept over your runs" in got.stdout
    assert "0.8 *" in got.stdout, got.stdout


def test_a_lab_s_state_directory_a_tsdb_snapshot_and_a_stopped_lab_s_tsdb_read_the_same(lab_prometheus):
    base, tmp = lab_prometheus
    state = tmp / "state"
    state.mkdir(exist_ok=True)
    (state / "lab.json").write_text(json.dumps({"urls": {"prometheus": base}}))
    taken = requests.post(f"{base}/api/v1/admin/tsdb/snapshot", timeout=60).json()["data"]["name"]
    down = tmp / "down"  # a lab that is down: its TSDB on disk is read
    shutil.copytree(tmp / "lab" / "snapshots" / taken, down / "prometheus-data", dirs_exist_ok=True)
    (down / "lab.json").write_text(json.dumps({"urls": {"prometheus": f"http://127.0.0.1:{free_port()}"}}))
    docs = []
    for source in (str(state), str(tmp / "lab" / "snapshots" / taken), str(down)):
        out = tmp / "source.json"
        got = backtest("--from-prometheus", source, "--run-ids", "my-run", "--json", str(out), cwd=tmp)
        assert got.returncode == 0, got.stderr
        docs.append(json.loads(out.read_text()))
    assert docs[0]["source"] == base and docs[1]["source"].startswith("the TSDB in ")
    assert docs[2]["source"] == f"the TSDB in {down / 'prometheus-data'}"
    assert docs[0]["false_alarms"] == docs[1]["false_alarms"] == docs[2]["false_alarms"]
    assert docs[1]["false_alarms"]["GradientNormJump"]["pages"] == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--run-ids", "nosuch"], "--run-ids: http://"),
        (["--run-ids", "no-samples"], "--run-ids: run no-samples has no"),
        (["--inject", "loss_to_chance"], "--inject: loss_to_chance needs --num-classes"),
        (["--inject", "meteor:0.5"], "--inject: unknown incident 'meteor'"),
        (["--inject", "throughput_cut:2"], "--inject: throughput_cut's strength must be"),
        (["--incidents", "lr_spike"], "--incidents: configures the simulated runs"),
        (["--run-ids", "short-run", "--inject", "throughput_cut"], "--inject: run short-run trained 99 s; an"),
        (["--since", "0s"], "--since: must be a positive duration"),
    ],
)
def test_bad_input_gets_one_line_naming_its_flag(lab_prometheus, args, said):
    base, tmp = lab_prometheus
    got = backtest("--from-prometheus", base, *args, cwd=tmp)
    assert got.returncode == 2, got.stderr
    assert said in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr


def test_an_unreachable_prometheus_is_named(tmp_path):
    got = backtest("--from-prometheus", "http://127.0.0.1:1", cwd=tmp_path)
    assert got.returncode == 2
    said = "--from-prometheus: cannot reach Prometheus at http://127.0.0.1:1: ConnectionError"
    assert got.stderr.strip().endswith(said), got.stderr
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr


def test_no_lab_and_recorded_flags_alone_are_refused(tmp_path):
    got = backtest("--from-prometheus", cwd=tmp_path)  # no .runwatch here
    assert got.returncode == 2 and "--from-prometheus: no lab in .runwatch" in got.stderr, got.stderr
    got = backtest("--inject", "throughput_cut", cwd=tmp_path)
    assert got.returncode == 2 and "--inject: reads recorded runs: give --from-prometheus too" in got.stderr


def test_parse_injections_defaults_and_refusals():
    assert overlay.parse_injections("throughput_cut,gradient_spike:0.5") == [
        overlay.Injection("throughput_cut", 0.3), overlay.Injection("gradient_spike", 0.5)]  # fmt: skip
    with pytest.raises(UsageError, match="given twice"):
        overlay.parse_injections("throughput_cut,throughput_cut:0.3")


# --- the console's Rules page: "Backtest this watched run" ---


@pytest.fixture
def console(lab_prometheus, tmp_path):
    from tests.test_rules_console_writers import Console

    one = Console(tmp_path, prometheus=lab_prometheus[0])
    yield one
    one.stop()


def test_the_rules_page_offers_the_watched_runs_and_refuses_a_bad_one(console):
    page = console.get("/rules/ThroughputDrop").text
    assert "<option>my-run</option>" in page and 'value="throughput_cut"' in page, page[-3000:]
    expr = html.unescape(re.search(r'<textarea name="expr"[^>]*>([^<]*)</textarea>', page)[1])
    form = {"expr": expr, "for": "", "threshold": "0.8", "inject": "throughput_cut", "num_classes": ""}
    for bad, said in [({"run": "a,b"}, "run: choose one of the runs Prometheus holds"),
                      ({"run": "my-run", "inject": "x;rm"}, "inject: incidents such as"),
                      ({"run": "my-run", "num_classes": "many"}, "number of classes: a whole number")]:  # fmt: skip
        got = console.post("/rules/ThroughputDrop/recorded", {**form, **bad}, 30)
        assert got.status_code == 400 and said in html.unescape(got.text), got.text[-2000:]


def test_backtest_this_watched_run_in_the_browser(console, tab):
    from runwatch.console.rules import BACKTEST_TIMEOUT_S

    tab.set_default_timeout(BACKTEST_TIMEOUT_S * 1000)
    tab.goto(f"{console.base}/rules/ThroughputDrop")
    tab.wait_for_selector(".promql-editor .cm-content")
    tab.fill("#threshold", "0.7")
    tab.select_option("#run", "my-run")
    tab.fill("#inject", "throughput_cut:0.5")
    tab.click("#backtest-run")
    tab.wait_for_selector("#backtest-output")
    assert "over the watched run my-run" in tab.inner_text("#backtest-result h2")
    said = tab.locator("#backtest-output").text_content()
    assert "pages on your runs' own history" in said, said
    row = next(line.split() for line in said.splitlines() if line.startswith("throughput_cut:0.5  ThroughputDrop *"))
    assert row[3] == "5/5", said  # every onset's cut caught, under the edit
    assert "ThroughputDrop's threshold swept over your runs" in said and "0.7 *" in said, said
