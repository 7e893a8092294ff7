"""Watch your own training run: a few lines in any loop serve /metrics with the lab's own names.

`Watch` publishes what the lab's trainer publishes (exporter.metrics, exporter.rank_metrics), so
the lab's rules, pages, runbooks and console apply to your run as they are: the step, training
loss, held-out loss when you evaluate it, gradient norm, learning rate, tokens (a counter) and
tokens per second, step time; under torch.distributed each rank's compute and collective-wait
time and the time of its last step, and the job's restart count (torchrun's
TORCHELASTIC_RESTART_COUNT). `runwatch up --watch HOST:PORT` points the lab at it.

It depends on prometheus-client only (torch is yours: pass floats), writes no file and starts no
thread. `serve()` is the one call that starts one: prometheus_client's HTTP server, in a daemon
thread, on 127.0.0.1 at `port + LOCAL_RANK`. Not for a step you cannot afford a few
microseconds of Python in: `step()` stores plain numbers under a lock, and every series is built
when Prometheus scrapes (benchmarks/bench_watch.py).

    >>> w = Watch(run_id="my-run")
    >>> w.serve(8000)                 # the one thread it starts; or serve w.registry yourself
    >>> for step, (x, y) in enumerate(loader):
    ...     w.begin()                 # the step starts (optional: else it starts where the last ended)
    ...     loss = train_step(x, y)
    ...     w.step(step, loss.item(), tokens=x.numel(), gradient_norm=gn, learning_rate=lr)
"""

from __future__ import annotations

import bisect
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from runwatch.core.names import LOOPBACK, PORTS
from runwatch.exporter import metrics as m
from runwatch.exporter import rank_metrics as rm

DEFAULT_PORT = PORTS["trainer"]  # where the lab's own trainer serves; local rank r serves on DEFAULT_PORT + r

# From a millisecond step to the lab's one-second step (exporter.metrics's buckets among them).
STEP_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, *m.STEP_DURATION_BUCKETS, 10.0, 30.0)

# The lab's HELP, but where it describes the lab's own trainer.
HELP = {
    **m.HELP,
    m.LOSS: "Training loss of the last step, as the training loop reported it.",
    m.HELDOUT_LOSS: "Loss on held-out data, as last evaluated by the training loop.",
    m.GRADIENT_NORM: "L2 norm of the last step's gradient, as the training loop reported it.",
    m.TOKENS_PER_SECOND: "Tokens per second of the last step: its tokens over its wall-clock duration.",
    m.STEP_DURATION: "Wall-clock duration of each training step, in seconds.",
    m.RUN_INFO: "Constant 1, labelled with the run's id (seed and incident are the lab's; empty here).",
}


class WatchError(ValueError):
    """A value the client cannot publish; the message names the argument."""


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise WatchError(f"{name}: must be an integer, got {value!r}") from None


def default_run_id(env: Mapping[str, str], world_size: int) -> str:
    """RUNWATCH_RUN_ID, else torchrun's TORCHELASTIC_RUN_ID (every rank and restart of the job
    shares it), else, in one process, the script's name and its start (UTC HHMMSS)."""
    for name in ("RUNWATCH_RUN_ID", "TORCHELASTIC_RUN_ID"):
        if env.get(name) and env[name] != "none":
            return env[name]
    if world_size > 1:
        raise WatchError("run_id: ranks must share one; pass run_id= or set RUNWATCH_RUN_ID (torchrun sets its own)")
    return f"{Path(sys.argv[0] or 'python').stem}-{datetime.now(UTC):%H%M%S}"


class Watch(Collector):
    """One process of a training run, as the lab's Prometheus sees it.

    Rank, world size and local rank come from torch.distributed's environment (RANK,
    WORLD_SIZE, LOCAL_RANK: torchrun sets them) unless given. Rank 0 serves the job's training
    series, as the lab's trainer does; with a world of two or more every rank also serves its
    own (`rank`, `node` labels) for the cluster's rules. `node` defaults to the host name.
    """

    def __init__(
        self,
        run_id: str | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        node: str | None = None,
        registry: CollectorRegistry | None = None,
        env: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ):
        self.rank = (_env_int(env, "RANK") or 0) if rank is None else rank
        self.world_size = (_env_int(env, "WORLD_SIZE") or 1) if world_size is None else world_size
        self.local_rank = (_env_int(env, "LOCAL_RANK") or 0) if local_rank is None else local_rank
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise WatchError(f"rank: must be in [0, world_size), got rank {self.rank} of {self.world_size}")
        self.run_id = default_run_id(env, self.world_size) if run_id is None else run_id
        if not self.run_id:
            raise WatchError("run_id: must not be empty")
        self.node = node or socket.gethostname()
        self.distributed = self.world_size > 1
        self.restarts = _env_int(env, "TORCHELASTIC_RESTART_COUNT")
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._started_at, self._ended_at = wall(), None
        self._begun = self._last_end = clock()
        self._exchanged: float | None = None
        self._last: tuple | None = None  # step, loss, gradient norm, learning rate, tokens/s
        self._heldout: float | None = None
        self._tokens = 0
        self._buckets = [0] * (len(STEP_DURATION_BUCKETS) + 1)
        self._duration_sum = 0.0
        self._rank_last: tuple[float, float, float, float] | None = None  # compute, wait, step s, at (Unix)
        self._compute_total = self._wait_total = 0.0
        self._seq = 0
        self.scrapes = 0  # how many times the registry was collected: Prometheus's scrapes
        self.last_scrape: float | None = None  # when (on `clock`) the last one began
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    # --- serving: the one thread, and only when asked ---

    def serve(self, port: int = DEFAULT_PORT, host: str = LOOPBACK) -> int:
        """Serve /metrics on host:(port + local rank) with prometheus_client's HTTP server, in a
        daemon thread (it starts one); return the port. Serve `self.registry` yourself instead
        if your process already has a metrics server."""
        port += self.local_rank
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            raise WatchError(f"port: cannot serve on {host}:{port}: {err.strerror}") from None
        return port

    # --- the step: a few attribute writes under a lock ---

    def begin(self) -> None:
        """The step starts now. Without it a step starts where the previous one ended."""
        self._begun = self._clock()
        self._exchanged = None

    def exchange(self) -> None:
        """This rank has computed its gradient and enters the gradient exchange (all-reduce):
        the time since `begin` is its compute, the time from here to `step` its collective wait."""
        self._exchanged = self._clock()
        self._seq += 1

    def step(
        self,
        step: int,
        loss: float,
        *,
        tokens: int = 0,
        gradient_norm: float | None = None,
        learning_rate: float | None = None,
        steps: int = 1,
    ) -> None:
        """Publish a completed step (its number, loss, tokens, gradient norm, learning rate).

        `steps`: how many steps this call reports at once (a trainer that logs every N steps),
        its tokens theirs; the step-time histogram then counts their mean duration N times.
        """
        end = self._clock()
        begun = self._begun if self._begun > self._last_end else self._last_end
        seconds = end - begun
        if steps < 1:
            raise WatchError(f"steps: must be 1 or more, got {steps}")
        # plain floats now: a tensor kept until the scrape would keep its graph alive (or sync a GPU there)
        grad = None if gradient_norm is None else float(gradient_norm)
        lr = None if learning_rate is None else float(learning_rate)
        last = (step, float(loss), grad, lr, tokens / seconds if seconds > 0 else None)
        exchanged = self._exchanged
        with self._lock:
            self._last = last
            self._tokens += tokens
            self._buckets[bisect.bisect_left(STEP_DURATION_BUCKETS, seconds / steps)] += steps
            self._duration_sum += seconds
            if self.distributed:
                compute = (exchanged if exchanged is not None else end) - begun
                self._compute_total += compute
                self._wait_total += seconds - compute
                self._rank_last = (compute, seconds - compute, seconds, self._wall())
        self._last_end, self._exchanged = end, None

    def heldout(self, loss: float) -> None:
        """The held-out loss just evaluated; published with every step until the next one."""
        self._heldout = float(loss)

    def finish(self) -> None:
        """The run is over: its per-step values go stale in Prometheus, so alerts on them resolve."""
        with self._lock:
            self._ended_at = self._wall()

    # --- a scrape: every series, from one consistent copy ---

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self.scrapes += 1
            self.last_scrape = self._clock()
            last, tokens, ended = self._last, self._tokens, self._ended_at
            buckets, duration_sum, rank_last = list(self._buckets), self._duration_sum, self._rank_last
            compute_total, wait_total, seq = self._compute_total, self._wait_total, self._seq
        step = None if last is None else last[0]
        if self.rank == 0:
            yield from self._job(last, self._heldout, tokens, ended, buckets, duration_sum)
        if self.distributed:
            yield from self._own(step, rank_last, compute_total, wait_total, seq, ended)

    def _job(self, last, heldout, tokens, ended, buckets, duration_sum) -> Iterator[Metric]:
        run = [self.run_id]

        def family(kind, name: str, value: float, labels: list[str] = run, names: tuple = ("run_id",)):
            fam = kind(name, HELP.get(name) or rm.TOTAL_HELP[name], labels=list(names))
            fam.add_metric(labels, value)
            return fam

        yield family(GaugeMetricFamily, m.RUN_INFO, 1, [self.run_id, "", "none"], ("run_id", "seed", "incident"))
        yield family(GaugeMetricFamily, m.RUN_START, self._started_at)
        if ended is not None:
            yield family(GaugeMetricFamily, m.RUN_END, ended)
        yield family(CounterMetricFamily, m.TOKENS, tokens)
        if self.restarts is not None:
            yield family(CounterMetricFamily, rm.JOB_RESTARTS, self.restarts)
        hist = HistogramMetricFamily(m.STEP_DURATION, HELP[m.STEP_DURATION], labels=["run_id"])
        bounds = [str(b) for b in STEP_DURATION_BUCKETS] + ["+Inf"]
        hist.add_metric(run, list(zip(bounds, itertools.accumulate(buckets), strict=True)), duration_sum)
        yield hist
        if last is None:
            return
        yield family(GaugeMetricFamily, m.STEP, last[0])
        if ended is not None:
            return
        names = (m.LOSS, m.GRADIENT_NORM, m.LEARNING_RATE, m.TOKENS_PER_SECOND, m.HELDOUT_LOSS)
        for name, value in zip(names, (*last[1:], heldout), strict=True):
            if value is not None:
                yield family(GaugeMetricFamily, name, value)

    def _own(self, step, rank_last, compute_total, wait_total, seq, ended) -> Iterator[Metric]:
        labels, names = [self.run_id, str(self.rank), self.node], ("run_id", "rank", "node")

        def family(kind, name: str, value: float, help_text: str):
            fam = kind(name, help_text, labels=list(names))
            fam.add_metric(labels, value)
            return fam

        yield family(GaugeMetricFamily, rm.RANK_COLLECTIVE_SEQ, seq, rm.HELP[rm.RANK_COLLECTIVE_SEQ])
        yield family(CounterMetricFamily, rm.RANK_COMPUTE_TOTAL, compute_total, rm.TOTAL_HELP[rm.RANK_COMPUTE_TOTAL])
        yield family(CounterMetricFamily, rm.RANK_WAIT_TOTAL, wait_total, rm.TOTAL_HELP[rm.RANK_WAIT_TOTAL])
        if rank_last is None or step is None:
            return
        yield family(GaugeMetricFamily, rm.RANK_STEP, step, rm.HELP[rm.RANK_STEP])
        yield family(GaugeMetricFamily, rm.RANK_LAST_STEP_TIME, rank_last[3], rm.HELP[rm.RANK_LAST_STEP_TIME])
        if ended is not None:
            return
        compute, wait, seconds, _ = rank_last
        yield family(GaugeMetricFamily, rm.RANK_COMPUTE_SECONDS, compute, rm.HELP[rm.RANK_COMPUTE_SECONDS])
        yield family(GaugeMetricFamily, rm.RANK_WAIT_SECONDS, wait, rm.HELP[rm.RANK_WAIT_SECONDS])
        yield family(GaugeMetricFamily, rm.RANK_STEP_SECONDS, seconds, rm.HELP[rm.RANK_STEP_SECONDS])


def ddp_comm_hook(watch: Watch) -> tuple[object, Callable]:
    """(state, hook) for DistributedDataParallel.register_comm_hook: torch's own all-reduce that
    also tells `watch` when this rank enters the exchange, so its compute and collective wait
    are told apart. With several gradient buckets the first one marks the entry: the rest of the
    backward pass overlaps the exchange and counts as waiting.

        >>> ddp.register_comm_hook(*ddp_comm_hook(w))
    """
    import torch.distributed as dist  # the user's torch, imported only by who asks for the hook

    def hook(state: object, bucket):
        if watch._exchanged is None:
            watch.exchange()
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        fut = dist.all_reduce(tensor, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    return None, hook
