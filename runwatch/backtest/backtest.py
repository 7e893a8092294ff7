"""`runwatch backtest`: every seed x incident through a real Prometheus, read like the plate.

    runwatch backtest --seeds 100-199 [--rules DIR] [--json FILE] [--no-cache]
    runwatch backtest --strengths 0.05-1 --sweep TrainingLossJump=2,2.5,3,4,5 --plot sweep.png

`--strengths` draws each incident run's strength (trainer.config: the plate's is 1), and the
table then reads per incident and strength band. `--sweep` evaluates one alert at several
values of its threshold or its `for:` (runwatch.backtest.sweep), beside the rules in force.

1. Trains every seed x incident offline, all runs of a chunk of seeds as one batched numpy
   computation (trainer.batch: bit for bit the runs `runwatch train --offline` writes).
2. Pushes each chunk's samples, as the offline writer would write them, into a loading
   Prometheus over remote write (runwatch.remote_write), whose snapshot writes them out as a
   TSDB block. The block is cached (runwatch.datacache): a backtest of the same runs, under
   edited rules, starts here.
3. Starts a throwaway Prometheus over it (loopback, free port, retention 100y). Recording rules
   are evaluated where the alerts read them, as subqueries on a 1 s grid (runwatch.inline); a
   recording rule read in a form that cannot be inlined exactly is backfilled first: evaluated
   on the same grid and loaded as a block, as the runs are.
4. Reads each alert on that grid. `for: D` is honoured in PromQL: an alert fires at T when its
   condition held at every evaluation in [T-D, T],
   `count_over_time((condition)[D + 0.5s:1s]) >= D/1s + 1`.
5. Reads each run's step at the first firing evaluation, and compares with the plate.

The grid is the live lab's scrapes. The live trainer sets its lab clock so that a scrape falls
SCRAPE_PHASE (half a second) after every whole lab second (trainer.live); a live rule group
evaluates some fixed fraction of a second later, reading that scrape. So every grid point is a
scrape, and each rule reads the steps that ended by it. What the groups' phases change is only
their order after a scrape: a group that reads a recording of a group evaluated *before* the
scrape sees it one scrape late (Schedule). By default every recording is read fresh, as
promtool's tests read them; `--lab URL` reads a running lab's order from its Prometheus.

Python only starts, feeds, queries and reports; Prometheus evaluates every expression.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests

from runwatch import exporter, trainer
from runwatch.backtest import remote_write, signatures
from runwatch.backtest import sweep as workbench
from runwatch.backtest.datacache import DataCache, default_root, key_of
from runwatch.backtest.inline import Inliner, references
from runwatch.backtest.remote_write import push, write_request
from runwatch.backtest.sweep import Strengths, parse_strengths
from runwatch.core.bounded import MAX_RULE_FILE_BYTES, BoundedReadError, load_yaml, regular_file
from runwatch.core.command import Command, UsageError, check_writable, config_error, number
from runwatch.core.durations import duration_seconds
from runwatch.core.files import write_atomic
from runwatch.core.names import CLUSTER_ALERTS, LOOPBACK, META_GROUP, PORTS
from runwatch.core.paths import Layout
from runwatch.exporter.metrics import STEP
from runwatch.prom.server import Process, die_with_parent, free_port, prometheus_argv, query_range
from runwatch.prom.tools import binary, run_tool
from runwatch.trainer.batch import train_columns
from runwatch.trainer.config import MAX_RANKS, MAX_SEED, ConfigError, TrainConfig
from runwatch.trainer.live import SCRAPE_PHASE
from runwatch.trainer.offline import DEFAULT_START, FAMILIES, OfflineRun, series
from runwatch.trainer.run import struck_rank

# A load, snapshot or backfill that runs past this is hung, not slow: 500 runs load in about 8 s here.
BACKFILL_TIMEOUT_S = 900
RETENTION = "100y"  # the runs are stamped in 2026-01; a short retention would delete them
# A recording rule over ALERTS (alerts.yml's first-fire record) has no input here: the
# backfill writes no ALERTS series. Nor can one that reads its own last value (a live
# Prometheus's carried state: alerts.yml's record of a trainer target's run, kept while the target
# is down) be replayed by a range query: both are left out, as a live lab's bookkeeping.
LIVE_ALERTS = re.compile(r"\bALERTS(_FOR_STATE)?\b")
# The throwaway's lookback: backfilled data carries no staleness markers; a 3 s lookback lets a
# run's series vanish when it ends, as staleness makes them vanish in the live lab.
LOOKBACK = "3s"
# Rules are evaluated on whole seconds (subqueries align to them), each one a scrape of the live
# lab. The runs are stamped this many ms earlier than the lab clock, so that a whole second falls
# where the live lab's scrapes fall on its clock: SCRAPE_PHASE into each lab second (trainer.live).
GRID_PHASE_MS = round(SCRAPE_PHASE * 1000)
# Runs in one remote-write request: about 2 MB of one rank's runs, 20 MB of eight ranks'.
PUSH_RUNS = 25
# Alert queries in flight at once; Prometheus's own limit (--query.max-concurrency) is 20.
MAX_QUERIES = 16
# The data's cache: bump when what an entry holds changes meaning.
CACHE_FORMAT = 3
RESULTS_FORMAT = 2  # an alert's kept result: each series that fired, when it first did, and how often it began
CACHE_MAX_MB = 512  # about 34 backtests of 100 seeds (15 MB each)


# --- input ---

ALL_INCIDENTS = signatures.INCIDENTS + signatures.CLUSTER_INCIDENTS
RANK_ALERTS = ("StragglerRank",)  # alerts whose series name a rank


# 1,000 seeds (5,000 runs) is ten times docs/readouts.md's 100-seed backtest: more than any exercise needs.
# A typo such as 0-99999999999 is refused before building the range (that took 3.8 GB in 7 s).
MAX_SEEDS = 1000


def parse_seeds(text: str) -> list[int]:
    """'0-99' or '3,5,10-12' -> sorted unique seeds; UsageError naming --seeds otherwise."""
    seeds: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise UsageError(f"--seeds: expected a range like 0-99 or a list like 1,2,5-7, got {text!r}")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo:
            raise UsageError(f"--seeds: range {lo}-{hi} runs backwards")
        if hi > MAX_SEED:
            raise UsageError(f"--seeds: seeds go up to {MAX_SEED}, got {hi}")
        if hi - lo + 1 + len(seeds) > MAX_SEEDS:  # counted before the range is built
            raise UsageError(f"--seeds: at most {MAX_SEEDS} seeds in one backtest, got {text!r}")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


@dataclass
class Rules:
    """The rules of a directory, split as the backtest needs them, and where each one is."""

    recording: list[dict] = field(default_factory=list)  # {"record", "expr", ...}
    alerting: list[dict] = field(default_factory=list)  # {"alert", "expr", "for", ...}
    recorded_at: dict[str, tuple[str, int]] = field(default_factory=dict)  # record -> (group, position)
    alert_at: list[tuple[str, int]] = field(default_factory=list)  # alerting[i]'s (group, position)


@dataclass(frozen=True)
class Schedule:
    """When each rule group evaluates after the scrape it reads, in seconds (0 to 1): the order a
    live Prometheus gives them (each group's phase comes from a hash of its name and file, each
    target's from a hash of its labels, so it differs from lab to lab and between versions).

    A rule reads a recording of another group one scrape late when that group evaluates later
    after the scrape (it last evaluated before it); of its own group, when the recording comes
    later in the group. Not for labs of several scrape phases at once (the ranks of a cluster).

        >>> Schedule({"runwatch-baselines": 0.9, "runwatch-training": 0.7}).lag(
        ...     ("runwatch-training", 0), ("runwatch-baselines", 3))
        1
    """

    after_scrape: dict[str, float]  # group -> seconds from the scrape (its sample in the TSDB) to its evaluation
    # groups that evaluate while the scrape is in flight: each evaluation may or may not see it
    racing: frozenset[str] = frozenset()

    def lag(self, reader: tuple[str, int], recorded: tuple[str, int]) -> int:
        (group, pos), (rgroup, rpos) = reader, recorded
        if group == rgroup:
            return int(rpos > pos)
        missing = [g for g in (group, rgroup) if g not in self.after_scrape]
        if missing:
            raise UsageError(f"--lab: the lab's Prometheus has no rule group {missing[0]!r}: reload it with the rules")
        return int(self.after_scrape[rgroup] > self.after_scrape[group])

    @classmethod
    def of_lab(cls, base: str, port: int) -> Schedule:
        """A running lab's: its groups' last evaluations (/api/v1/rules) against the last scrape of
        its target on `port` (/api/v1/targets), which is seen once the scrape has ended."""
        try:
            groups = requests.get(f"{base}/api/v1/rules", timeout=10).json()["data"]["groups"]
            targets = requests.get(f"{base}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        except (requests.RequestException, ValueError, KeyError) as err:
            raise UsageError(f"--lab: cannot read the rules and targets of {base}: {err}") from None
        scrape = [t for t in targets if t["scrapeUrl"].split("/")[2].endswith(f":{port}") and t["health"] == "up"]
        if not scrape:
            raise UsageError(f"--lab: {base} scrapes no target on port {port}: start the lab first")
        waiting = [float(g.get("interval", 1)) for g in groups if g["lastEvaluation"].startswith("0001-")]
        if waiting:  # Go's zero time: not evaluated yet (cluster.yml's 30 s group, up to 30 s after the start)
            raise UsageError(f"--lab: {base} has not evaluated every rule group yet: try again in {max(waiting):g}s")
        started = _phase(scrape[0]["lastScrape"])
        seen = started + float(scrape[0]["lastScrapeDuration"])
        after = {g["name"]: (_phase(g["lastEvaluation"]) - seen) % 1.0 for g in groups}
        # from the scrape's start to RACE_S past its end, an evaluation may run before or after
        # the scrape's samples are appended (the scrape took lastScrapeDuration once, not always)
        window = seen - started + RACE_S
        racing = {g for g in after if (after[g] + seen - started) % 1.0 < window}
        return cls(after, frozenset(racing))


RACE_S = 0.02  # how much longer than its last one a scrape may take (10 ms here with four labs on 2 cores)


def _phase(stamp: str) -> float:
    """The fraction of a second of an RFC 3339 time as Prometheus's API writes it (ns digits)."""
    frac = re.search(r"\.(\d+)", stamp)
    return float(f"0.{frac[1]}") if frac else 0.0


def load_rules(rules_dir: Path, promtool: str) -> Rules:
    files = Layout().rule_files(rules_dir)  # what prometheus.yml loads: rules/*.yml
    if not files:
        raise UsageError(f"--rules: no .yml rule files in {rules_dir}")
    for f in files:  # before promtool reads them: a.yml -> /dev/zero took it to 8.5 GB in 5 s
        try:
            regular_file(f, "a rule file", MAX_RULE_FILE_BYTES)  # through a symlink: what would be read
        except BoundedReadError as err:
            raise UsageError(f"--rules: {err}") from None
    proc = run_tool([promtool, "check", "rules", *map(str, files)])
    if proc.returncode != 0:
        raise UsageError(f"--rules: promtool check rules refused {rules_dir}:\n{(proc.stdout + proc.stderr).strip()}")
    rules = Rules()
    for f in files:
        try:  # promtool has read them; no alias bomb for PyYAML either
            doc = load_yaml(f, "a rule file") or {}
        except BoundedReadError as err:
            raise UsageError(f"--rules: {err}") from None
        for group in (doc if isinstance(doc, dict) else {}).get("groups", []):
            if group.get("name") == META_GROUP:
                continue
            for pos, rule in enumerate(group.get("rules", [])):
                if "record" in rule and LIVE_ALERTS.search(rule["expr"]):
                    continue  # bookkeeping of a live Prometheus's alerts; step 5 reads first fires itself
                if "record" in rule and rule["record"] in {ref.name for ref in references(rule["expr"])}:
                    continue  # carried state; TrainerDown then reads up alone, which is all a replay has
                if "record" in rule:
                    rules.recording.append(rule)
                    rules.recorded_at[rule["record"]] = (group["name"], pos)
                else:
                    rules.alerting.append(rule)
                    rules.alert_at.append((group["name"], pos))
    return rules


def recording_levels(recording: list[dict]) -> list[list[dict]]:
    """Recording rules in backfill passes: a rule that reads another recorded series waits for it."""
    names = {r["record"] for r in recording}
    done: set[str] = set()
    levels, left = [], list(recording)
    while left:
        ready = [r for r in left if not ({n for n in names if n in r["expr"]} - done - {r["record"]})]
        if not ready:  # a cycle: backfill the rest together and let Prometheus say what is missing
            ready = left
        levels.append(ready)
        done |= {r["record"] for r in ready}
        left = [r for r in left if r not in ready]
    return levels


# --- 1-2: simulate and load ---


def families_read(rules: Rules) -> set[str]:
    """The trainer's metric families that some rule names, plus the step (for readouts) and up.
    A whole name: runwatch_train_tokens is not read by a rule on runwatch_train_tokens_per_second,
    but is by one on runwatch_train_tokens_total."""
    names = {ref.name for r in rules.recording + rules.alerting for ref in references(r["expr"])}
    if any("__name__" in r["expr"] for r in rules.recording + rules.alerting):
        names = set(FAMILIES)  # a rule may select families by a pattern: load them all
    return {f for f in FAMILIES if f in names or f"{f}_total" in names} | {STEP, "up"}  # a counter's samples: _total


def _simulate_chunk(
    args: tuple[list[int], tuple[str, ...], str, set[str], str, int, Strengths | None],
) -> tuple[list[dict], int]:
    """Worker: train a chunk of seeds and push their samples into the loading Prometheus at base."""
    seeds, incidents, base, families, precision, ranks, strengths = args
    configs = [
        TrainConfig(incident=i, seed=seed, precision=precision, ranks=ranks,
                    strength=strengths.of(seed, i) if strengths else 1.0)
        for seed in seeds for i in incidents
    ]  # fmt: skip
    # Hundreds of thousands of values and arrays, and no reference cycles among them: the
    # cyclic collector would only walk them again and again (5-10% of a chunk's time).
    gc.disable()
    try:
        runs, meta = [], []
        for cfg, columns in zip(configs, train_columns(configs), strict=True):
            run = OfflineRun(cfg, columns, shift_ms=GRID_PHASE_MS)
            runs.append(run)
            meta.append({"incident": cfg.incident, "seed": cfg.seed, "run_id": cfg.label, "end": run.end_time(),
                         "strength": cfg.strength,
                         **({"fault_at": run.fault_time()} if cfg.incident in signatures.FAULTS else {})})  # fmt: skip
        samples = 0
        for i in range(0, len(runs), PUSH_RUNS):
            body, n = write_request(s for run in runs[i : i + PUSH_RUNS] for s in series(run, families))
            push(base, body)
            samples += n
    finally:
        gc.enable()
    return meta, samples


# --- 3-5: evaluate ---


def firing_query(condition: str, rule: dict) -> str:
    """PromQL over an alert's condition: firing at T when it held at every evaluation of its `for`."""
    hold = duration_seconds(str(rule.get("for", "0s")), f"--rules: for: of alert {rule['alert']}")
    n = int(round(hold))  # evaluations are 1 s apart
    if n == 0:  # held at the one evaluation in [T, T]: the condition itself, without a subquery's cost
        return condition
    return f"count_over_time(({condition})[{n * 1000 + 500}ms:1s]) >= {n + 1}"


def run_of(metric: dict, run_ids: set[str]) -> str | None:
    """Which run a firing series belongs to: its run_id, else its offline instance
    (offline/RUN, or offline/RUN/rankR for a rank and its GPU)."""
    if metric.get("run_id") in run_ids:
        return metric["run_id"]
    run = metric.get("instance", "").removeprefix("offline/").split("/")[0]
    return run if run in run_ids else None


@dataclass
class Result:
    runs: list[dict]  # {"incident", "seed", "run_id", "first_fire": {alert: step | None}}
    unattributed: dict[str, int]  # alert -> firing series that belong to no run
    alerts: list[str]
    seconds: dict[str, float]
    samples: int
    cached: bool = False  # the runs' data came from the cache
    ranks: int = 1  # every run data-parallel over this many ranks


class Progress:
    def __init__(self, stream=sys.stderr):
        self.stream, self.tty = stream, stream.isatty()

    def __call__(self, text: str, done: bool = True) -> None:
        end = "\n" if (done or not self.tty) else "\r"
        self.stream.write(f"backtest: {text}".ljust(60) + end)  # one write: the alert queries report from threads
        self.stream.flush()


@dataclass
class Throwaway:
    """The backtest's own Prometheus: its data directory, argv, address and grid."""

    tmpdir: Path
    argv: list[str]
    base: str
    start: float  # the grid's first evaluation, a whole second
    end: float  # its last one is the last whole second up to here
    name: str = "prometheus"  # its log is tmpdir/name.log
    tsdb: str = "data"  # its TSDB is tmpdir/tsdb

    @property
    def data(self) -> str:
        return str(self.tmpdir / self.tsdb)

    def running(self) -> Process:
        # Prometheus closes its TSDB only once the queries in flight end; this one's data is
        # thrown away, so a Ctrl-C during a slow query need not wait for it.
        # It dies with the backtest, even on a kill -9 that runs no `finally` (die_with_parent).
        return Process(self.argv, f"{self.base}/-/ready", self.tmpdir / f"{self.name}.log", grace=1.0, with_parent=True)


@dataclass
class Plan:
    """How the rules are evaluated: which recordings are backfilled first, in passes, and each
    alert's condition with every other recording inlined."""

    passes: list[list[dict]]
    conditions: list[str]


@dataclass
class Kept:
    """Alert results kept with the runs' cache entry `key`: a query evaluated once on this data,
    this grid and these backfilled recordings is read back, not evaluated again."""

    cache: DataCache
    key: str
    grid: dict  # everything besides the query's text that its result follows from

    def get(self, query: str) -> list[dict] | None:
        return self.cache.result(self.key, {**self.grid, "query": query})

    def put(self, query: str, found: list[dict]) -> None:
        self.cache.keep(self.key, {**self.grid, "query": query}, found)


def plan(rules: Rules, since: float, inline: bool = True, schedule: Schedule | None = None) -> Plan:
    """Inline every recording rule that can be inlined exactly (all of them, with `inline`);
    backfill the others, with what they read inlined, on the grid from `since`. With `schedule`,
    an inlined recording is read as late as that schedule has its reader read it; a backfilled
    one is read fresh."""
    labelled = {r["record"] for r in rules.recording if r.get("labels")}
    defs = {r["record"]: r["expr"] for r in rules.recording if r["record"] not in labelled}
    # a name several rules record, told apart by their `labels:` (alerts.yml's thresholds)
    variants: dict[str, list[tuple[dict[str, str], str]]] = {}
    for r in rules.recording:
        if r["record"] in labelled:
            variants.setdefault(r["record"], []).append(({k: str(v) for k, v in (r.get("labels") or {}).items()},
                                                         r["expr"]))  # fmt: skip

    def lag(reader: object, name: str) -> int:
        where = rules.alert_at[reader] if isinstance(reader, int) else rules.recorded_at[reader]
        if schedule is None:  # fresh: only a recording later in the reader's own group is a scrape late
            return int(where[0] == rules.recorded_at[name][0] and rules.recorded_at[name][1] > where[1])
        return schedule.lag(where, rules.recorded_at[name])

    inliner = Inliner(defs, LOOKBACK, since, variants, lag)
    conditions = [r["expr"] for r in rules.alerting]
    inlined = inliner.inlinable(conditions, labelled) if inline else set()
    # the recordings an alert reads, directly or through another recording
    reads = {n: [e] for n, e in defs.items()} | {n: [e for _, e in v] for n, v in variants.items()}
    needed, todo = set(), [n.name for c in conditions for n in references(c) if n.name in reads]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += [n.name for e in reads[name] for n in references(e) if n.name in reads]
    recorded = [
        {**r, "expr": inliner.inline(r["expr"], inlined, reader=r["record"])}
        for r in rules.recording
        if r["record"] in needed - inlined
    ]
    return Plan(
        passes=recording_levels(recorded) if recorded else [],
        conditions=[inliner.guarded(inliner.inline(c, inlined, reader=i)) for i, c in enumerate(conditions)],
    )


def _load(
    seeds: list[int], incidents: tuple[str, ...], tmpdir: Path, families: set[str], prometheus: str, workers: int,
    precision: str, progress: Progress, cache: DataCache | None, key: str, ranks: int = 1,
    strengths: Strengths | None = None,
) -> tuple[list[dict], int, bool]:  # fmt: skip
    """Steps 1-2, or their cached result (entry `key`): (the runs' metadata, samples loaded,
    from the cache)."""
    if cache is not None:
        found = cache.get(key, tmpdir / "data")
        if found is not None:
            progress(f"loaded {len(found['runs'])} runs from the cache ({cache.root / key})")
            return found["runs"], found["samples"], True
    meta, samples = _train_and_load(
        seeds, incidents, tmpdir, families, prometheus, workers, precision, progress, ranks, strengths
    )
    if cache is not None:
        cache.put(key, tmpdir / "data", {"runs": meta, "samples": samples})
    return meta, samples, False


def cache_key(
    seeds: list[int], incidents: tuple[str, ...], precision: str, families: set[str], prometheus: str, ranks: int = 1,
    strengths: Strengths | None = None,
) -> str:  # fmt: skip
    """Everything the loaded data follows from: the trainer's code and config (its defaults are
    code), numpy, the Prometheus that wrote the blocks, the runs asked for, the families loaded
    and the stamps' shift."""
    import numpy

    parts = {
        "format": CACHE_FORMAT, "seeds": seeds, "incidents": list(incidents), "precision": precision,
        "families": sorted(families), "numpy": numpy.__version__,
        "prometheus": _identity(prometheus),
        "shift_ms": GRID_PHASE_MS, "start": DEFAULT_START, **({"ranks": ranks} if ranks > 1 else {}),
        **({"strengths": strengths.spec} if strengths else {}),
    }  # fmt: skip
    sources = [
        *Path(trainer.__file__).parent.glob("*.py"),
        *Path(exporter.__file__).parent.glob("*metrics.py"),  # the names written
        Path(remote_write.__file__),  # how they are loaded
    ]
    return key_of(parts, sources)


def _identity(tool: str) -> list:
    """A binary as a cache key knows it: its path, size and modification time."""
    found = Path(tool).resolve().stat()
    return [tool, found.st_size, found.st_mtime_ns]


def _train_and_load(
    seeds: list[int], incidents: tuple[str, ...], tmpdir: Path, families: set[str], prometheus: str, workers: int,
    precision: str, progress: Progress, ranks: int = 1, strengths: Strengths | None = None,
) -> tuple[list[dict], int]:  # fmt: skip
    """Steps 1-2: every seed x incident trained in parallel chunks, pushed into a loading
    Prometheus, and written out as a block into tmpdir/data."""
    n_chunks = max(1, min(len(seeds), 2 * workers))
    chunks = [seeds[i::n_chunks] for i in range(n_chunks)]
    loader = _loader(prometheus, tmpdir)
    meta, samples = [], 0
    with loader.running(), _processes(workers) as pool:
        jobs = [(c, incidents, loader.base, families, precision, ranks, strengths) for c in chunks]
        for i, (m, n) in enumerate(pool.map(_simulate_chunk, jobs), 1):
            meta += m
            samples += n
            progress(f"trained and loaded {i}/{n_chunks} chunks ({len(meta)} runs)", done=i == n_chunks)
        _snapshot(loader, tmpdir / "data")
    return meta, samples


def _worker_start(parent: int) -> None:
    """A worker's Ctrl-C is its parent's to handle: the parent stops it (_processes), with a
    SIGTERM that ends it quietly (not the parent's handler, inherited by the fork, which turned
    it into a KeyboardInterrupt and a traceback on the learner's terminal). Its parent's death, a
    kill -9 included, ends it (die_with_parent)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent)


@contextlib.contextmanager
def _processes(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A process pool whose workers a Ctrl-C stops at once. The terminal's Ctrl-C reaches every
    worker too; one interrupted mid-task broke the pool, and its shutdown once waited over 60 s."""
    pool = ProcessPoolExecutor(workers, initializer=_worker_start, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        workers_now = list((pool._processes or {}).values())  # noqa: SLF001 (no public way before 3.14)
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers_now:
            proc.terminate()
        for proc in workers_now:
            proc.join(5)
        raise
    pool.shutdown(wait=True)


def _server(prometheus: str, tmpdir: Path, name: str, data: str, start: float, end: float, *flags: str) -> Throwaway:
    """One of the backtest's own Prometheus servers: loopback, a free port, no scrape config
    (tmpdir/name.yml), its TSDB in tmpdir/data and its log in tmpdir/name.log."""
    port = free_port()
    (tmpdir / f"{name}.yml").write_text("global: {}\n")
    argv = prometheus_argv(
        prometheus, tmpdir / f"{name}.yml", tmpdir / data, port, f"--storage.tsdb.retention.time={RETENTION}", *flags
    )
    return Throwaway(tmpdir, argv, f"http://{LOOPBACK}:{port}", start, end, name=name, tsdb=data)


def _loader(prometheus: str, tmpdir: Path) -> Throwaway:
    """A Prometheus that takes the runs' samples over remote write (runwatch.remote_write); it
    evaluates nothing, so its grid is empty."""
    flags = ("--web.enable-remote-write-receiver", "--web.enable-admin-api")  # the admin API for its snapshot
    return _server(prometheus, tmpdir, "loader", "loader", DEFAULT_START, DEFAULT_START, *flags)


def _snapshot(loader: Throwaway, data: Path) -> None:
    """The loader's head, written out as TSDB blocks, moved into data."""
    resp = requests.post(f"{loader.base}/api/v1/admin/tsdb/snapshot", timeout=BACKFILL_TIMEOUT_S)
    if resp.status_code != 200:
        raise RuntimeError(f"Prometheus could not snapshot the loaded runs ({resp.status_code}): {resp.text[:300]}")
    taken = Path(loader.data) / "snapshots" / resp.json()["data"]["name"]
    data.mkdir(exist_ok=True)
    for block in taken.iterdir():
        block.rename(data / block.name)


def _throwaway(prometheus: str, tmpdir: Path, meta: list[dict]) -> Throwaway:
    """The Prometheus the alerts are read from, over tmpdir/data, and its grid."""
    # up to 1 to 2 s past the last run's end on the lab clock, in the runs' shifted time
    end = float(int(max(m["end"] for m in meta)) + 2) - GRID_PHASE_MS / 1000
    return _server(prometheus, tmpdir, "prometheus", "data", DEFAULT_START, end, f"--query.lookback-delta={LOOKBACK}")


def _backfill(prom: Throwaway, passes: list[list[dict]], progress: Progress) -> None:
    """Step 3's fallback: the recordings that are not inlined, pass by pass on the grid. Each
    rule's expression is evaluated on the grid's whole seconds, where the inlined subqueries
    evaluate, and loaded as a block beside the runs, the way the runs are loaded. (promtool's
    `create-blocks-from rules` would evaluate at its group's phase, a hash of the group's name
    and file that changes between Prometheus versions.)"""
    for i, level in enumerate(passes, 1):
        progress(f"backfilling {len(level)} rules (pass {i}/{len(passes)})")
        with prom.running():
            found = [(rule, query_range(prom.base, rule["expr"], prom.start, prom.end)) for rule in level]
        body, _ = write_request(
            (rule["record"], sorted({**_labels(s["metric"]), **rule.get("labels", {})}.items()),
             [float(v) for _, v in s["values"]], [round(float(t) * 1000) for t, _ in s["values"]])
            for rule, result in found for s in result
        )  # fmt: skip
        flags = ("--web.enable-remote-write-receiver", "--web.enable-admin-api")
        loader = _server(prom.argv[0], prom.tmpdir, f"record{i}", f"record{i}", prom.start, prom.start, *flags)
        with loader.running():
            push(loader.base, body)
            _snapshot(loader, Path(prom.data))


def _labels(metric: dict) -> dict[str, str]:
    """A result's labels, as a recording rule keeps them (without the metric name)."""
    return {k: v for k, v in metric.items() if k != "__name__"}


def _read_alerts(
    prom: Throwaway,
    rules: Rules,
    conditions: list[str],
    run_ids: set[str],
    progress: Progress,
    kept: Kept | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, int], dict[str, dict[float, int]], dict[str, dict[str, set[str]]]]:
    """Steps 4-5: each alert on the grid, and each run's step at the evaluations where one first fired.

    Returns (run -> alert -> first firing time, alert -> firing series of no run, run -> time -> step,
    run -> alert -> the `rank` labels of its series that fired first). `kept`: alert results of
    earlier backtests on the same runs, read instead of evaluated (and the new ones kept).
    """
    first: dict[str, dict[str, float]] = {run: {} for run in run_ids}
    began: dict[str, dict[str, int]] = {run: {} for run in run_ids}  # how often each alert began to fire
    named: dict[str, dict[str, set[str]]] = {run: {} for run in run_ids}  # the ranks firing first
    unattributed: dict[str, int] = {}

    def firing(i: int) -> list[dict]:
        """Each series that fired, with the first evaluation it fired at."""
        rule, query = rules.alerting[i], firing_query(conditions[i], rules.alerting[i])
        found = kept.get(query) if kept is not None else None
        what = f"reading {rule['alert']}" + (" from the cache" if found is not None else "")
        progress(f"{what} ({i + 1}/{len(rules.alerting)})", done=i + 1 == len(rules.alerting))
        if found is None:
            found = [{"metric": s["metric"], "at": s["values"][0][0], "began": _began(s["values"])}
                     for s in query_range(prom.base, query, prom.start, prom.end)]  # fmt: skip
            if kept is not None:
                kept.put(query, found)
        return found

    # Prometheus evaluates the queries in parallel, all at once: each query takes one core, and
    # the costliest do not wait for a thread. Prometheus stops first on the way out, so that a
    # Ctrl-C does not wait for the queries in flight.
    with ThreadPoolExecutor(max(1, min(len(conditions), MAX_QUERIES))) as pool, prom.running():
        for rule, found in zip(rules.alerting, pool.map(firing, range(len(conditions))), strict=True):
            for series in found:
                run = run_of(series["metric"], run_ids)
                if run is None:
                    unattributed[rule["alert"]] = unattributed.get(rule["alert"], 0) + 1
                    continue
                t, alert = float(series["at"]), rule["alert"]
                began[run][alert] = began[run].get(alert, 0) + series["began"]
                if alert not in first[run] or t < first[run][alert]:
                    first[run][alert], named[run][alert] = t, set()
                if t == first[run][alert] and "rank" in series["metric"]:
                    named[run][alert].add(series["metric"]["rank"])
        # every run's step on the grid points from the first first-firing to the last one: its
        # last step, also while a job is down and restarts (trainer.faults)
        fired = [t for alerts in first.values() for t in alerts.values()]
        steps = query_range(prom.base, f"last_over_time({STEP}[1m])", min(fired), max(fired)) if fired else []
        step_at = {s["metric"].get("run_id"): {float(t): int(float(v)) for t, v in s["values"]} for s in steps}
    return first, unattributed, step_at, named, began


def _began(values: list) -> int:
    """How many times a firing series began: its evaluations, 1 s apart, in unbroken stretches.
    Each is a page Alertmanager would send (a resolved alert that fires again pages again)."""
    times = [round(float(t)) for t, _ in values]
    return 1 + sum(b - a > 1 for a, b in zip(times, times[1:], strict=False)) if times else 0


def backtest(
    seeds: list[int],
    rules_dir: Path,
    incidents: tuple[str, ...] = signatures.INCIDENTS,
    workers: int | None = None,
    progress: Progress | None = None,
    precision: str = "fp64",
    cache: DataCache | None = None,
    inline: bool = True,
    ranks: int = 1,
    schedule: Schedule | None = None,
    strengths: Strengths | None = None,
    edit: Callable[[Rules], Rules] | None = None,
) -> Result:
    """The backtest; `cache` keeps the loaded runs between calls (None: train afresh),
    `inline=False` backfills every recording rule first, as the backtest used to, `ranks`
    trains every run data-parallel over that many ranks, with their series, and `schedule`
    evaluates the groups in a live lab's order (Schedule.of_lab; None: every recording fresh).
    `strengths` draws each incident run's strength (None: the plate's, 1); `edit` adds to the
    rules read (runwatch.backtest.sweep's variants of one alert), evaluated beside them."""
    progress = progress or Progress()
    promtool, prometheus = binary("promtool"), binary("prometheus")
    rules = (edit or (lambda r: r))(load_rules(rules_dir, promtool))
    workers = workers or os.cpu_count() or 1
    timings: dict[str, float] = {}
    families = families_read(rules)
    key = cache_key(seeds, incidents, precision, families, prometheus, ranks, strengths) if cache is not None else ""
    with tempfile.TemporaryDirectory(prefix="runwatch-backtest-") as tmp:
        t0 = time.perf_counter()
        meta, samples, cached = _load(seeds, incidents, Path(tmp), families, prometheus, workers, precision,
                                      progress, cache, key, ranks, strengths)  # fmt: skip
        timings["train_and_load"] = time.perf_counter() - t0
        prom = _throwaway(prometheus, Path(tmp), meta)
        how = plan(rules, prom.start, inline, schedule)
        t0 = time.perf_counter()
        _backfill(prom, how.passes, progress)
        timings["backfill_rules"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        alerts = list(dict.fromkeys(r["alert"] for r in rules.alerting))
        kept = None
        if cache is not None:
            grid = {"format": RESULTS_FORMAT, "start": prom.start, "end": prom.end, "lookback": LOOKBACK,
                    "prometheus": _identity(prometheus), "promtool": _identity(promtool),
                    "backfilled": how.passes}  # fmt: skip
            kept = Kept(cache, key, grid)
        first, unattributed, step_at, named, began = _read_alerts(
            prom, rules, how.conditions, {m["run_id"] for m in meta}, progress, kept
        )
        timings["alerts"] = time.perf_counter() - t0

    runs = _runs(meta, alerts, first, step_at, began, named, ranks)
    return Result(runs, unattributed, alerts, timings, samples, cached, ranks)


def _runs(
    meta: list[dict], alerts: list[str], first: dict, step_at: dict, began: dict, named: dict, ranks: int
) -> list[dict]:
    """Each run's readouts, in the table's order: its first fire of each alert (a step; a fault's
    seconds after it too), how often each began to fire, and for ranks the ranks named."""
    runs = []
    for m in sorted(meta, key=lambda m: (ALL_INCIDENTS.index(m["incident"]), m["seed"])):
        fires = first[m["run_id"]]
        steps = {a: (step_at[m["run_id"]][fires[a]] if a in fires else None) for a in alerts}
        run = {**{k: m[k] for k in ("incident", "seed", "run_id")}, "strength": m.get("strength", 1.0),
               "seconds": round(m["end"] - DEFAULT_START + GRID_PHASE_MS / 1000, 3), "first_fire": steps,
               "began": {a: began[m["run_id"]].get(a, 0) for a in alerts}}  # fmt: skip
        if "fault_at" in m:  # no step ends while a job stalls or restarts: seconds from the fault
            run["after_fault"] = {a: round(fires[a] - m["fault_at"], 1) if a in fires else None for a in alerts}
        if ranks > 1:  # which ranks each alert named when it first fired
            run["named_ranks"] = {a: sorted(r, key=int) for a, r in named[m["run_id"]].items() if r}
        runs.append(run)
    return runs


# --- reporting ---


def readout(run: dict, alert: str) -> float | None:
    """When an alert first fired in a run: its step, or for a fault, seconds from the fault."""
    return run["after_fault"][alert] if "after_fault" in run else run["first_fire"][alert]


def summarise(result: Result) -> dict:
    """Per incident and alert: how many runs fired and where; signature matches; false alarms."""
    summary: dict = {
        "incidents": {},
        "false_alarms": [],  # fired where the plate says the alert stays silent
        "off_steps": [],  # fired, but outside the plate's steps
        "missed": [],  # never fired where the plate says it does
        "unattributed_firings": result.unattributed,
    }
    for incident in ALL_INCIDENTS:
        runs = [r for r in result.runs if r["incident"] == incident]
        if not runs:
            continue
        cells = {}
        for alert in result.alerts:
            steps = [readout(r, alert) for r in runs if readout(r, alert) is not None]
            expect = signatures.expectation(incident, alert)
            cells[alert] = {
                "fired": len(steps),
                "runs": len(runs),
                "median": statistics.median(steps) if steps else None,
                "min": min(steps) if steps else None,
                "max": max(steps) if steps else None,
                "plate": signatures.PLATE_READOUTS.get(incident, {}).get(alert),
                "expect": expect.describe() if expect else None,
                "met": sum(expect.met(readout(r, alert)) for r in runs) if expect else None,
            }
        matched = sum(
            all(e.met(readout(r, a)) for a, e in signatures.signature(incident).items() if a in result.alerts)
            and all(r["first_fire"][a] is None for a in result.alerts if incident == "none")
            for r in runs
        )
        summary["incidents"][incident] = {"runs": len(runs), "signature_matched": matched, "alerts": cells}
        if incident in signatures.CLUSTER_INCIDENTS and incident not in signatures.FAULTS:  # a straggler's rank
            summary["incidents"][incident]["named_right_rank"] = named_right_rank(result, runs)
        for r in runs:
            for alert in r["first_fire"]:
                step, expect = readout(r, alert), signatures.expectation(incident, alert)
                if expect is None or expect.met(step):
                    continue
                kind = "missed" if step is None else "off_steps" if expect.fires else "false_alarms"
                summary[kind].append(
                    {
                        "incident": incident,
                        "seed": r["seed"],
                        "alert": alert,
                        "step": step,
                        "expected": expect.describe(),
                    }
                )
    summary["lead_over_loss_alert"] = leads(result)
    summary["seconds"] = {k: round(v, 1) for k, v in result.seconds.items()}
    summary["samples"] = result.samples
    return summary


LOSS_ALERT = "TrainingLossJump"


def named_right_rank(result: Result, runs: list[dict]) -> dict[str, int]:
    """Per alert that names a rank: in how many of a cluster incident's runs it first fired
    naming the rank the incident struck, and only that rank."""
    out = {}
    for alert in RANK_ALERTS:
        if alert in result.alerts:
            struck = [str(struck_rank(TrainConfig(seed=r["seed"], incident=r["incident"], ranks=result.ranks)))
                      for r in runs]  # fmt: skip
            out[alert] = sum(r.get("named_ranks", {}).get(alert) == [s] for r, s in zip(runs, struck, strict=True))
    return out


def leads(result: Result) -> dict:
    """For alerts the plate does not name: in each incident, how many steps before
    TrainingLossJump they first fired (negative: after), over runs where both fired."""
    out: dict = {}
    others = [a for a in result.alerts if a not in (*signatures.ALERTS, *CLUSTER_ALERTS, "TrainerDown")]
    for incident in (i for i in ALL_INCIDENTS if i not in signatures.FAULTS):  # a fault's readouts are not steps
        runs = [r for r in result.runs if r["incident"] == incident]
        for alert in others:
            both = [r for r in runs if r["first_fire"][alert] is not None and r["first_fire"][LOSS_ALERT] is not None]
            fired = sum(r["first_fire"][alert] is not None for r in runs)
            if not fired:
                continue
            lead = [r["first_fire"][LOSS_ALERT] - r["first_fire"][alert] for r in both]
            out.setdefault(incident, {})[alert] = {
                "fired": fired,
                "runs": len(runs),
                "median_lead": statistics.median(lead) if lead else None,
                "min_lead": min(lead) if lead else None,
                "max_lead": max(lead) if lead else None,
            }
    return out


def _cell(c: dict, target: bool = False) -> str:
    if not c["fired"]:
        ours = "-"
    elif c["min"] == c["max"]:
        ours = f"{c['median']:g}"
    else:
        ours = f"{c['median']:g} ({c['min']}-{c['max']})"
    if c["fired"] not in (0, c["runs"]):
        ours += f" {c['fired']}/{c['runs']}"
    if target:  # a fault's target, in seconds: "10-15", or "silent"
        plate_ = (c["expect"] or "-").removeprefix("fires in ").removeprefix("fires at ")
    else:
        plate_ = "-" if c["plate"] is None else str(c["plate"])
    return f"{ours} [{plate_}]"


def _table(title: str, incidents: dict, alerts: list[str], target: bool) -> list[str]:
    cells = {i: [_cell(inc["alerts"][a], target) for a in alerts] for i, inc in incidents.items()}
    # each column as wide as its widest cell, and two spaces between columns whatever they hold
    widths = [max(len(a), *(len(row[j]) for row in cells.values())) + 2 for j, a in enumerate(alerts)]
    lines = [title, ""]
    lines.append("incident".ljust(16) + "".join(a.ljust(w) for a, w in zip(alerts, widths, strict=True)) + "signature")
    for incident, inc in incidents.items():
        row = incident.ljust(16) + "".join(c.ljust(w) for c, w in zip(cells[incident], widths, strict=True))
        lines.append(row + f"{inc['signature_matched']}/{inc['runs']}")
    return lines + [""]


def _when(finding: dict) -> str:
    if finding["step"] is None:
        return "never"
    if finding["incident"] in signatures.FAULTS:
        return f"{finding['step']} s after the fault"
    return f"at step {finding['step']}"


def report(summary: dict, alerts: list[str]) -> str:
    """The readout table: first-fire step, median (range) over seeds, the plate's in brackets;
    for the faults, a second table in seconds from the fault, the target in brackets."""
    steps = {i: inc for i, inc in summary["incidents"].items() if i not in signatures.FAULTS}
    faults = {i: inc for i, inc in summary["incidents"].items() if i in signatures.FAULTS}
    lines = _table("first-fire step: median (min-max) over seeds [the plate's readout]", steps, alerts, False)
    if faults:
        title = "seconds from the fault to the first fire: median (min-max) over seeds [the target]"
        lines += _table(title, faults, alerts, True)
    for kind, title in [
        ("false_alarms", "false alarms (fired where the plate says silent)"),
        ("off_steps", "off the plate's steps"),
        ("missed", "missed (never fired where the plate says it does)"),
    ]:
        found = summary[kind]
        lines.append(f"{title}: {len(found)}")
        lines += [f"  {f['incident']} seed {f['seed']}: {f['alert']} {_when(f)} ({f['expected']})" for f in found]
    lead = summary.get("lead_over_loss_alert", {})
    if lead:
        lines.append("steps before TrainingLossJump that the other alerts first fire (negative: after):")
        for incident, alerts in lead.items():
            for alert, c in alerts.items():
                spread = "" if c["min_lead"] == c["max_lead"] else f" ({c['min_lead']} to {c['max_lead']})"
                lines.append(
                    f"  {incident:15s} {alert:20s} median {c['median_lead']}{spread}, fired in {c['fired']}/{c['runs']}"
                )
    for incident, inc in summary["incidents"].items():
        for alert, n in inc.get("named_right_rank", {}).items():
            lines.append(f"{incident}: {alert} named the struck rank, and only it, in {n}/{inc['runs']} runs")
    for alert, n in summary["unattributed_firings"].items():
        lines.append(f"  {alert}: {n} firing series carry no run_id or instance (rule aggregates them away)")
    return "\n".join(lines)


# --- command line ---


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("--seeds", default="100-199", help="seeds to run, e.g. 0-99 or 1,2,5-7 (default 100-199)")
    p.add_argument("--rules", type=Path, default=None, help="rules directory (default prometheus/rules)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument(
        "--incidents", default=None,
        help="comma-separated incidents (default: the plate's five, and the cluster's with --ranks)",
    )  # fmt: skip
    p.add_argument(
        "--ranks", type=number(int, 1, MAX_RANKS), default=1, help="train every run data-parallel over N ranks"
    )
    p.add_argument(
        "--workers", type=number(int, 1, 64), default=None, help="training processes (default: one per core)"
    )
    p.add_argument("--precision", choices=("fp64", "fp16"), default="fp64", help="train the runs in this precision")
    p.add_argument(
        "--lab", metavar="URL", default=None,
        help="evaluate the rule groups in the order this lab's Prometheus evaluates them after its trainer's scrape "
        "(e.g. http://127.0.0.1:9090; default: every recording read fresh)",
    )  # fmt: skip
    p.add_argument(
        "--strengths", default=None, metavar="LO-HI|S1,S2,...",
        help="draw each incident run's strength from this range (e.g. 0.05-1) or list; the table then reads by "
        "strength band (default: every incident at the plate's strength, 1)",
    )  # fmt: skip
    p.add_argument(
        "--sweep", default=None, metavar="ALERT=V1,V2,...",
        help="also evaluate ALERT at each of these thresholds (ALERT=2,2.5,3 or ALERT=2-5:0.5), or for: values "
        "(ALERT.for=0s,10s,20s), on the same runs, and print the trade-off",
    )  # fmt: skip
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="with --sweep, draw the trade-off here")
    p.add_argument(
        "--edit-of", type=Path, default=None, metavar="RULES_DIR",
        help="with --sweep: --rules are an edit of the rules in RULES_DIR (those in force); the sweep's alert as "
        "they write it is evaluated beside the edit, and the trade-off marks the edit and the rule in force",
    )  # fmt: skip
    p.add_argument(
        "--no-cache", action="store_true", help="train and load the runs afresh, and keep nothing in the cache"
    )
    p.add_argument(
        "--cache-max-mb", type=number(int, 1, 1 << 20), default=CACHE_MAX_MB,
        help=f"the cache's size cap in MB, least recently used entries first out (default {CACHE_MAX_MB})",
    )  # fmt: skip
    return run


def _written(rules_dir: Path) -> list[dict]:
    """Every rule of a rules folder's files, as written (bounded, no aliases: issue 40)."""
    return [r for f in Layout().rule_files(rules_dir) for g in (load_yaml(f, "a rule file") or {}).get(
        "groups", []) for r in g.get("rules", [])]  # fmt: skip


def _workbench_report(
    summary: dict, result: Result, in_force: Result, rules_dir: Path, strengths: Strengths | None,
    swept: workbench.Sweep | None, plot: Path | None, edit_of: Path | None = None,
) -> None:  # fmt: skip
    """--strengths' table by band and --sweep's trade-off (runwatch.backtest.sweep), printed and
    kept in the summary; --plot's figure."""
    if strengths is not None:
        summary["by_strength"] = workbench.catches(in_force, strengths, in_force.alerts)
        print("\n" + workbench.catches_table(summary["by_strength"], in_force.alerts))
    if swept is None:
        return
    current = workbench.in_force(_written(rules_dir), swept)
    forced = None if edit_of is None else workbench.in_force(_written(edit_of), swept)
    rows = workbench.trade_off(result, swept, strengths, current, forced)
    title, cells = workbench.sweep_cells(rows, swept)
    summary["sweep"] = {"alert": swept.alert, "field": swept.field, "values": list(swept.values), "rows": rows,
                        "table": {"title": title, "rows": cells}}  # fmt: skip
    print("\n" + workbench.sweep_table(rows, swept))
    if plot is not None:
        workbench.plot(rows, swept, plot)
        print(f"backtest: wrote the trade-off to {plot}", file=sys.stderr)


def _sweep_edit(swept: workbench.Sweep | None, edit_of: Path | None) -> Callable[[Rules], Rules] | None:
    """The rules' edit a sweep makes: its variants, and with --edit-of the rule in force beside them."""
    if swept is None:
        return None
    variants = workbench.variants(swept)
    if edit_of is None:
        return variants
    beside = workbench.with_in_force(swept, _written(edit_of))
    return lambda rules: beside(variants(rules))


def run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    default = signatures.INCIDENTS + (signatures.CLUSTER_INCIDENTS if args.ranks > 1 else ())
    incidents = tuple(i.strip() for i in (args.incidents or ",".join(default)).split(",") if i.strip())
    unknown = [i for i in incidents if i not in ALL_INCIDENTS]
    if unknown:
        raise UsageError(f"--incidents: unknown incident {unknown[0]!r}; choose from {', '.join(ALL_INCIDENTS)}")
    cluster = [i for i in incidents if i in signatures.CLUSTER_INCIDENTS]
    if cluster and args.ranks == 1:
        raise UsageError(f"--incidents: {cluster[0]} is a cluster incident: it needs --ranks 2 or more")
    try:
        TrainConfig(ranks=args.ranks, precision=args.precision).validate()
    except ConfigError as err:
        raise config_error(err) from None
    rules_dir = args.rules or Layout().rules_dir
    if not rules_dir.is_dir():
        raise UsageError(f"--rules: {rules_dir} is not a directory")
    if args.json is not None:
        check_writable(args.json, "--json")
    strengths = None if args.strengths is None else parse_strengths(args.strengths)
    swept = None if args.sweep is None else workbench.parse_sweep(args.sweep)
    if args.edit_of is not None and (swept is None or not args.edit_of.is_dir()):
        why = "compares a sweep's alert: give --sweep too" if swept is None else f"{args.edit_of} is not a directory"
        raise UsageError(f"--edit-of: {why}")
    if args.plot is not None:
        if swept is None:
            raise UsageError("--plot: draws a sweep's trade-off: give --sweep too")
        if args.plot.suffix.lower() != ".png":
            raise UsageError(f"--plot: writes a PNG, name it FILE.png, got {args.plot}")
        check_writable(args.plot, "--plot")
    # SIGTERM as well as Ctrl-C unwinds through the finally blocks that stop Prometheus.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.perf_counter()
    schedule = None if args.lab is None else Schedule.of_lab(args.lab.rstrip("/"), PORTS["trainer"])
    if schedule is not None:
        order = ", ".join(f"{g} {t:.3f} s" for g, t in sorted(schedule.after_scrape.items(), key=lambda i: i[1]))
        print(f"backtest: the lab's groups evaluate after its trainer's scrape: {order}", file=sys.stderr)
        for group in sorted(schedule.racing):
            print(f"backtest: {group} evaluates while the trainer's scrape is in flight: in the lab its readouts "
                  "may be a step later than here", file=sys.stderr)  # fmt: skip
    cache = None if args.no_cache else DataCache(default_root(), args.cache_max_mb << 20)
    result = backtest(
        seeds, rules_dir, incidents, args.workers, precision=args.precision, cache=cache, ranks=args.ranks,
        schedule=schedule, strengths=strengths, edit=_sweep_edit(swept, args.edit_of),
    )  # fmt: skip
    wall = time.perf_counter() - t0
    extra = set(swept.names) | {f"{swept.alert}@{workbench.IN_FORCE}"} if swept else set()
    in_force = dataclasses.replace(result, alerts=[a for a in result.alerts if a not in extra])
    summary = summarise(in_force)
    summary["seconds"]["total"] = round(wall, 1)
    print(report(summary, in_force.alerts))
    _workbench_report(summary, result, in_force, rules_dir, strengths, swept, args.plot, args.edit_of)
    over = f" over {args.ranks} ranks" if args.ranks > 1 else ""
    print(f"\n{len(result.runs)} {args.precision} runs{over} ({len(seeds)} seeds x {len(incidents)} incidents), "
          f"{result.samples:,} samples{' (from the cache)' if result.cached else ''}, in {wall:.1f}s")  # fmt: skip
    if args.json is not None:
        doc = {"runs": in_force.runs, "summary": summary}
        write_atomic(args.json, json.dumps(doc, indent=1) + "\n")
    return 0
