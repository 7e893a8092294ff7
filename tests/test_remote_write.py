"""runwatch.backtest.remote_write: the backtest's runs pushed into a real Prometheus hold what promtool
loads from the OpenMetrics file of the same runs, sample for sample."""

import json
import subprocess

import pytest
import requests

from runwatch.backtest import data
from runwatch.backtest.remote_write import _varint, push, snappy_literal, write_request
from runwatch.prom.server import Process, free_port, instant, prometheus_argv
from runwatch.trainer.batch import train_many
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.offline import OfflineRun, series, write_openmetrics
from tests.conftest import need


def serving(prometheus: str, data, tmp_path, *extra: str) -> Process:
    port = free_port()
    (tmp_path / "p.yml").write_text("global: {}\n")
    argv = prometheus_argv(prometheus, tmp_path / "p.yml", data, port, "--storage.tsdb.retention.time=100y", *extra)
    proc = Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / f"{data.name}.log", grace=1.0)
    proc.base = f"http://127.0.0.1:{port}"
    return proc


def every_sample(prometheus: str, data, tmp_path) -> dict:
    """Every series in a TSDB folder, with its raw samples (Prometheus prints a float exactly)."""
    with serving(prometheus, data, tmp_path) as proc:
        found = instant(proc.base, '{__name__=~".+"}[3h]', 1767225600 + 7200)
    return {json.dumps(s["metric"], sort_keys=True): s["values"] for s in found}


@pytest.mark.integration
def test_pushed_runs_hold_every_sample_promtool_loads_from_their_openmetrics(tmp_path):
    """A plain run and a 2-rank crash (a stall, `up` 0 while down, counters, NaN gaps) under the
    backtest's own shift: the same series, timestamps and values, bit for bit, both ways."""
    promtool, prometheus = need("promtool"), need("prometheus")
    configs = [TrainConfig(incident="lr_spike", seed=3), TrainConfig(incident="rank_crash", seed=4, ranks=2)]
    runs = [OfflineRun(c, train_many([c])[0], shift_ms=data.GRID_PHASE_MS) for c in configs]

    with open(tmp_path / "runs.om", "w") as fh:
        written = write_openmetrics(runs, fh)
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", tmp_path / "runs.om",
                           tmp_path / "promtool"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    loader = data.loading_server(prometheus, tmp_path)
    with loader.running():
        body, pushed = write_request(s for run in runs for s in series(run))
        push(loader.base, body)
        data.snapshot(loader, tmp_path / "pushed")

    assert pushed == written
    by_promtool = every_sample(prometheus, tmp_path / "promtool", tmp_path)
    by_push = every_sample(prometheus, tmp_path / "pushed", tmp_path)
    assert sum(len(v) for v in by_push.values()) == written
    assert by_push == by_promtool
    assert any('"up"' in k and any(v == "0" for _, v in by_push[k]) for k in by_push)  # the crashed job's down time


def test_only_the_families_asked_for_are_pushed():
    run = OfflineRun(TrainConfig(seed=1), train_many([TrainConfig(seed=1)])[0])
    names = {name for name, *_ in series(run, {"runwatch_train_loss", "runwatch_train_tokens", "up"})}
    assert names == {"runwatch_train_loss", "runwatch_train_tokens_total", "up"}  # a counter's samples: _total


def test_varints_and_the_snappy_frame_are_the_formats_own():
    assert _varint(1) == b"\x01" and _varint(300) == b"\xac\x02"  # protobuf's encoding guide
    with pytest.raises(ValueError, match="two's complement"):
        _varint(-1)
    assert snappy_literal(b"") == b"\x00"
    assert snappy_literal(b"abc") == b"\x03" + bytes([0xFC]) + (2).to_bytes(4, "little") + b"abc"


@pytest.mark.integration
def test_a_stamp_that_needs_another_varint_length_is_encoded_the_slow_way(tmp_path):
    """Stamps on both sides of 2^35 ms (1971) straddle a varint length; Prometheus still reads them."""
    prometheus = need("prometheus")
    stamps = [2**35 - 1000, 2**35 + 1000]
    body, n = write_request([("x", [("job", "t")], [1.5, 2.5], stamps)])
    with serving(prometheus, tmp_path / "d", tmp_path, "--web.enable-remote-write-receiver") as proc:
        push(proc.base, body)
        found = instant(proc.base, "x[1h]", (2**35 + 2000) / 1000)
    assert n == 2
    assert [(round(float(t) * 1000), v) for t, v in found[0]["values"]] == [(stamps[0], "1.5"), (stamps[1], "2.5")]


def test_a_nan_is_no_sample_and_mismatched_lengths_are_refused():
    _, n = write_request([("x", [], [1.0, float("nan"), 2.0], [1, 2, 3])])
    assert n == 2
    with pytest.raises(ValueError, match="2 values for 3 timestamps"):
        write_request([("x", [], [1.0, 2.0], [1, 2, 3])])
    with pytest.raises(ValueError, match="names a label twice"):
        write_request([("x", [("job", "a"), ("job", "b")], [1.0], [1])])


@pytest.mark.integration
def test_a_sample_prometheus_refuses_raises_with_its_reason(tmp_path):
    prometheus = need("prometheus")
    with serving(prometheus, tmp_path / "d", tmp_path, "--web.enable-remote-write-receiver") as proc:
        push(proc.base, write_request([("x", [("job", "t")], [1.0], [1767225601000])])[0])
        with pytest.raises(RuntimeError, match="out of order"):
            push(proc.base, write_request([("x", [("job", "t")], [2.0], [1767225600000])])[0])


@pytest.mark.integration
def test_a_prometheus_without_the_receiver_is_named(tmp_path):
    prometheus = need("prometheus")
    with serving(prometheus, tmp_path / "d", tmp_path) as proc:
        with pytest.raises(RuntimeError, match="Prometheus refused the runs' samples"):
            push(proc.base, write_request([("x", [], [1.0], [1])])[0])
        assert requests.get(f"{proc.base}/-/ready", timeout=5).status_code == 200
