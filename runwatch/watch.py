"""Watch your own training run: a few lines in any loop serve /metrics with the lab's own names.

`Watch` publishes what the lab's trainer publishes (exporter.metrics, exporter.rank_metrics), so
the lab's rules, pages, runbooks and console apply to your run as they are: the step, training
loss, held-out loss when you evaluate it, gradient norm, learning rate, tokens (a counter) and
tokens per second, step time; under torch.distributed each rank's compute and collective-wait
time and the time of its last step, and the job's restart count (torchrun's
TORCHELASTIC_RESTART_COUNT). `runwatch up --watch HOST:PORT` points the lab at it.

It depends on prometheus-client only (torch is yours: pass floats), writes no file and starts no
thread. `serve()` is the one call that starts any: a bounded HTTP server on 127.0.0.1 at
`port + LOCAL_RANK` (one listening thread and at most WORKERS for scrapes), and it says on
stderr what it binds. Not for a step you cannot afford a few microseconds of Python in: `step()`
stores plain numbers under a lock, and every series is built when Prometheus scrapes
(benchmarks/bench_watch.py).

Pacing: the lab's rules count seconds, and Prometheus scrapes once a second. A job of
millisecond steps publishes about once a second: `begin()` every step (or only before the first
of each k), then `step(..., steps=k)` every k steps, with the mean loss of the k steps and their
gradient norms (the client publishes the largest: a spike in any of them is a spike). The
report's time runs from its first `begin()` (else from the last report's end) to its end, and
its tokens are all k steps'.

    >>> w = Watch(run_id="my-run")
    >>> w.serve(8000)                 # the one server it starts; or serve w.registry yourself
    >>> for step, (x, y) in enumerate(loader):
    ...     w.begin()                 # the step starts (optional: else it starts where the last ended)
    ...     loss = train_step(x, y)
    ...     w.step(step, loss.item(), tokens=x.numel(), gradient_norm=gn, learning_rate=lr)
    >>> w.finish()                    # the run is over: no TrainerDown when the process exits
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.server import HTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler
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


MAX_WHOLE = 2**53  # the largest whole number a float64 sample holds exactly: a step, a token count


def _whole(name: str, value: object, low: int = 0) -> int:
    """An int argument (an int, a numpy or 0-d tensor integer), in [low, 2**53], or a WatchError."""
    if type(value) is int:  # the common case first: this runs three times a step
        number = value
    else:
        try:
            if isinstance(value, bool):
                raise TypeError
            number = operator.index(value)
        except TypeError:
            raise WatchError(f"{name}: must be a whole number, got {value!r:.80}") from None
    if not low <= number <= MAX_WHOLE:
        raise WatchError(f"{name}: must be in [{low}, 2**53], got {number}")
    return number


def _real(name: str, value: object) -> float:
    """A float argument (a float, an int, a 0-d tensor), or a WatchError naming the argument."""
    if type(value) is float:
        return value
    if isinstance(value, str | bytes) or value is None:
        raise WatchError(f"{name}: must be a number, got {value!r:.80}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise WatchError(f"{name}: must be a number (a float or a 0-d tensor), got {value!r:.80}") from None


def _largest(name: str, value: object) -> float | None:
    """A gradient norm, or the largest of a report's k norms (any NaN or inf among them wins:
    a gradient that exploded in one of the k steps is the report's)."""
    if value is None:
        return None
    try:
        return _real(name, value)
    except WatchError:
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise
    norms = [_real(name, v) for v in value]
    if not norms:
        raise WatchError(f"{name}: an empty sequence; pass a number, the k steps' norms, or None")
    bad = [v for v in norms if not math.isfinite(v)]
    return bad[0] if bad else max(norms)


def default_run_id(env: Mapping[str, str], world_size: int) -> str:
    """RUNWATCH_RUN_ID, else torchrun's TORCHELASTIC_RUN_ID (every rank and restart of the job
    shares it), else, in one process, the script's name and its start (UTC HHMMSS)."""
    for name in ("RUNWATCH_RUN_ID", "TORCHELASTIC_RUN_ID"):
        if env.get(name) and env[name] != "none":
            return env[name]
    if world_size > 1:
        raise WatchError("run_id: ranks must share one; pass run_id= or set RUNWATCH_RUN_ID (torchrun sets its own)")
    return f"{Path(sys.argv[0] or 'python').stem}-{datetime.now(UTC):%H%M%S}"


# The server `serve()` starts: prometheus_client's handler behind a bounded pool.
WORKERS = 4  # scrapes answered at once (Prometheus scrapes a target one at a time)
QUEUED = 4  # further connections that wait for a worker; any more are closed at once
REQUEST_DEADLINE_S = 5.0  # a connection is cut this long after it was accepted, answered or not (a scrape takes ms)
FINISH_WAIT_S = 5.0  # finish() waits this long for Prometheus to scrape the end (5 scrape intervals)


class BoundedServer(HTTPServer):
    """/metrics of a registry, with WORKERS threads, QUEUED connections waiting, and every
    connection cut REQUEST_DEADLINE_S after it was accepted however slowly its client sends:
    3,000 stalled connections cost a few sockets, not a thread each (prometheus_client's own
    server starts one per connection, with a listen backlog of 5). Not a general web server."""

    request_queue_size = 128  # the listen backlog

    def __init__(self, host: str, port: int, registry: CollectorRegistry):
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((host, port), MetricsHandler.factory(registry))
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="runwatch-watch")
        self._slots = threading.BoundedSemaphore(WORKERS + QUEUED)
        self._open: dict[socket.socket, float] = {}
        self._open_lock = threading.Lock()

    def server_bind(self) -> None:  # HTTPServer's asks DNS for the host's full name: not needed
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: socket.socket, client_address: object) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # every worker busy and the queue full: refused
            return
        with self._open_lock:
            self._open[request] = time.monotonic() + REQUEST_DEADLINE_S
        request.settimeout(REQUEST_DEADLINE_S)
        self._pool.submit(self._serve_one, request, client_address)

    def _serve_one(self, request: socket.socket, client_address: object) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the client went away, or its deadline cut it
        finally:
            with self._open_lock:
                self._open.pop(request, None)
            self.shutdown_request(request)
            self._slots.release()

    def service_actions(self) -> None:
        """Between polls of the listening socket (every 0.5 s): cut the connections past their deadline."""
        now = time.monotonic()
        with self._open_lock:
            late = [s for s, deadline in self._open.items() if deadline < now]
        for s in late:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


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
        self._scraped = threading.Condition(self._lock)  # notified by every scrape (finish() waits on it)
        self._started_at, self._ended_at = wall(), None
        self._last_end = clock()
        self._begun: float | None = None  # the first begin() since the last report
        self._exchanged: float | None = None
        self._waited = 0.0  # collective wait measured since the last report (watch_ddp's hooks)
        self._server: BoundedServer | None = None
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
        """Serve /metrics on host:(port + local rank), and say so on stderr; return the port.

        The server is bounded (BoundedServer: a listening thread and at most WORKERS more), and
        runs in daemon threads. Serve `self.registry` yourself instead if your process already
        has a metrics server. host "0.0.0.0" opens it to the network: the lab needs only loopback.
        """
        port = _whole("port", port, 1)
        bound = port + self.local_rank
        if bound > 65535:
            raise WatchError(f"port: {port} + LOCAL_RANK {self.local_rank} = {bound}, not a TCP port (1-65535)")
        try:
            server = BoundedServer(host, bound, self.registry)
        except OSError as err:
            raise WatchError(f"port: cannot serve on {host}:{bound}: {err.strerror or err}") from None
        threading.Thread(target=server.serve_forever, name="runwatch-watch-server", daemon=True).start()
        self._server = server
        where = f"[{host}]" if ":" in host else host
        print(f"runwatch.watch: run {self.run_id} rank {self.rank} serves http://{where}:{bound}/metrics",
              file=sys.stderr)  # fmt: skip
        return bound

    # --- the step: a few attribute writes under a lock ---

    def begin(self) -> None:
        """A step starts now. Without it a step starts where the previous report ended. With
        `step(..., steps=k)` call it before every step or only the first of the k: the first
        call since the last report marks the report's start, later ones change nothing."""
        if self._begun is None:
            self._begun = self._clock()

    def exchange(self) -> None:
        """This rank has computed its gradient and enters the gradient exchange (all-reduce):
        the time from here to `step` counts as its collective wait. For your own all-reduce
        without DDP; under DDP use `watch_ddp`, which times the collectives themselves."""
        self._exchanged = self._clock()
        self._seq += 1

    def step(
        self,
        step: int,
        loss: float,
        *,
        tokens: int = 0,
        gradient_norm: float | Iterable[float] | None = None,
        learning_rate: float | None = None,
        steps: int = 1,
    ) -> None:
        """Publish a completed step (its number, loss, tokens, gradient norm, learning rate).

        `steps`: how many steps this call reports at once, `tokens` all of theirs, `loss` their
        mean; `gradient_norm` a number (the largest of theirs) or their k norms, of which the
        largest is published. The step-time histogram counts their mean duration k times. Each
        argument is checked: a wrong type or range raises WatchError naming it.
        """
        end = self._clock()
        steps, step, tokens = _whole("steps", steps, 1), _whole("step", step), _whole("tokens", tokens)
        loss_value, grad = _real("loss", loss), _largest("gradient_norm", gradient_norm)
        lr = None if learning_rate is None else _real("learning_rate", learning_rate)
        seconds = end - (self._begun if self._begun is not None else self._last_end)
        # plain floats now: a tensor kept until the scrape would keep its graph alive (or sync a GPU there)
        last = (step, loss_value, grad, lr, tokens / seconds if seconds > 0 else None)
        with self._lock:
            waited = self._waited + (end - self._exchanged if self._exchanged is not None else 0.0)
            self._waited = 0.0
            self._last = last
            self._tokens += tokens
            self._buckets[bisect.bisect_left(STEP_DURATION_BUCKETS, seconds / steps)] += steps
            self._duration_sum += seconds
            if self.distributed:
                wait = min(max(waited, 0.0), seconds)
                self._compute_total += seconds - wait
                self._wait_total += wait
                self._rank_last = ((seconds - wait) / steps, wait / steps, seconds / steps, self._wall())
        self._last_end, self._exchanged, self._begun = end, None, None

    def waited(self, seconds: float) -> None:
        """Count `seconds` this rank spent blocked in a collective (a broadcast, an all-reduce)
        towards the current report's wait; its compute is the rest of the report's time.
        watch_ddp's hooks call it; call it yourself around a collective of your own."""
        with self._lock:
            self._waited += seconds

    def heldout(self, loss: float) -> None:
        """The held-out loss just evaluated; published with every step until the next one."""
        self._heldout = _real("heldout loss", loss)

    def finish(self, wait: float | None = None) -> None:
        """The run is over: its per-step values go stale in Prometheus, so alerts on them
        resolve, and its end time is served, so TrainerDown does not page when the process
        exits. Waits up to `wait` s (default FINISH_WAIT_S if this Watch serves, else 0) for a
        scrape after the end, so that Prometheus has seen it before the process exits."""
        limit = (FINISH_WAIT_S if self._server is not None else 0.0) if wait is None else _real("wait", wait)
        with self._scraped:
            if self._ended_at is None:
                self._ended_at = self._wall()
            seen = self.scrapes
            if limit > 0:
                self._scraped.wait_for(lambda: self.scrapes > seen, timeout=limit)

    # --- a scrape: every series, from one consistent copy ---

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self.scrapes += 1
            self.last_scrape = self._clock()
            self._scraped.notify_all()
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
    also times the gradient exchange's tail, from the last bucket's launch (this rank's backward
    is done) to its completion (every rank's has arrived), as collective wait. The mark is the
    collective's own future, so nothing DDP does before it moves it. Use `watch_ddp`, which also
    times DDP's buffer broadcast; this alone misses a wait spent there.

        >>> ddp.register_comm_hook(*ddp_comm_hook(w))
    """
    import torch.distributed as dist  # the user's torch, imported only by who asks for the hook

    def hook(state: object, bucket):
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        last, launched = bucket.is_last(), watch._clock()
        fut = dist.all_reduce(tensor, async_op=True).get_future()

        def done(f):
            if last:  # gloo and NCCL complete a group's collectives in order: the last is the tail
                watch.waited(watch._clock() - launched)
                watch._seq += 1
            return f.value()[0]

        return fut.then(done)

    return None, hook


def watch_ddp(watch: Watch, ddp) -> None:
    """Time a DistributedDataParallel model's collectives for `watch`: each rank's compute is its
    step's time less the time it spent blocked in them, so the waiting ranks (the healthy ones)
    read fast and the one they wait for reads slow, whatever DDP's options.

    Two marks no DDP default moves: the buffer broadcast that `broadcast_buffers=True` (the
    default) runs at the start of every forward with a model that holds buffers (BatchNorm),
    timed from a forward pre-hook on the DDP wrapper (before it) to one on the wrapped module
    (after it); and the gradient all-reduce's tail, from ddp_comm_hook's future. Call it before
    the first forward, once; it registers the comm hook, so register none of your own.

        >>> ddp = DistributedDataParallel(model)
        >>> watch_ddp(w, ddp)
    """
    entered: list[float] = []

    def before_ddp(module, args):
        entered[:] = [watch._clock()]

    def inside_ddp(module, args):
        if entered:
            watch.waited(watch._clock() - entered.pop())

    ddp.register_forward_pre_hook(before_ddp)
    ddp.module.register_forward_pre_hook(inside_ddp)
    ddp.register_comm_hook(*ddp_comm_hook(watch))
