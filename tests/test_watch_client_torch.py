"""Real torch under the lab: the plate's workshop in PyTorch (examples/torch_workshop.py),
instrumented with runwatch.watch, watched by `runwatch up --watch`, pages as the lab's own run
does; and the transformers and Lightning callbacks export from a real run of a tiny model.

The torch tier (`make test-torch`, which installs torch 2.13.0's CPU wheel first): torch is
imported inside the tests only, so `make test` collects this file without torch and leaves it
to its tier. One lab watches every run at once: four incidents in one process each and the
straggler over two gloo ranks, each fast-forwarded to FAST_FORWARD, so that the baselines hold
30 lab seconds of history at the onset (the lab's own tests take 270-275). Every wait is bounded
by the configuration: the steps to the plate's latest readout at the incident's step time, the
alert's `for:`, its route's group_wait and an evaluation.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from runwatch.backtest.signatures import CLUSTER_SIGNATURES, SIGNATURES
from runwatch.core.durations import duration_seconds
from runwatch.core.paths import REPO
from runwatch.oncall.page_log import read_pages
from runwatch.prom.server import free_port, free_ports_in_a_row, instant
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import struck_rank
from tests.conftest import LabStart, wait_for

pytestmark = [pytest.mark.torch]

EXAMPLE = REPO / "examples" / "torch_workshop.py"
ONSET, FAST_FORWARD = 300, 270
LIVE_LAG = 2  # the live lab's readouts may come a step or two after the backtest's (tests/test_lab_e2e.py)
PLATE = ("lr_spike", "corrupt_shard", "repeated_batch", "slow_node")


def fires(incident: str) -> dict[str, tuple[int, int]]:
    """The plate's readouts of an incident: each alert that fires, and its window of steps."""
    spec = {**SIGNATURES, **CLUSTER_SIGNATURES}[incident]
    return {alert: e.fires for alert, e in spec.items() if e.fires is not None}


def step_seconds(incident: str) -> float:
    """The longest lab step of an incident's run (trainer.config: a slow node's, a straggler's)."""
    cfg = TrainConfig()
    return cfg.step_seconds / {"slow_node": cfg.slow_factor, "straggler": cfg.straggler_clock}.get(incident, 1.0)


def last_step(incident: str) -> int:
    """Where the example stops: past the latest readout, by the steps the slowest alert's
    pipeline takes."""
    return max(hi for _, hi in fires(incident).values()) + LIVE_LAG + 5


def rule(alert: str) -> dict:
    for path in (REPO / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                if r.get("alert") == alert:
                    return r
    raise AssertionError(f"no rule {alert}")


def pipeline_s(alert: str) -> float:
    """From the step that fires an alert to its page: its `for:`, its route's group_wait, a scrape
    and an evaluation (prometheus.yml), and the pager's receipt."""
    am = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())["route"]
    severity = rule(alert)["labels"]["severity"]
    waits = [
        r.get("group_wait", am["group_wait"])
        for r in am["routes"]
        if (m := re.search(r'severity=~?"([^"]*)"', r["matchers"][0])) and severity in m[1].split("|")
    ]
    glob = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())["global"]
    scrape, evaluation = duration_seconds(glob["scrape_interval"]), duration_seconds(glob["evaluation_interval"])
    return duration_seconds(rule(alert).get("for", "0s")) + duration_seconds(waits[0]) + scrape + evaluation + 1


class Run:
    """One run of the example, in a session of its own (a gloo hang is killed with its ranks)."""

    def __init__(self, incident: str, port: int, log: Path, ranks: int = 1):
        self.incident, self.port, self.run_id = incident, port, f"torch-{incident}"
        argv = [sys.executable, str(EXAMPLE), "--incident", incident, "--onset", str(ONSET), "--port", str(port),
                "--fast-forward", str(FAST_FORWARD), "--steps", str(last_step(incident)),
                "--run-id", self.run_id]  # fmt: skip
        if ranks > 1:
            argv += ["--ranks", str(ranks)]
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.live_at: float | None = None  # when Prometheus first held a live step of it

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """One lab watching every example run (`runwatch up --watch`), and the runs."""
    root = tmp_path_factory.mktemp("watch-torch")
    ports = {incident: free_port() for incident in PLATE}
    ports["straggler"] = free_ports_in_a_row(2)
    addresses = [f"127.0.0.1:{p}" for p in ports.values()] + [f"127.0.0.1:{ports['straggler'] + 1}"]
    start = LabStart(root, "--watch", ",".join(addresses))
    runs: dict[str, Run] = {}
    try:
        lab = start.wait()
        for incident, port in ports.items():
            runs[incident] = Run(incident, port, root / f"{incident}.log", ranks=2 if incident == "straggler" else 1)
        for run in runs.values():  # the clock each page's deadline runs from
            first_live_step(lab, run)
        yield lab, runs
    finally:
        for run in runs.values():
            run.stop()
        start.stop()


def first_live_step(lab, run: Run) -> float:
    """When Prometheus first held a live step of the run: its start is bounded by the example's
    own wait for scrapes (a minute), after torch's import and the fast-forward."""
    if run.live_at is None:
        query = f'runwatch_train_step{{run_id="{run.run_id}"}}'
        wait_for(lambda: instant(lab.url("prometheus"), query) or _dead(run), 120,
                 f"{run.run_id}'s first live step in Prometheus")  # fmt: skip
        run.live_at = time.monotonic()
    return run.live_at


def _dead(run: Run) -> bool:
    if run.proc.poll() is not None and run.proc.returncode != 0:
        pytest.fail(f"{run.run_id} exited {run.proc.returncode}: {run.log.read_text()[-2000:]}")
    return False


def page(lab, run: Run, alert: str, hi: int) -> dict:
    """The run's first page of `alert`, waited for until its latest readout's step plus the alert's pipeline."""
    live = first_live_step(lab, run)
    due = live + (hi + LIVE_LAG - FAST_FORWARD + 1) * step_seconds(run.incident) + pipeline_s(alert)

    def found():
        return [p for p in read_pages(lab.page_log) if p["run_id"] == run.run_id and p["alert"] == alert
                and p["status"] == "firing"]  # fmt: skip

    return wait_for(found, max(due - time.monotonic(), 1), f"{alert} of {run.run_id} (due by step {hi})")[0]


@pytest.mark.e2e
@pytest.mark.xdist_group("watch-torch-lab")
@pytest.mark.parametrize("incident", PLATE)
def test_the_torch_workshop_pages_each_plate_incident_at_its_onsets_readout(watched, incident):
    lab, runs = watched
    run = runs[incident]
    for alert, (lo, hi) in fires(incident).items():
        got = page(lab, run, alert, hi)
        assert lo <= int(got["step"]) <= hi + LIVE_LAG, got
        assert got["runbook_url"].endswith(f"/{alert}.md") and got["summary"]
    plate_pages = [p for p in read_pages(lab.page_log) if p["run_id"] == run.run_id and p["step"]]
    assert all(int(p["step"]) >= ONSET for p in plate_pages), plate_pages  # nothing before the onset
    # the console shows the run like any of the lab's own
    plate = requests.get(f"{lab.url('console')}/api/plate", params={"run": run.run_id}, timeout=10)
    assert plate.status_code == 200 and plate.json()["run_id"] == run.run_id, plate.text


@pytest.mark.e2e
@pytest.mark.xdist_group("watch-torch-lab")
def test_the_ddp_straggler_over_two_gloo_ranks_pages_straggler_rank_naming_its_rank(watched):
    lab, runs = watched
    run = runs["straggler"]
    lo, hi = fires("straggler")["StragglerRank"]
    got = page(lab, run, "StragglerRank", hi)
    rank = struck_rank(TrainConfig(ranks=2, incident="straggler", seed=0))
    assert got["labels"]["rank"] == str(rank), got
    assert f"Rank {rank} of run {run.run_id} is a straggler" == got["summary"]
    assert lo <= int(got["step"]) <= hi + LIVE_LAG, got
    straggler = [p for p in read_pages(lab.page_log) if p["alert"] == "StragglerRank" and p["run_id"] == run.run_id]
    assert {p["labels"]["rank"] for p in straggler} == {str(rank)}  # the healthy rank is never named


# --- the callbacks, on a real Trainer of a tiny model built here (no download) ---


def _tiny_regression():
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(64, generator=gen)
    return x, y


@pytest.mark.unit
def test_the_transformers_callback_exports_a_real_trainers_logs(tmp_path):
    import torch
    from transformers import Trainer, TrainingArguments

    from runwatch.callbacks.transformers import RunwatchCallback

    x, y = _tiny_regression()

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, input_ids=None, labels=None):
            pred = self.linear(input_ids).squeeze(-1)
            return {"loss": torch.nn.functional.mse_loss(pred, labels), "logits": pred}

    data = [{"input_ids": x[i], "labels": y[i]} for i in range(64)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, logging_steps=1, eval_strategy="steps",
                             eval_steps=3, per_device_train_batch_size=8, report_to=[], save_strategy="no",
                             use_cpu=True, include_num_input_tokens_seen=True, learning_rate=0.05,
                             dataloader_num_workers=0, disable_tqdm=True)  # fmt: skip
    seen = []

    class Peek(RunwatchCallback):  # what a scrape right after each log reads
        def on_log(self, args, state, control, logs=None, **kwargs):
            super().on_log(args, state, control, logs=logs, **kwargs)
            names = ("runwatch_train_loss", "runwatch_train_gradient_norm", "runwatch_train_learning_rate",
                     "runwatch_train_heldout_loss")  # fmt: skip
            seen.append({n: self.watch.registry.get_sample_value(n, {"run_id": "hf"}) for n in names})

    callback = Peek(run_id="hf", port=None)
    Trainer(model=Tiny(), args=args, train_dataset=data, eval_dataset=data[:16], callbacks=[callback]).train()
    reg, run = callback.watch.registry, {"run_id": "hf"}
    assert reg.get_sample_value("runwatch_train_step", run) == 6
    assert reg.get_sample_value("runwatch_train_tokens_total", run) == 6 * 8 * 4  # input_ids' elements
    assert reg.get_sample_value("runwatch_train_step_duration_seconds_count", run) == 6
    assert reg.get_sample_value("runwatch_train_run_end_time_seconds", run) is not None  # finished
    assert reg.get_sample_value("runwatch_train_loss", run) is None  # stale once the run is over
    assert len(seen) >= 6 and all(s["runwatch_train_loss"] > 0 for s in seen)
    assert all(s["runwatch_train_gradient_norm"] > 0 and s["runwatch_train_learning_rate"] > 0 for s in seen)
    assert seen[-1]["runwatch_train_heldout_loss"] > 0  # eval_loss, from the evaluations at steps 3 and 6


@pytest.mark.unit
def test_the_lightning_callback_exports_a_real_trainers_steps(tmp_path):
    import lightning as L  # noqa: N812 (Lightning's own spelling)
    import torch

    from runwatch.callbacks.lightning import RunwatchCallback

    x, y = _tiny_regression()

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.linear(batch[0]).squeeze(-1), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.linear(batch[0]).squeeze(-1), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    callback = RunwatchCallback(run_id="pl", port=None, tokens=lambda batch: batch[0].numel(), pace_s=0)
    values = {}

    class Peek(L.Callback):  # what a scrape in the middle of the run reads
        def on_train_batch_end(self, trainer, *args):
            reg = callback.watch.registry
            for name in ("runwatch_train_loss", "runwatch_train_gradient_norm", "runwatch_train_learning_rate",
                         "runwatch_train_heldout_loss"):  # fmt: skip
                values.setdefault(name, []).append(reg.get_sample_value(name, {"run_id": "pl"}))

    trainer = L.Trainer(max_steps=6, val_check_interval=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                        accelerator="cpu", devices=1, num_sanity_val_steps=0, callbacks=[callback, Peek()])  # fmt: skip
    trainer.fit(Tiny(), loader, loader)
    reg, run = callback.watch.registry, {"run_id": "pl"}
    assert reg.get_sample_value("runwatch_train_step", run) == 6
    assert reg.get_sample_value("runwatch_train_tokens_total", run) == 6 * 8 * 4
    assert all(v > 0 for v in values["runwatch_train_loss"] + values["runwatch_train_gradient_norm"])
    assert values["runwatch_train_learning_rate"] == [0.05] * 6
    assert values["runwatch_train_heldout_loss"][3] > 0  # after the validation at step 3
    assert reg.get_sample_value("runwatch_train_run_end_time_seconds", run) is not None


@pytest.mark.unit
def test_the_lightning_callback_times_the_loaders_wait_and_reports_about_once_a_second(tmp_path):
    """Issue 37, item 7: the timer started in on_train_batch_start, so a slow loader's wait was
    not counted; and every batch was published, ~35 a second, with no way to pace it."""
    import lightning as L  # noqa: N812 (Lightning's own spelling)
    import torch

    from runwatch.callbacks.lightning import RunwatchCallback

    x, y = _tiny_regression()
    load_s = 0.003  # per example: 24 ms a batch of 8, in the training loop (no loader workers)

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            time.sleep(load_s)
            return x[i], y[i]

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.linear(batch[0]).squeeze(-1), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    callback = RunwatchCallback(run_id="slow", port=None, tokens=lambda batch: batch[0].numel())
    published = []

    class Peek(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            published.append(callback.watch.registry.get_sample_value("runwatch_train_step", {"run_id": "slow"}))

    trainer = L.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path), accelerator="cpu", devices=1,
                        limit_val_batches=0, callbacks=[callback, Peek()])  # fmt: skip
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Slow(), batch_size=8))
    reg, run = callback.watch.registry, {"run_id": "slow"}
    assert reg.get_sample_value("runwatch_train_step_duration_seconds_count", run) == 6
    # every batch's loading is in its step's time: 6 batches of 8 examples
    assert reg.get_sample_value("runwatch_train_step_duration_seconds_sum", run) >= 6 * 8 * load_s
    # 6 batches in well under the 1 s pace: one report, at the end, not one a batch
    assert published == [None] * 6 and reg.get_sample_value("runwatch_train_step", run) == 6
    assert reg.get_sample_value("runwatch_train_tokens_total", run) == 6 * 8 * 4
