"""The native lab's processes: what `runwatch up` starts, in which order, with which configuration,
and how `down` finds and stops them again. `runwatch up | down | status | reload` (lab.py) and
`runwatch drill` (which starts a lab whose incident is hidden) both use it.

Everything a lab keeps lives in one state directory (default ./.runwatch): Prometheus's TSDB,
Alertmanager's silences, the page log, each run's run.json, logs and PID files. So `down` then
`up` keeps Prometheus's history. Prometheus reads prometheus/prometheus.yml and its rules through
symlinks in the state directory, beside a targets/ folder of loopback addresses, and
Alertmanager reads alertmanager/alertmanager.yml with each compose service name (`pager`) replaced
by 127.0.0.1 (`loopback`). Those are the places where the native lab differs from docker compose.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import random
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from runwatch.cluster.targets import rank_targets
from runwatch.core.command import DEFAULT_STATE, UsageError, config_error, read_json
from runwatch.core.files import write_atomic
from runwatch.core.names import CONTROL_PORT, LAUNCHER_PORT, PORTS, RANK_PORT_BASE
from runwatch.core.names import url as url_of
from runwatch.core.paths import Layout
from runwatch.drill.answer import answer_path, seal_answer
from runwatch.prom.server import port_is_free, wait_ready
from runwatch.prom.tools import binary
from runwatch.trainer.config import CLUSTER_INCIDENTS, INCIDENTS, ConfigError, TrainConfig, draw_drill
from runwatch.trainer.live import unique_run_id

# Shared with docker-compose.yml (tests/test_compose.py holds them equal). The external URLs are
# where a learner's browser reaches each server, natively and through compose's published ports,
# so the links in alerts (generatorURL, Alertmanager's) open in both worlds.
PROMETHEUS_FLAGS = [
    "--web.enable-lifecycle",  # `runwatch reload` POSTs /-/reload
    f"--web.external-url=http://127.0.0.1:{PORTS['prometheus']}/",
    "--rules.alert.resend-delay=2s",  # an Alertmanager that restarts hears of firing alerts in 2 s, not 1 m
    "--storage.tsdb.retention.time=30d",
]


ALERTMANAGER_FLAGS = [
    "--cluster.listen-address=",  # one Alertmanager: no gossip port
    f"--web.external-url=http://127.0.0.1:{PORTS['alertmanager']}/",
]


PY = [sys.executable, "-m", "runwatch"]  # our own commands, in this interpreter


def loopback(config: str) -> str:
    """A config file's compose addresses (`http://pager:9095`) as the native lab has them: every
    service on 127.0.0.1, on the same port."""
    return re.sub(rf"//({'|'.join(map(re.escape, PORTS))}):(\d+)", r"//127.0.0.1:\2", config)


@dataclass
class Component:
    name: str
    argv: list[str]
    ready_url: str
    url: str


class Lab:
    """One lab's state directory and the components it runs."""

    def __init__(self, state: Path = DEFAULT_STATE, root: Path | None = None):
        self.state = Path(state).absolute()
        self.layout = Layout(root)
        self.pids = self.state / "pids"
        self.logs = self.state / "logs"
        self.prometheus_dir = self.state / "prometheus"
        self.alertmanager_yml = self.state / "alertmanager" / "alertmanager.yml"
        self.targets = self.prometheus_dir / "targets"
        self.page_log = self.state / "pages.jsonl"
        self.runs = self.state / "runs"

    # --- the configuration Prometheus reads: the repo's files, plus loopback targets ---

    def link_config(self) -> None:
        self.targets.mkdir(parents=True, exist_ok=True)
        for name, target in [("prometheus.yml", self.layout.prometheus_yml), ("rules", self.layout.rules_dir)]:
            link = self.prometheus_dir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target.absolute())
        self.render_alertmanager_config()

    def render_alertmanager_config(self) -> None:
        """Alertmanager's config as the repository has it, with loopback addresses."""
        self.alertmanager_yml.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.alertmanager_yml, loopback(self.layout.alertmanager_yml.read_text()))

    def write_target(self, job_file: str, addresses: list[str]) -> None:
        """Write targets/<job_file>.json atomically: file_sd must never read half a file."""
        self.write_groups(job_file, [{"targets": addresses}])

    def write_groups(self, job_file: str, groups: list[dict]) -> None:
        """targets/<job_file>.json of file_sd groups, each with its targets and labels."""
        write_atomic(self.targets / f"{job_file}.json", json.dumps(groups) + "\n")

    def remove_target(self, job_file: str) -> None:
        (self.targets / f"{job_file}.json").unlink(missing_ok=True)

    # --- a drill's answer ---

    def sealed_answer(self, run_id: str) -> Path:
        return answer_path(self.runs / run_id)

    def seal_drill(self, run_id: str, drill_seed: int | None, seed: int = 0, ranks: int = 1) -> None:
        """Draw the drill's incident and onset (and the rank a cluster incident strikes, for a run
        of `seed` over `ranks`) and seal them in the run's directory.

        With a seed the draw is reproducible in this state directory only: it is keyed by a
        secret of the lab's (drill.key, owner-only), so the seed on its own names nothing.
        """
        if drill_seed is None:
            rng: random.Random = secrets.SystemRandom()
        else:
            key_file = self.state / "drill.key"
            if not key_file.exists():
                write_atomic(key_file, secrets.token_hex(16) + "\n", mode=0o600)
            rng = random.Random(f"{key_file.read_text().strip()}:{drill_seed}")
        self.sealed_answer(run_id).parent.mkdir(parents=True, exist_ok=True)
        drawn = draw_drill(rng, cluster=ranks > 1)
        cfg = TrainConfig(incident=drawn["incident"], onset=drawn["onset"], seed=seed, ranks=ranks, run_id=run_id)
        seal_answer(self.sealed_answer(run_id), cfg)

    # --- processes ---

    def components(self, args: argparse.Namespace, run_id: str) -> list[Component]:
        """What `up` starts, in order: the trainer (and a healthy control), the pager,
        Alertmanager, Prometheus, which scrapes and alerts on the others, then the console,
        which reads them all."""
        comps = [self._trainer(args, run_id), self._pager(), self._alertmanager(), self._prometheus(), self._console()]
        if args.control:
            comps.insert(1, self._control(args, run_id))
        return comps

    @staticmethod
    def _serving(name: str, argv: list[str], port: int, path: str = "") -> Component:
        url = f"http://127.0.0.1:{port}"
        return Component(name, argv, f"{url}/-/ready", f"{url}{path}")

    def _train_argv(self, run_id: str, seed: int, port: int, fast_forward: int) -> list[str]:
        argv = [*PY, "train", "--seed", str(seed), "--run-id", run_id, "--port", str(port)]
        argv += ["--run-dir", str(self.runs / run_id), "--wait-for-prometheus"]
        return argv + (["--fast-forward", str(fast_forward)] if fast_forward else [])

    def _trainer(self, args: argparse.Namespace, run_id: str) -> Component:
        argv = self._train_argv(run_id, args.seed, PORTS["trainer"], args.fast_forward)
        argv += ["--incident", args.incident, "--precision", args.precision]
        if args.onset is not None:
            argv += ["--onset", str(args.onset)]
        if args.incident == "random":  # the answer is drawn and sealed by `up`, never in argv
            argv += ["--sealed-answer", str(self.sealed_answer(run_id))]
        if args.ranks > 1:  # rank 0 serves the job's metrics on the trainer's port, as one process does
            argv += ["--ranks", str(args.ranks), "--rank-port-base", str(RANK_PORT_BASE)]
            argv += ["--launcher-port", str(LAUNCHER_PORT)]
        return self._serving("trainer", argv, PORTS["trainer"], "/metrics")

    def _control(self, args: argparse.Namespace, run_id: str) -> Component:
        """A healthy run of the same seed beside the incident's, on its own port."""
        control_id = f"none-{args.seed}-control-{run_id.rsplit('-', 1)[-1]}"
        argv = self._train_argv(control_id, args.seed, CONTROL_PORT, args.fast_forward)
        return self._serving("control", argv, CONTROL_PORT, "/metrics")

    def _pager(self) -> Component:
        argv = [*PY, "pager-serve", "--port", str(PORTS["pager"]), "--log", str(self.page_log)]
        argv += ["--runbooks", str(self.layout.runbooks_dir), "--prometheus", url_of("prometheus")]
        return self._serving("pager", argv, PORTS["pager"], "/metrics")

    def _alertmanager(self) -> Component:
        argv = [binary("alertmanager"), f"--config.file={self.alertmanager_yml}"]
        argv += [f"--storage.path={self.state / 'alertmanager-data'}"]
        argv += [f"--web.listen-address=127.0.0.1:{PORTS['alertmanager']}", *ALERTMANAGER_FLAGS]
        # its API: Debian's Alertmanager has no web UI, and its root page says only that
        return self._serving("alertmanager", argv, PORTS["alertmanager"], "/api/v2/alerts")

    def _console(self) -> Component:
        argv = [*PY, "console", "--port", str(PORTS["console"]), "--state-dir", str(self.state)]
        return self._serving("console", argv, PORTS["console"], "/")

    def _prometheus(self) -> Component:
        argv = [binary("prometheus"), f"--config.file={self.prometheus_dir / 'prometheus.yml'}"]
        argv += [f"--storage.tsdb.path={self.state / 'prometheus-data'}"]
        argv += [f"--web.listen-address=127.0.0.1:{PORTS['prometheus']}", *PROMETHEUS_FLAGS]
        return self._serving("prometheus", argv, PORTS["prometheus"], "/api/v1/targets")  # no web UI: its API

    def start(self, comp: Component) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{comp.name}.log", "ab") as log, _Interrupts.held_back():
            # A session of its own: Ctrl-C in the terminal reaches `up`, which stops them in order.
            proc = subprocess.Popen(
                comp.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
            # The start time with the PID: a PID the kernel reuses for another process is not ours.
            started = psutil.Process(proc.pid).create_time()
            record = {
                "pid": proc.pid,
                "create_time": started,
                "argv": comp.argv,
                "ready_url": comp.ready_url,
                "url": comp.url,
            }
            write_atomic(self.pids / f"{comp.name}.json", json.dumps(record) + "\n")
        if not wait_ready(comp.ready_url, 60, proc):
            raise UsageError(f"{comp.name} did not start: {self.log_tail(comp.name)}")
        return proc.pid

    def log_tail(self, name: str) -> str:
        """The last lines of a component's log, on one line, and where the rest is."""
        log = self.logs / f"{name}.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        return f"{' | '.join(tail)} (log: {log})"

    def records(self) -> dict[str, dict]:
        """Each component's PID file; one that is damaged (truncated, hand-edited) reads as
        {"damaged": why}, which names no process: nothing is stopped on its word."""
        if not self.pids.is_dir():
            return {}
        records = {}
        for path in sorted(self.pids.glob("*.json")):
            try:
                records[path.stem] = read_json(path, "a PID file")
            except UsageError as err:
                records[path.stem] = {"damaged": str(err)}
        return records

    @staticmethod
    def process(record: dict) -> psutil.Process | None:
        """The process we started, if it still runs: the same PID, start time and command
        (PIDs are reused)."""
        try:
            proc = psutil.Process(record["pid"])
            ours = proc.cmdline() == record["argv"] and proc.create_time() == record.get("create_time")
            return proc if ours and proc.status() != psutil.STATUS_ZOMBIE else None
        except (psutil.Error, KeyError, TypeError, ValueError):  # a damaged record is no process of ours
            return None

    @contextlib.contextmanager
    def locked(self, wait: bool, name: str = "lab.lock") -> Iterator[None]:
        """Hold the state directory's lock while starting or stopping: two `up`s at once would
        each clean up the other's components. `up` does not wait for it; `down` does. A drill's
        acks and diagnosis hold another lock of the directory's, `drill.lock`."""
        try:
            self.state.mkdir(parents=True, exist_ok=True)
            fh = open(self.state / name, "a")  # noqa: SIM115 (held for the block)
        except OSError as err:
            raise UsageError(f"--state-dir: cannot use {self.state}: {err.strerror}") from None
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise UsageError(f"another `runwatch up` or `down` is working in {self.state}: wait for it") from None
            yield

    @classmethod
    def alive(cls, record: dict) -> bool:
        return cls.process(record) is not None

    def stop(self, name: str, timeout: float = 15) -> bool:
        """SIGTERM the component if it is still ours, SIGKILL after timeout; forget its PID file."""
        path = self.pids / f"{name}.json"
        record = self.records().get(name, {})
        if "damaged" in record:
            print(f"runwatch: {record['damaged']}; if {name} still runs, stop it by hand", file=sys.stderr)
        proc = self.process(record)
        if proc is not None:
            proc.terminate()
            if not self._exits(record, timeout):
                proc.kill()
                self._exits(record, 5)
        path.unlink(missing_ok=True)
        return proc is not None

    def _exits(self, record: dict, timeout: float) -> bool:
        """Wait until the process has exited. A zombie has: its parent (init, for a detached lab)
        reaps it when it will, which takes 2 s here and which psutil.wait_procs waits for."""
        deadline = time.monotonic() + timeout
        while self.process(record) is not None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop_all(self) -> list[str]:
        order = ["console", "trainer", "control", "prometheus", "alertmanager", "pager"]  # readers first
        names = sorted(self.records(), key=lambda n: order.index(n) if n in order else -1)
        return [n for n in names if self.stop(n)]


class _Interrupts:
    """Ctrl-C and SIGTERM as KeyboardInterrupt, held back while a component is started and its
    PID file written: an interrupt in between would leave a process that no PID file names."""

    held = False
    pending = False

    @classmethod
    def handle(cls, *_: object) -> None:
        if cls.held:
            cls.pending = True
        else:
            raise KeyboardInterrupt

    @classmethod
    @contextlib.contextmanager
    def held_back(cls) -> Iterator[None]:
        cls.held = True
        try:
            yield
        finally:
            cls.held = False
            if cls.pending:
                cls.pending = False
                raise KeyboardInterrupt


def _port_owner_error(name: str, port: int) -> UsageError:
    return UsageError(f"port {port} is already in use ({name}): stop what holds it, or `runwatch down` a lab")


def check_run(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, a run the trainer would refuse once started."""
    if args.incident not in (*INCIDENTS, *CLUSTER_INCIDENTS, "random"):
        known = ", ".join((*INCIDENTS, *CLUSTER_INCIDENTS))
        raise UsageError(f"--incident: unknown incident {args.incident!r}; choose one of {known}, random")
    incident = "none" if args.incident == "random" else args.incident
    cfg = TrainConfig(incident=incident, seed=args.seed, precision=args.precision, ranks=args.ranks)
    try:
        dataclasses.replace(cfg, onset=cfg.onset if args.onset is None else args.onset).validate()
    except ConfigError as err:
        raise config_error(err) from None


def up(args: argparse.Namespace) -> int:
    check_run(args)
    lab = Lab(args.state_dir, args.root)
    # `kill` stops the lab as Ctrl-C does, never orphaning it: while starting (start_lab stops
    # what had started) and in the foreground.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _Interrupts.handle)
    with lab.locked(wait=False):
        run_id = start_lab(lab, args)
    print(f"run {run_id}: pages with `runwatch pager --follow --log {lab.page_log}`; stop with `runwatch down`")
    if args.detach:
        return 0
    try:
        while watch(lab):  # foreground: report a component that dies; end when `down` has stopped the lab
            time.sleep(1)
        print("runwatch up: the lab was stopped by `runwatch down`", flush=True)
    except KeyboardInterrupt:
        with lab.locked(wait=True):
            print("stopping:", ", ".join(lab.stop_all()) or "nothing was running", flush=True)
    return 0


def start_lab(lab: Lab, args: argparse.Namespace) -> str:
    """Start every component in order, under the lab's lock; on any failure stop what started."""
    running = [n for n, r in lab.records().items() if lab.alive(r)]
    if running:
        raise UsageError(f"a lab is already running in {lab.state} ({', '.join(running)}): `runwatch down` first")
    run_id = unique_run_id("drill" if args.incident == "random" else f"{args.incident}-{args.seed}")
    comps = lab.components(args, run_id)  # finds the binaries first: a missing one says what to install
    for comp in comps:
        port = int(comp.ready_url.rsplit(":", 1)[1].split("/")[0])
        if not port_is_free(port):
            raise _port_owner_error(comp.name, port)
    for rank in range(args.ranks if args.ranks > 1 else 0):  # one rank serves on the trainer's port
        if not port_is_free(RANK_PORT_BASE + rank):
            raise _port_owner_error(f"trainer rank {rank}", RANK_PORT_BASE + rank)
    if args.ranks > 1 and not port_is_free(LAUNCHER_PORT):
        raise _port_owner_error("trainer launcher", LAUNCHER_PORT)
    for stale in lab.records():
        (lab.pids / f"{stale}.json").unlink()
    lab.link_config()
    lab.write_target(
        "trainer", [f"127.0.0.1:{PORTS['trainer']}"] + ([f"127.0.0.1:{CONTROL_PORT}"] if args.control else [])
    )
    cluster = args.ranks > 1
    lab.write_groups("ranks", rank_targets(run_id, args.ranks, RANK_PORT_BASE) if cluster else [])
    lab.write_target("launcher", [f"127.0.0.1:{LAUNCHER_PORT}"] if cluster else [])
    for name in ("prometheus", "alertmanager", "pager"):
        lab.write_target(name, [f"127.0.0.1:{PORTS[name]}"])
    if args.incident == "random":
        lab.seal_drill(run_id, args.drill_seed, args.seed, args.ranks)
    # started_at: `runwatch pager` shows this lab's pages, not those of earlier labs
    record = {"run_id": run_id, "root": str(lab.layout.root), "started_at": time.time()}
    write_atomic(lab.state / "lab.json", json.dumps(record) + "\n")
    print(f"console: {url_of('console')}/ (the run, its pages and runbooks, ack and diagnose)", flush=True)
    try:
        for comp in comps:
            lab.start(comp)
            print(f"  {comp.name:13s} {comp.url}", flush=True)
        for comp in comps:  # one that answered and then died (a trainer that failed on its first step)
            if not lab.alive(lab.records().get(comp.name, {})):
                raise UsageError(f"{comp.name} exited during start: {lab.log_tail(comp.name)}")
    except BaseException:
        lab.stop_all()
        raise
    return run_id


def watch(lab: Lab) -> bool:
    """Report each component that has died, once; False once the lab's PID files are gone."""
    try:
        with lab.locked(wait=False):  # not while `down` is stopping and removing them
            records = lab.records()
            for name, rec in records.items():
                if not lab.alive(rec) and not rec.get("reported") and "damaged" not in rec:
                    print(f"runwatch up: {name} exited; see {lab.logs / name}.log", file=sys.stderr, flush=True)
                    write_atomic(lab.pids / f"{name}.json", json.dumps({**rec, "reported": True}) + "\n")
    except UsageError:  # `down` holds the lock: look again in a second
        return True
    return bool(records)
