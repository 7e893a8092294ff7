"""The live run: paced by the lab clock, published through the exporter, logged every 10 steps.

Each step sleeps until its simulated device time has passed (1 s nominal, jittered, 1/0.7 s on
a slow node), then publishes tokens per second on that device's clock: the backtest's measure,
so host load never looks like a slow node (the host's own wall time per step goes to the step
duration histogram). The steps keep the lab clock by deadlines: step s ends at the live start
plus its lab time, so the bookkeeping between steps (run.json's fsync, ~15 ms here) does not
add up into a drift. `fast_forward` trains a prefix unpaced and unpublished first, for drills
and tests.

Watched (`watch`, as the lab runs it), the lab clock waits for Prometheus:
- it is set against the scrape grid: every whole lab second falls SCRAPE_PHASE of a scrape
  interval after a scrape, so each step ends about half a second before the scrape that reads
  it, whatever the fast-forward. `runwatch backtest` stamps its runs on the same clock and
  evaluates at the same scrapes (runwatch.backtest);
- it holds the next step while Prometheus's last scrape is older than WATCH_GRACE_S (paused,
  stopped or restarted, or its network gone), then sets the clock again against the scrapes
  that return: the steps Prometheus does not see are at most the grace's few;
- at the incident's onset it asks Prometheus whether the baselines the alerts compare with are
  recorded (`run:runwatch_baselines:ready`), and while they are not (a gap in scraping emptied
  their windows) the onset moves a step later: an incident is never injected where no alert
  could see it. run.json says by how many steps it moved;
- kept back by more than a scrape interval (a slow answer from Prometheus, a stalled host), it
  is set again against the scrapes rather than train the owed steps back to back, unseen.
Unwatched (`runwatch train` without --wait-for-prometheus), the clock runs as a real job's does.

Not for backtests: `trainer.offline` runs at full speed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from runwatch.core.files import write_atomic
from runwatch.core.names import SCRAPE_INTERVAL_S, WATCH_GRACE_S
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
POLL_S = 0.01  # how often a held clock looks for a scrape


class Scraped(Protocol):
    """An exporter's record of Prometheus's scrapes (exporter.server.MetricsServer)."""

    scraped: threading.Event  # set at each scrape
    last_scraped: float | None  # when the last one came, on time.monotonic()


@dataclass
class Watch:
    """What the live clock waits for.

    `clock_by` is the exporter whose scrapes set the lab clock (the job's training metrics);
    `servers` every exporter of this process Prometheus must keep scraping (a rank's own too).
    `ready()` says whether the alerts' baselines are recorded for the run (asked of Prometheus;
    None: the onset never waits). `agree(flags)` turns this process's flags (hold, not ready,
    late) into the job's: over MPI, every rank's, so that all ranks hold, set their clocks and
    move their onset together (no rank may wait for scrapes while another is in an exchange).
    """

    clock_by: Scraped
    servers: Sequence[Scraped] = ()
    ready: Callable[[], bool] | None = None
    agree: Callable[[tuple[bool, ...]], tuple[bool, ...]] = lambda flags: flags
    grace: float = WATCH_GRACE_S
    _servers: list[Scraped] = field(init=False)

    def __post_init__(self) -> None:
        self._servers = [self.clock_by, *(s for s in self.servers if s is not self.clock_by)]

    def unseen(self, now: float) -> float:
        """Seconds since the least recently scraped of the exporters was scraped (those never
        scraped yet do not count: Prometheus has not found them)."""
        seen = [s.last_scraped for s in self._servers if s.last_scraped is not None]
        return max((now - t for t in seen), default=0.0)


def watch_of(args, servers: Sequence[Scraped], ready: Callable[[], bool] | None, agree=None) -> Watch | None:
    """What the live clock of `runwatch train` waits for: with --wait-for-prometheus, the
    scrapes of these exporters (the last one's set the clock), and `ready()`, the alerts'
    baselines at the onset, which the command asks of Prometheus (runwatch.prom.server's
    baselines_ready: the watched process does not import its watcher's client)."""
    if not args.wait_for_prometheus:
        return None
    return Watch(servers[-1], servers, ready, **({} if agree is None else {"agree": agree}))


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
    cfg: TrainConfig, metrics: TrainerMetrics, record: RunRecord, fast_forward: int = 0,
    stop: threading.Event | None = None, log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    trainer: Trainer | None = None, checkpoints: Path | None = None, watch: Watch | None = None,
    onset_moved: Callable[[TrainConfig], None] | None = None,
) -> str:  # fmt: skip
    """Train every step of cfg paced, publishing to metrics; return the final status.

    The status is "completed", "interrupted" when stop is set or Ctrl-C arrives, or why the trainer
    halted. run.json is rewritten whole after every live step. `trainer` resumes a run (from a checkpoint);
    with `checkpoints`, the state is saved there every cfg.checkpoint_every steps. With `watch`,
    the clock waits for Prometheus (the module's docstring says how): the first live step waits
    for its scrapes, so a Prometheus that starts late still sees every live step, and later
    steps hold while it is away. When the onset moves, `onset_moved(cfg)` is told the run's
    config with its real onset, before that step (a drill seals it again).
    """
    stop = stop or threading.Event()
    trainer = trainer or Trainer(cfg)
    last = None
    record.save(lab_time=trainer.lab_time)
    try:
        last = _fast_forward(trainer, min(fast_forward, cfg.steps), metrics, checkpoints, log)
        scraped = None if watch is None else watch.clock_by.scraped
        start, lab0 = _set_clock(trainer, scraped, stop, log, clock, sleep), trainer.lab_time
        # --- live: one step per lab second, published as it completes ---
        record.save(live_since=time.time() + start - clock(), live_lab_time=lab0)
        t0, planned = start, trainer.cfg.onset
        while not trainer.done and not stop.is_set() and not trainer.halted:
            # --- the watcher: hold while Prometheus is away, and the onset until it can be seen ---
            if watch is not None:
                due = start + (trainer.lab_time - lab0)  # when this step should begin
                resumed, held = _watched(trainer, watch, planned, record, metrics, onset_moved, due, stop, log,
                                         clock, sleep)  # fmt: skip
                if resumed is not None:  # the clock was set again: it reads trainer.lab_time at `resumed`
                    start, lab0, t0 = resumed, trainer.lab_time, resumed
                if held:
                    continue  # look again: Prometheus may have gone away while the clock was set
            rec = trainer.step()
            if (remaining := start + (rec.lab_time - lab0) - clock()) > 0:  # its deadline on the lab clock
                sleep(remaining)
            wall = max(clock() - t0, 1e-6)  # the host's time for the step: load shows here
            t0 += wall
            metrics.observe(rec, tps := rec.tokens / rec.duration_seconds, wall_seconds=wall)
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


def _fast_forward(
    trainer: Trainer, to: int, metrics: TrainerMetrics, checkpoints: Path | None, log: Callable[[str], None]
) -> StepRecord | None:
    """Steps up to `to`, unpaced and unpublished, but their tokens and checkpoints count."""
    last = None
    while trainer.next_step < to and not trainer.halted:
        last = trainer.step()
        metrics.add_tokens(last.tokens)
        _checkpoint(trainer, last.step, checkpoints, metrics)
    if last is not None:
        log(f"fast-forwarded to step {trainer.next_step} (no Prometheus history before it)")
    return last


def _watched(
    trainer: Trainer, watch: Watch, planned: int, record: RunRecord, metrics: TrainerMetrics,
    onset_moved: Callable[[TrainConfig], None] | None, due: float, stop: threading.Event,
    log: Callable[[str], None], clock: Callable[[], float], sleep: Callable[[float], None],
) -> tuple[float | None, bool]:  # fmt: skip
    """Before a step: hold while Prometheus is away, or move an onset whose baselines are not
    recorded. Returns when the clock goes on if it was set again (None: as it was), and whether
    it held (every rank did, by watch.agree: the loop looks again)."""
    at_onset = trainer.next_step == trainer.cfg.onset and trainer.cfg.incident != "none"
    unready = at_onset and watch.ready is not None and not watch.ready()  # an answer may take seconds
    now = clock()
    away, late = watch.unseen(now) > watch.grace, now - due > SCRAPE_INTERVAL_S
    hold, unready, late = watch.agree((away, unready, late))  # every rank's, so all do the same
    if hold:
        began = clock()
        record.save(paused_since=utc_now())
        resumed = _hold(trainer, watch, stop, log, clock, sleep)
        metrics.waited(clock() - began)
        record.save(paused_since=None)
        return (clock() if resumed is None else resumed), True  # stopped: the loop ends
    start = None
    if late:
        # Kept back (a slow answer from Prometheus, a DNS lookup of seconds, a stalled host): the
        # deadlines would have the owed steps trained back to back, between two scrapes, and
        # unseen. Set the clock again against the scrapes instead, as after a hold; should the
        # scrapes stop meanwhile, that is a hold like any other, which the loop takes next.
        # (no step in the line: a drill's onset would show)
        log(f"the clock fell {now - due:.0f} s behind; setting it against the scrapes again")
        began = clock()
        start = _set_clock(trainer, watch.clock_by.scraped, stop, log, clock, sleep,
                           away=lambda: watch.unseen(clock()) > watch.grace)  # fmt: skip
        metrics.waited(clock() - began)
        (gone,) = watch.agree((start is None,))
        if gone:
            return clock(), True
    if at_onset and unready and trainer.cfg.onset + 1 < trainer.cfg.steps:
        trainer.move_onset(trainer.cfg.onset + 1)
    elif at_onset and trainer.cfg.onset != planned:
        _moved(trainer.cfg, planned, record, log, onset_moved)
    return start, False


def _hold(
    trainer: Trainer,
    watch: Watch,
    stop: threading.Event,
    log: Callable[[str], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> float | None:
    """Hold the clock until Prometheus scrapes again, then set it against the returning scrapes;
    return when (on `clock`) the lab clock reads trainer.lab_time again, or None if stopped.
    Each rank holds for its own exporters; watch.agree then lets them go on together."""
    began, step = clock(), trainer.next_step - 1
    log(f"paused after step {step}: Prometheus has not scraped for {watch.unseen(began):.0f} s; waiting for it")
    while not stop.is_set() and watch.unseen(clock()) > watch.grace:
        sleep(POLL_S)
    if stop.is_set():
        return None
    start = _set_clock(trainer, watch.clock_by.scraped, stop, log, clock, sleep)
    log(f"resumed after step {step}: Prometheus scrapes again; the clock held {clock() - began:.0f} s")
    return None if stop.is_set() else start


def _moved(
    cfg: TrainConfig, planned: int, record: RunRecord, log: Callable[[str], None],
    onset_moved: Callable[[TrainConfig], None] | None,
) -> None:  # fmt: skip
    """The onset is taken `cfg.onset - planned` steps late: say so where the run's truth is kept
    (a drill's only in its sealed answer, never in run.json or the log)."""
    moved = cfg.onset - planned
    if not cfg.drill:
        log(f"onset moved {moved} steps, to step {cfg.onset}: the alerts' baselines were not recorded at {planned}")
        record.data["config"]["onset"] = cfg.onset
        record.save(onset_moved_by=moved)
    if onset_moved is not None:
        onset_moved(cfg)


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
    away: Callable[[], bool] | None = None,
) -> float | None:
    """When (on `clock`) the lab clock reads trainer.lab_time: with `scraped`, after Prometheus's
    next scrape, where that scrape falls SCRAPE_PHASE into a lab second; else now. None if
    `away()` turns true while it waits for the scrapes."""
    scrape = _wait_for_scrape(scraped, stop, log, clock, away)
    if scrape is None:
        return None if away is not None and away() else clock()
    start = scrape + (trainer.lab_time - SCRAPE_PHASE) % 1.0
    if start > clock():
        sleep(start - clock())
    return start


def _wait_for_scrape(
    scraped: threading.Event | None, stop: threading.Event, log: Callable[[str], None], clock: Callable[[], float],
    away: Callable[[], bool] | None = None,
) -> float | None:  # fmt: skip
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
            if away is not None and away():
                return None
        arrivals.append(clock())
    last = arrivals[-1] if arrivals else clock()
    return last + min((((a - last + 0.5) % 1.0) - 0.5 for a in arrivals), default=0.0)
