"""The exporter over real HTTP: parsed by prometheus-client, checked by promtool, pinned by a golden file."""

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from runwatch.exporter.metrics import TrainerMetrics
from runwatch.exporter.server import PortInUseError, start
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import StepRecord, Trainer
from tests.conftest import free_port, need

GOLDEN = Path(__file__).parent / "fixtures" / "metrics.golden"


@pytest.fixture
def served():
    """An exporter holding steps 0..11 of a corrupt_shard run (onset 10), served on a free port."""
    metrics = TrainerMetrics("corrupt_shard-0", 0, "corrupt_shard", registry=CollectorRegistry())
    trainer = Trainer(TrainConfig(incident="corrupt_shard", onset=10, steps=20))
    for _ in range(12):
        rec = trainer.step()
        metrics.observe(rec, rec.tokens_per_second)
    srv = start(metrics.registry, free_port())
    yield metrics, f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()


def scrape(url: str) -> str:
    resp = requests.get(url, timeout=5)
    assert resp.status_code == 200
    return resp.text


def test_scrape_parses_and_carries_the_run(served):
    metrics, url = served
    families = {f.name: f for f in text_string_to_metric_families(scrape(url))}
    value = {f.name: f.samples[0].value for f in families.values() if f.samples}
    assert value["runwatch_train_step"] == 11
    assert value["runwatch_train_incident_active"] == 1
    assert families["runwatch_train_tokens"].type == "counter"
    assert families["runwatch_train_tokens"].samples[0].value == 12 * 64 * 1024
    info = families["runwatch_train_run_info"].samples[0].labels
    assert info == {"run_id": "corrupt_shard-0", "seed": "0", "incident": "corrupt_shard"}
    hist = families["runwatch_train_step_duration_seconds"]
    assert hist.type == "histogram"
    for fam in families.values():
        if fam.name.startswith("runwatch_train"):
            assert all(s.labels["run_id"] == "corrupt_shard-0" for s in fam.samples), fam.name


def test_exporter_reports_the_previous_render_s_time():
    """Each /metrics says how long the one before it took to render (this one's own time is
    known only once its body is written), on the clock the server is given."""
    ticks = iter([10.0, 10.25, 20.0, 20.5, 30.0, 30.0])
    srv = start(CollectorRegistry(), free_port(), clock=lambda: next(ticks))
    url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    try:
        seen = []
        for _ in range(3):
            families = {f.name: f for f in text_string_to_metric_families(scrape(url))}
            seen.append(families["runwatch_exporter_scrape_duration_seconds"].samples[0].value)
    finally:
        srv.shutdown()
    assert seen == [0.0, 0.25, 0.5]


@pytest.mark.integration
def test_promtool_check_metrics_is_clean(served):
    _, url = served
    out = subprocess.run([need("promtool"), "check", "metrics"], input=scrape(url), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "" and out.stderr.strip() == ""


def normalise(text: str) -> str:
    """Drop what changes between scrapes: creation times and the render duration."""
    lines = [ln for ln in text.splitlines() if not re.match(r"^\w+_created[{ ]", ln)]
    lines = [re.sub(r"^(runwatch_exporter_scrape_duration_seconds) .*", r"\1 <seconds>", ln) for ln in lines]
    return "\n".join(lines) + "\n"


def test_golden_metrics():
    """Hand-written records, so the golden file does not depend on floating-point details."""
    metrics = TrainerMetrics(
        "lr_spike-7", 7, "lr_spike", registry=CollectorRegistry(), precision="fp16", clock=lambda: 1764460800.0
    )
    for step, loss, lr, active, skipped in [(299, 0.25, 0.1, False, False), (300, 0.5, 15.0, True, True)]:
        rec = StepRecord(
            step, loss, 0.25, 1.5, lr, 1.0, 65536, active, float(step + 1), weight_norm=7.0, expected_loss=0.3,
            loss_scale=512.0, skipped=skipped, logits=np.array([[3.0, 4.0], [12.0, 16.0]]),  # norms 5 and 20
        )  # fmt: skip
        metrics.observe(rec, 65536.0)
    metrics.checkpoint(249)
    metrics.waited(31.0)  # held its clock 31 s for Prometheus (trainer.live)
    srv = start(metrics.registry, free_port())
    try:
        text = normalise(scrape(f"http://127.0.0.1:{srv.server_address[1]}/metrics"))
    finally:
        srv.shutdown()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition changed; rerun with UPDATE_GOLDEN=1 if intended"


def test_a_finished_run_says_when_it_started_and_ended():
    """The dashboards order runs by start and say when one ended: both are facts of the exporter."""
    times = iter([1764460800.0, 1764461400.5])
    metrics = TrainerMetrics("none-3", 3, "none", registry=CollectorRegistry(), clock=lambda: next(times))
    rec = Trainer(TrainConfig(steps=5, onset=2)).step()
    metrics.observe(rec, rec.tokens_per_second)
    value = metrics.registry.get_sample_value
    assert value("runwatch_train_run_start_time_seconds", {"run_id": "none-3"}) == 1764460800.0
    assert value("runwatch_train_run_end_time_seconds", {"run_id": "none-3"}) is None
    metrics.finish()
    assert value("runwatch_train_run_start_time_seconds", {"run_id": "none-3"}) == 1764460800.0
    assert value("runwatch_train_run_end_time_seconds", {"run_id": "none-3"}) == 1764461400.5
    assert value("runwatch_train_step", {"run_id": "none-3"}) == 0  # its last step, even if no scrape saw it
    assert value("runwatch_train_loss", {"run_id": "none-3"}) is None  # nothing left for an alert to judge


def test_drill_hides_the_incident():
    metrics = TrainerMetrics("drill-4", 4, "lr_spike", drill=True, registry=CollectorRegistry())
    trainer = Trainer(TrainConfig(incident="lr_spike", onset=2, steps=10, drill=True))
    for _ in range(5):
        rec = trainer.step()
        metrics.observe(rec, rec.tokens_per_second)
    srv = start(metrics.registry, free_port())
    try:
        text = scrape(f"http://127.0.0.1:{srv.server_address[1]}/metrics")
    finally:
        srv.shutdown()
    assert "lr_spike" not in text
    assert "incident_active" not in text and "learning_rate" not in text
    assert 'incident="hidden"' in text


def test_port_in_use_names_the_port():
    srv = start(CollectorRegistry(), free_port())
    port = srv.server_address[1]
    try:
        with pytest.raises(PortInUseError, match=f"port {port} is already in use"):
            start(CollectorRegistry(), port)
    finally:
        srv.shutdown()


@pytest.mark.integration
def test_golden_file_passes_promtool():
    text = GOLDEN.read_text().replace("<seconds>", "0.0001")
    out = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr
