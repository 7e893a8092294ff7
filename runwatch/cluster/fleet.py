"""A fleet of simulated ranks served as node targets over real HTTP, with faults injected on demand.

Each node of 8 ranks is one target, `/node/<i>/metrics`, as a node-level exporter (or a pod
per node) would serve it: its ranks' series under the lab's names and labels (run_id, rank,
node; exporter/rank_metrics.py) and their GPUs' under dcgm-exporter's (gpu, UUID, Hostname).
The launcher's restart counters are one more target, `/launcher/metrics`.

What it is for: measuring Prometheus, not this. The state is numpy arrays stepped once a lab
second; a node's text is rendered at most once a step, when it is scraped. It decides nothing
about alerts: it steps, serves, and applies a fault when told (`POST /fault?kind=...`), and
says when it did (the onset, ground truth). Not the trainer: no model is trained here, and a
dead rank's peers step on (a real job would hang in its next exchange and restart).

    python -m runwatch.cluster.fleet --ranks 512 --port 9300 --targets-dir targets
    curl -XPOST '127.0.0.1:9300/fault?kind=straggler&rank=37&slowdown=1.33'   # {"onset": 1764...}
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np

from runwatch.core.command import Parser, UsageError, number
from runwatch.core.files import write_atomic
from runwatch.core.names import LOOPBACK
from runwatch.exporter import rank_metrics as rm
from runwatch.trainer.gpu import FB_USED_MIB, HEALTHY_TEMP_C, LOAD_POWER_W, NOMINAL_SM_MHZ, THROTTLED_TEMP_C

RANKS_PER_NODE = 8
COLLECTIVE_SECONDS = 0.03  # the gradient exchange itself, after the slowest rank arrives
THROTTLED_CLOCK = 0.7  # a throttled GPU's share of its nominal SM clock, as the lab's straggler
KINDS = ("straggler", "throttle", "hang", "rank_down", "node_down", "restart", "xid", "heal")

RANK_GAUGES = (rm.RANK_STEP, rm.RANK_STEP_SECONDS, rm.RANK_COMPUTE_SECONDS, rm.RANK_WAIT_SECONDS,
               rm.RANK_LAST_STEP_TIME, rm.RANK_COLLECTIVE_SEQ)  # fmt: skip
RANK_COUNTERS = (rm.RANK_COMPUTE_TOTAL, rm.RANK_WAIT_TOTAL)
GPU_GAUGES = (rm.GPU_TEMP, rm.GPU_SM_CLOCK, rm.GPU_POWER, rm.GPU_FB_USED, rm.GPU_XID)

# HELP of each family as served: a counter's under its name with _total
FAMILY_HELP = {**rm.HELP, **{f"{n}_total": h for n, h in rm.TOTAL_HELP.items()}}


@dataclass
class FleetConfig:
    ranks: int = 512  # a multiple of 8: nodes of 8 GPUs
    step_seconds: float = 1.0  # one lab second a step, as the lab's clock
    jitter: float = 0.02  # each step's compute time varies by 2% (one sigma), as trainer.run's
    run_id: str = "fleet"
    seed: int = 0

    @property
    def nodes(self) -> int:
        return self.ranks // RANKS_PER_NODE


@dataclass
class State:
    """Every rank's last step, as numpy arrays indexed by rank."""

    n: int
    step: np.ndarray = field(init=False)
    compute: np.ndarray = field(init=False)
    wait: np.ndarray = field(init=False)
    step_time: np.ndarray = field(init=False)
    last_time: np.ndarray = field(init=False)
    seq: np.ndarray = field(init=False)
    compute_total: np.ndarray = field(init=False)
    wait_total: np.ndarray = field(init=False)
    slowdown: np.ndarray = field(init=False)
    clock: np.ndarray = field(init=False)
    temp: np.ndarray = field(init=False)
    xid: np.ndarray = field(init=False)
    alive: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name in ("compute", "wait", "step_time", "last_time", "compute_total", "wait_total"):
            setattr(self, name, np.zeros(self.n))
        self.step, self.seq, self.xid = (np.zeros(self.n, dtype=np.int64) for _ in range(3))
        self.slowdown, self.clock = np.ones(self.n), np.full(self.n, NOMINAL_SM_MHZ)
        self.temp, self.alive = np.full(self.n, HEALTHY_TEMP_C), np.ones(self.n, dtype=bool)


class Fleet:
    """The ranks' state, stepped by `tick`, faults applied by `fault`, each node's text by `node_text`."""

    def __init__(self, cfg: FleetConfig):
        self.cfg, self.rng = cfg, np.random.default_rng(cfg.seed)
        self.s = State(cfg.ranks)
        self.hung = False
        self.node_up = np.ones(cfg.nodes, dtype=bool)
        self.restarts, self.lost_steps, self.ticks = 0, 0, 0
        self.lock = threading.Lock()
        self._cache: dict[int, tuple[int, bytes]] = {}
        self._prefixes = [self._node_prefixes(i) for i in range(cfg.nodes)]

    def _node_prefixes(self, i: int) -> dict[str, list[str]]:
        """Each series' name and labels, once: rendering only appends the values."""
        run, node = self.cfg.run_id, f"node{i}"
        out: dict[str, list[str]] = {}
        ranks = range(i * RANKS_PER_NODE, (i + 1) * RANKS_PER_NODE)
        for name in RANK_GAUGES + tuple(f"{c}_total" for c in RANK_COUNTERS):
            out[name] = [f'{name}{{run_id="{run}",rank="{r}",node="{node}"}} ' for r in ranks]
        for name in GPU_GAUGES:
            out[name] = [
                f'{name}{{gpu="{g}",UUID="{gpu_uuid(node, g)}",Hostname="{node}"}} ' for g in range(RANKS_PER_NODE)
            ]
        return out

    # --- stepping ---
    def tick(self, now: float) -> None:
        """One lab second: every live rank finishes a step, unless the job hangs."""
        cfg, s = self.cfg, self.s
        with self.lock:
            self.ticks += 1
            if self.hung:
                return
            noise = 1.0 + cfg.jitter * self.rng.standard_normal(cfg.ranks)
            s.compute = cfg.step_seconds * 0.9 * s.slowdown * noise
            slowest = s.compute[s.alive].max() if s.alive.any() else 0.0
            s.step_time = np.full(cfg.ranks, slowest + COLLECTIVE_SECONDS)
            s.wait = s.step_time - s.compute
            live = s.alive
            s.step[live] += 1
            s.seq[live] = s.step[live] + 1
            s.last_time[live] = now
            s.compute_total[live] += s.compute[live]
            s.wait_total[live] += s.wait[live]

    # --- faults: the simulator applies them; the rules decide what pages ---
    def fault(self, kind: str, rank: int = 0, slowdown: float = 1 / THROTTLED_CLOCK, code: int = 79) -> float:
        """Apply a fault now and return its onset (Unix time): the ground truth a page is timed from."""
        s, node = self.s, rank // RANKS_PER_NODE
        with self.lock:
            if kind == "straggler":
                s.slowdown[rank] = slowdown
            elif kind == "throttle":
                s.slowdown[rank], s.clock[rank] = 1 / THROTTLED_CLOCK, NOMINAL_SM_MHZ * THROTTLED_CLOCK
                s.temp[rank] = THROTTLED_TEMP_C
            elif kind == "hang":
                self.hung = True
                s.seq[rank] -= 1  # the hung rank never entered the exchange its peers wait in
            elif kind == "rank_down":
                s.alive[rank] = False
            elif kind == "node_down":
                self.node_up[node] = False
            elif kind == "restart":
                self.restarts += 1
                self.lost_steps += 10
            elif kind == "xid":
                s.xid[rank] = code
            elif kind == "heal":
                self.hung = False
                s.slowdown[:], s.clock[:], s.temp[:], s.xid[:] = 1.0, NOMINAL_SM_MHZ, HEALTHY_TEMP_C, 0
                s.alive[:], self.node_up[:] = True, True
            self._cache.clear()
            return time.time()

    # --- serving ---
    def node_text(self, i: int) -> bytes | None:
        """Node i's exposition (rendered once a step), or None while the node is down."""
        if not self.node_up[i]:
            return None
        with self.lock:
            cached = self._cache.get(i)
            if cached and cached[0] == self.ticks:
                return cached[1]
            text = self._render(i)
            self._cache[i] = (self.ticks, text)
            return text

    def _render(self, i: int) -> bytes:
        s, p = self.s, self._prefixes[i]
        lo, hi = i * RANKS_PER_NODE, (i + 1) * RANKS_PER_NODE
        started = s.step[lo:hi] > 0  # a rank serves its step's times once it has finished one
        rank_values = {
            rm.RANK_STEP: s.step, rm.RANK_STEP_SECONDS: s.step_time, rm.RANK_COMPUTE_SECONDS: s.compute,
            rm.RANK_WAIT_SECONDS: s.wait, rm.RANK_LAST_STEP_TIME: s.last_time, rm.RANK_COLLECTIVE_SEQ: s.seq,
            f"{rm.RANK_COMPUTE_TOTAL}_total": s.compute_total, f"{rm.RANK_WAIT_TOTAL}_total": s.wait_total,
        }  # fmt: skip
        power = LOAD_POWER_W * s.clock / NOMINAL_SM_MHZ
        gpu_values = {rm.GPU_TEMP: s.temp, rm.GPU_SM_CLOCK: s.clock, rm.GPU_POWER: power,
                      rm.GPU_FB_USED: np.full(s.n, FB_USED_MIB), rm.GPU_XID: s.xid}  # fmt: skip
        alive = s.alive[lo:hi]
        out = []
        for name, values in rank_values.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            out.append(f"# HELP {name} {FAMILY_HELP[name]}\n# TYPE {name} {kind}\n")
            shown = alive & started if name == rm.RANK_LAST_STEP_TIME else alive
            out += [f"{p[name][j]}{float(values[lo + j])!r}\n" for j in range(RANKS_PER_NODE) if shown[j]]
        for name, values in gpu_values.items():
            out.append(f"# HELP {name} {FAMILY_HELP[name]}\n# TYPE {name} gauge\n")
            out += [f"{p[name][j]}{float(values[lo + j])!r}\n" for j in range(RANKS_PER_NODE) if alive[j]]
        return "".join(out).encode()

    def launcher_text(self) -> bytes:
        run, out = f'{{run_id="{self.cfg.run_id}"}}', []
        for name, kind, value in ((f"{rm.JOB_RESTARTS}_total", "counter", self.restarts),
                                  (f"{rm.JOB_LOST_STEPS}_total", "counter", self.lost_steps),
                                  (rm.JOB_ETTR, "gauge", 1.0)):  # fmt: skip
            out.append(f"# HELP {name} {FAMILY_HELP[name]}\n# TYPE {name} {kind}\n{name}{run} {float(value)!r}\n")
        return "".join(out).encode()

    def targets(self, address: str) -> list[dict]:
        """Prometheus's file_sd groups: one target a node (its path and node label), and the launcher."""
        run = self.cfg.run_id
        nodes = [
            {"targets": [address], "labels": {"__metrics_path__": f"/node/{i}/metrics", "instance": f"node{i}",
                                              "run_id": run, "node": f"node{i}"}}
            for i in range(self.cfg.nodes)
        ]  # fmt: skip
        return nodes

    def launcher_targets(self, address: str) -> list[dict]:
        return [{"targets": [address], "labels": {"__metrics_path__": "/launcher/metrics", "instance": "launcher"}}]


def gpu_uuid(node: str, gpu: int) -> str:
    """A stable UUID for a GPU, in nvidia-smi's form (trainer.gpu's spelling)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{gpu}.runwatch')}"


class Handler(BaseHTTPRequestHandler):
    server: FleetServer

    def log_message(self, *args: object) -> None:  # a scrape a second per node: no log line each
        pass

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; version=0.0.4") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        fleet, parts = self.server.fleet, urlsplit(self.path).path.strip("/").split("/")
        if parts == ["launcher", "metrics"]:
            return self._send(200, fleet.launcher_text())
        if parts == ["-", "ready"]:
            return self._send(200, b"ready\n")
        if len(parts) == 3 and parts[0] == "node" and parts[2] == "metrics" and parts[1].isdigit():
            i = int(parts[1])
            if i < fleet.cfg.nodes:
                text = fleet.node_text(i)
                return self._send(200, text) if text is not None else self._send(503, b"node down\n")
        self._send(404, b"not found\n")

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path != "/fault":
            return self._send(404, b"not found\n")
        try:
            kind, rank = q.get("kind", ""), int(q.get("rank", "0"))
            if kind not in KINDS or not 0 <= rank < self.server.fleet.cfg.ranks:
                raise ValueError(f"kind must be one of {', '.join(KINDS)} and rank in [0, ranks)")
            onset = self.server.fleet.fault(kind, rank, float(q.get("slowdown", 1 / THROTTLED_CLOCK)),
                                            int(q.get("code", 79)))  # fmt: skip
        except ValueError as e:
            return self._send(400, json.dumps({"error": str(e)}).encode(), "application/json")
        self._send(200, json.dumps({"kind": kind, "rank": rank, "onset": onset}).encode(), "application/json")


class FleetServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # thousands of node targets are scraped within a few seconds

    def __init__(self, fleet: Fleet, port: int, host: str = LOOPBACK):
        self.fleet = fleet
        super().__init__((host, port), Handler)


def run_clock(fleet: Fleet, stop: threading.Event) -> None:
    """Step the fleet once a lab second, on the second's boundary from its start (no drift)."""
    start, k = time.time(), 0
    while not stop.is_set():
        k += 1
        if stop.wait(max(0.0, start + k * fleet.cfg.step_seconds - time.time())):
            return
        fleet.tick(time.time())


def parser() -> Parser:
    p = Parser(prog="python -m runwatch.cluster.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=number(int, 8, 65_536), default=512, help="ranks, a multiple of 8 (default 512)")
    p.add_argument("--port", type=number(int, 0, 65_535), default=0, help="port to serve on (0: any free one)")
    p.add_argument("--step-seconds", type=number(float, 0.05, 60), default=1.0, help="seconds a step (default 1)")
    p.add_argument("--run-id", default="fleet", help="the run_id label of every series (default fleet)")
    p.add_argument("--seed", type=int, default=0, help="the jitter's random seed")
    p.add_argument("--targets-dir", type=Path, help="write file_sd targets here: nodes.json, launcher.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_status(argv)
    if isinstance(args, int):
        return args
    try:
        if args.ranks % RANKS_PER_NODE:
            raise UsageError(f"--ranks: must be a multiple of {RANKS_PER_NODE} (nodes of 8 GPUs), got {args.ranks}")
        fleet = Fleet(FleetConfig(ranks=args.ranks, step_seconds=args.step_seconds, run_id=args.run_id,
                                  seed=args.seed))  # fmt: skip
        try:
            server = FleetServer(fleet, args.port)
        except OSError as e:
            raise UsageError(f"--port: cannot listen on {args.port}: {e.strerror}") from None
    except UsageError as e:
        print(f"python -m runwatch.cluster.fleet: {e}", file=sys.stderr)
        return 2
    address = f"{LOOPBACK}:{server.server_address[1]}"
    if args.targets_dir:
        args.targets_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(args.targets_dir / "nodes.json", json.dumps(fleet.targets(address)) + "\n")
        write_atomic(args.targets_dir / "launcher.json", json.dumps(fleet.launcher_targets(address)) + "\n")
    stop = threading.Event()
    threading.Thread(target=run_clock, args=(fleet, stop), daemon=True).start()
    print(f"fleet {args.run_id}: {args.ranks} ranks as {fleet.cfg.nodes} nodes, serving http://{address}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
