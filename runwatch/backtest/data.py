"""Stage 3 of the backtest: the runs' data, in a throwaway Prometheus the evaluation reads.

    meta, samples, cached = load(seeds, incidents, tmpdir, families, prometheus, workers, "fp64", progress,
                                 cache, cache_key(seeds, incidents, "fp64", families, prometheus))
    prom = throwaway(prometheus, tmpdir, meta)   # prom.base, prom.start, prom.end, prom.running()

Every seed x incident is trained offline, all runs of a chunk of seeds as one batched numpy
computation (trainer.batch: bit for bit the runs `runwatch train --offline` writes), in a pool
of processes a Ctrl-C stops at once. Each chunk's samples are pushed into a loading Prometheus
over remote write (remote_write.py), whose snapshot writes them out as a TSDB block. The block is
cached (datacache.py): a backtest of the same runs, under edited rules, starts from it.

The runs are stamped GRID_PHASE_MS before the lab clock, so that the grid's whole seconds are the
live lab's scrapes. Imports the rules and the plan of the stages; never the evaluation or the
report.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from runwatch import exporter, trainer
from runwatch.backtest import remote_write, signatures
from runwatch.backtest.datacache import DataCache, key_of
from runwatch.backtest.plan import LOOKBACK, Strengths
from runwatch.backtest.remote_write import push, write_request
from runwatch.core.names import LOOPBACK
from runwatch.prom.server import Process, die_with_parent, free_port, prometheus_argv
from runwatch.trainer.batch import train_columns
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.live import SCRAPE_PHASE
from runwatch.trainer.offline import DEFAULT_START, OfflineRun, series

# A load, snapshot or backfill that runs past this is hung, not slow: 500 runs load in about 8 s here.
BACKFILL_TIMEOUT_S = 900
RETENTION = "100y"  # the runs are stamped in 2026-01; a short retention would delete them
# Rules are evaluated on whole seconds (subqueries align to them), each one a scrape of the live
# lab. The runs are stamped this many ms earlier than the lab clock, so that a whole second falls
# where the live lab's scrapes fall on its clock: SCRAPE_PHASE into each lab second (trainer.live).
GRID_PHASE_MS = round(SCRAPE_PHASE * 1000)
# Runs in one remote-write request: about 2 MB of one rank's runs, 20 MB of eight ranks'.
PUSH_RUNS = 25
# The data's cache: bump when what an entry holds changes meaning.
CACHE_FORMAT = 3


class Progress:
    """The backtest's progress on stderr, one line a step (rewritten in place on a terminal)."""

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


def load(
    seeds: list[int], incidents: tuple[str, ...], tmpdir: Path, families: set[str], prometheus: str, workers: int,
    precision: str, progress: Progress, cache: DataCache | None, key: str, ranks: int = 1,
    strengths: Strengths | None = None,
) -> tuple[list[dict], int, bool]:  # fmt: skip
    """The runs trained and loaded (train_and_load), or their cached result (entry `key`): (the
    runs' metadata, samples loaded, from the cache)."""
    if cache is not None:
        found = cache.get(key, tmpdir / "data")
        if found is not None:
            progress(f"loaded {len(found['runs'])} runs from the cache ({cache.root / key})")
            return found["runs"], found["samples"], True
    meta, samples = train_and_load(
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
        "prometheus": identity(prometheus),
        "shift_ms": GRID_PHASE_MS, "start": DEFAULT_START, **({"ranks": ranks} if ranks > 1 else {}),
        **({"strengths": strengths.spec} if strengths else {}),
    }  # fmt: skip
    sources = [
        *Path(trainer.__file__).parent.glob("*.py"),
        *Path(exporter.__file__).parent.glob("*metrics.py"),  # the names written
        Path(remote_write.__file__),  # how they are loaded
    ]
    return key_of(parts, sources)


def identity(tool: str) -> list:
    """A binary as a cache key knows it: its path, size and modification time."""
    found = Path(tool).resolve().stat()
    return [tool, found.st_size, found.st_mtime_ns]


def train_and_load(
    seeds: list[int], incidents: tuple[str, ...], tmpdir: Path, families: set[str], prometheus: str, workers: int,
    precision: str, progress: Progress, ranks: int = 1, strengths: Strengths | None = None,
) -> tuple[list[dict], int]:  # fmt: skip
    """Every seed x incident trained in parallel chunks, pushed into a loading
    Prometheus, and written out as a block into tmpdir/data."""
    n_chunks = max(1, min(len(seeds), 2 * workers))
    chunks = [seeds[i::n_chunks] for i in range(n_chunks)]
    loader = loading_server(prometheus, tmpdir)
    meta, samples = [], 0
    with loader.running(), _processes(workers) as pool:
        jobs = [(c, incidents, loader.base, families, precision, ranks, strengths) for c in chunks]
        for i, (m, n) in enumerate(pool.map(_simulate_chunk, jobs), 1):
            meta += m
            samples += n
            progress(f"trained and loaded {i}/{n_chunks} chunks ({len(meta)} runs)", done=i == n_chunks)
        snapshot(loader, tmpdir / "data")
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


def server(prometheus: str, tmpdir: Path, name: str, data: str, start: float, end: float, *flags: str) -> Throwaway:
    """One of the backtest's own Prometheus servers: loopback, a free port, no scrape config
    (tmpdir/name.yml), its TSDB in tmpdir/data and its log in tmpdir/name.log."""
    port = free_port()
    (tmpdir / f"{name}.yml").write_text("global: {}\n")
    argv = prometheus_argv(
        prometheus, tmpdir / f"{name}.yml", tmpdir / data, port, f"--storage.tsdb.retention.time={RETENTION}", *flags
    )
    return Throwaway(tmpdir, argv, f"http://{LOOPBACK}:{port}", start, end, name=name, tsdb=data)


def loading_server(prometheus: str, tmpdir: Path) -> Throwaway:
    """A Prometheus that takes the runs' samples over remote write (remote_write.py); it
    evaluates nothing, so its grid is empty."""
    flags = ("--web.enable-remote-write-receiver", "--web.enable-admin-api")  # the admin API for its snapshot
    return server(prometheus, tmpdir, "loader", "loader", DEFAULT_START, DEFAULT_START, *flags)


def snapshot(loader: Throwaway, data: Path) -> None:
    """The loader's head, written out as TSDB blocks, moved into data."""
    resp = requests.post(f"{loader.base}/api/v1/admin/tsdb/snapshot", timeout=BACKFILL_TIMEOUT_S)
    if resp.status_code != 200:
        raise RuntimeError(f"Prometheus could not snapshot the loaded runs ({resp.status_code}): {resp.text[:300]}")
    taken = Path(loader.data) / "snapshots" / resp.json()["data"]["name"]
    data.mkdir(exist_ok=True)
    for block in taken.iterdir():
        block.rename(data / block.name)


def throwaway(prometheus: str, tmpdir: Path, meta: list[dict]) -> Throwaway:
    """The Prometheus the alerts are read from, over tmpdir/data, and its grid."""
    # up to 1 to 2 s past the last run's end on the lab clock, in the runs' shifted time
    end = float(int(max(m["end"] for m in meta)) + 2) - GRID_PHASE_MS / 1000
    return server(prometheus, tmpdir, "prometheus", "data", DEFAULT_START, end, f"--query.lookback-delta={LOOKBACK}")
