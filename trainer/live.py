"""The live run: paced by the lab clock, published through the exporter, logged every 10 steps.

Each step sleeps until its simulated device time has passed (1 s nominal, jittered, 1/0.7 s on
a slow node), then publishes tokens per second measured from the wall clock around it. The
steps keep the lab clock by deadlines: step s ends at the live start plus its lab time, so the
bookkeeping between steps (run.json's fsync, ~15 ms here) does not add up into a drift.
`fast_forward` trains a prefix unpaced and unpublished first, for drills and tests.

Held for Prometheus (`scraped`), the lab clock is set against the scrape grid: every whole lab
second falls SCRAPE_PHASE of a scrape interval after a scrape, so each step ends about half a
second before the scrape that reads it, whatever the fast-forward. `runwatch backtest` stamps
its runs on the same clock and evaluates at the same scrapes (runwatch.backtest).

Not for backtests: `trainer.offline` runs at full speed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from runwatch.core.files import write_atomic
from runwatch.exporter.metrics import TrainerMetrics
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.record import StepRecord
from runwatch.trainer.run import Trainer

LOG_EVERY = 10
# Where Prometheus's scrapes fall on the lab clock, as a fraction of the 1 s scrape interval
# (prometheus.yml): a scrape at lab time k + SCRAPE_PHASE reads the steps that ended by then.
# Half an interval keeps the 2% jitter of a step's end (and the ms a scrape takes) far from the
# scrape that reads it: a step is read by the same scrape in the live lab and in the backtest.
SCRAPE_PHASE = 0.5
# Scrapes the trainer times before its first live step: each reaches it some ms after its
# timestamp (82 ms for the first scrape of a starting Prometheus on a busy machine), so the
# least late of a few says where the scrapes fall.
PHASE_SCRAPES = 3


def log_line(rec: StepRecord, tokens_per_second: float) -> str:
    """The fixed-format progress line."""
    return (
        f"step {rec.step:4d} | loss {rec.loss:8.4f} | heldout {rec.heldout_loss:8.4f} | "
        f"grad_norm {rec.gradient_norm:8.4f} | tokens/s {tokens_per_second:9.0f}"
    )


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def unique_run_id(label: str, now: datetime | None = None) -> str:
    """The label of a live run, stamped with its start (UTC HHMMSS): two runs of one seed and
    incident must not merge in Prometheus, in the dashboards' $run or in run.json."""
    return f"{label}-{(now or datetime.now(UTC)):%H%M%S}"


class RunRecord:
    """run.json: the config plus how far the run got, rewritten atomically so it is never partial.

    In a drill the config saved here has its incident replaced by "hidden"; the truth is sealed
    elsewhere (see `runwatch.drill`).
    """

    def __init__(self, path: Path, cfg: TrainConfig, public_cfg: TrainConfig):
        self.path = Path(path)
        self.data = {
            "config": json.loads(public_cfg.to_json()),
            "run_id": cfg.label,
            "status": "running",
            "started_at": utc_now(),
            "ended_at": None,
            "last_step": None,
        }

    def save(self, **changes: object) -> None:
        self.data.update(changes)
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")


def run_live(
    cfg: TrainConfig,
    metrics: TrainerMetrics,
    record: RunRecord,
    fast_forward: int = 0,
    stop: threading.Event | None = None,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    trainer: Trainer | None = None,
    checkpoints: Path | None = None,
    scraped: threading.Event | None = None,
) -> str:
    """Train every step of cfg paced, publishing to metrics; return the final status.

    The status is "completed", "interrupted" when stop is set or Ctrl-C arrives, or why the trainer
    halted. run.json is rewritten whole after every live step. `trainer` resumes a run (from a checkpoint);
    with `checkpoints`, the state is saved there every cfg.checkpoint_every steps. With `scraped`,
    the first live step waits until it is set (Prometheus has scraped the exporter once), so a
    Prometheus that starts late still sees every live step and the baselines fill before the onset.
    """
    stop = stop or threading.Event()
    trainer = trainer or Trainer(cfg)
    last = None
    record.save(lab_time=trainer.lab_time)
    try:
        # --- fast-forward: unpaced, unpublished, but its tokens and checkpoints count ---
        while trainer.next_step < min(fast_forward, cfg.steps) and not trainer.halted:
            last = trainer.step()
            metrics.add_tokens(last.tokens)
            _checkpoint(trainer, last.step, checkpoints, metrics)
        if last is not None:
            log(f"fast-forwarded to step {trainer.next_step} (no Prometheus history before it)")
        start, lab0 = _set_clock(trainer, scraped, stop, log, clock, sleep), trainer.lab_time
        # --- live: one step per lab second, published as it completes ---
        record.save(live_since=time.time() + start - clock(), live_lab_time=lab0)
        t0 = start
        while not trainer.done and not stop.is_set() and not trainer.halted:
            rec = trainer.step()
            remaining = start + (rec.lab_time - lab0) - clock()  # its deadline on the lab clock
            if remaining > 0:
                sleep(remaining)
            tps = rec.tokens / (wall := max(clock() - t0, 1e-6))
            t0 += wall
            metrics.observe(rec, tps, wall_seconds=wall)
            last = rec
            _checkpoint(trainer, rec.step, checkpoints, metrics)
            # how far the run got, always: a launcher restarting a cluster job reads it
            record.save(last_step=rec.step, lab_time=trainer.lab_time)
            if rec.step % LOG_EVERY == 0:
                log(log_line(rec, tps))
        status = "completed" if trainer.done else trainer.halted or "interrupted"
        if trainer.done:
            metrics.finish()
    except KeyboardInterrupt:
        status = "interrupted"
    record.save(status=status, ended_at=utc_now(), last_step=None if last is None else last.step)
    return status


def _checkpoint(trainer: Trainer, step: int, checkpoints: Path | None, metrics: TrainerMetrics) -> None:
    """Save the state after `step` every cfg.checkpoint_every steps (into `checkpoints`, if given)."""
    if checkpoints is not None and (step + 1) % trainer.cfg.checkpoint_every == 0:
        trainer.save_checkpoint(checkpoints)
        metrics.checkpoint(step)


def _set_clock(
    trainer: Trainer,
    scraped: threading.Event | None,
    stop: threading.Event,
    log: Callable[[str], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> float:
    """When (on `clock`) the lab clock reads trainer.lab_time: with `scraped`, after Prometheus's
    next scrape, where that scrape falls SCRAPE_PHASE into a lab second; else now."""
    scrape = _wait_for_scrape(scraped, stop, log, clock)
    if scrape is None:
        return clock()
    start = scrape + (trainer.lab_time - SCRAPE_PHASE) % 1.0
    if start > clock():
        sleep(start - clock())
    return start


def _wait_for_scrape(
    scraped: threading.Event | None, stop: threading.Event, log: Callable[[str], None], clock: Callable[[], float]
) -> float | None:
    """Hold the first live step until Prometheus has scraped PHASE_SCRAPES times: steps it never
    scrapes would be missing from every baseline. Returns when (on `clock`) the last of them was
    due, by the least late of them (scrapes come 1 s apart); None without `scraped`. Scrapes
    during the fast-forward do not count: the lab clock is set against fresh ones."""
    if scraped is None:
        return None
    if not scraped.is_set():
        log("waiting for Prometheus's first scrape before the first live step")
    arrivals: list[float] = []
    while len(arrivals) < PHASE_SCRAPES and not stop.is_set():
        scraped.clear()
        while not scraped.wait(0.01) and not stop.is_set():
            pass
        arrivals.append(clock())
    last = arrivals[-1] if arrivals else clock()
    return last + min((((a - last + 0.5) % 1.0) - 0.5 for a in arrivals), default=0.0)
