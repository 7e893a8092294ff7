"""The native lab's processes: what `runwatch up` starts, in which order, with which configuration,
and how `down` finds and stops them again. `runwatch up | down | status | reload` (lab.py) and
`runwatch drill` (which starts a lab whose incident is hidden) both use it.

Everything a lab keeps lives in one state directory (default ./.runwatch): Prometheus's TSDB,
Alertmanager's silences, the page log, each run's run.json, logs and PID files. So `down` then
`up` keeps Prometheus's history. Prometheus reads prometheus/prometheus.yml and its rules through
symlinks in the state directory, beside a targets/ folder of loopback addresses, and
Alertmanager reads alertmanager/alertmanager.yml with each compose service name (`pager`) replaced
by 127.0.0.1 (`loopback`). Those are the places where the native lab differs from docker compose.

It takes the documented ports unless `up --ports` moves them (`--ports free`: all, to free ports);
it records where each component listens in its lab.json (runwatch.core.addresses), where every
command that talks to it looks. So labs in different state directories run side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from runwatch.cluster.targets import rank_targets
from runwatch.core import credentials
from runwatch.core.addresses import DEFAULT_PORTS, lab_urls, parse_ports
from runwatch.core.addresses import url as url_at
from runwatch.core.bounded import (
    MAX_RULE_FILE_BYTES,
    BoundedReadError,
    load_yaml,
    no_aliases_loader,
    read_bytes,
    read_text,
)
from runwatch.core.command import DEFAULT_STATE, UsageError, config_error, read_json, state_flag
from runwatch.core.files import write_atomic
from runwatch.core.names import LOOPBACK, PORTS
from runwatch.core.paths import Layout
from runwatch.drill.answer import answer_path, seal_answer
from runwatch.prom.server import free_port, free_ports_in_a_row, port_is_free, prometheus_argv, wait_ready
from runwatch.prom.tools import alertmanager_launch, binary
from runwatch.trainer.config import CLUSTER_INCIDENTS, INCIDENTS, ConfigError, TrainConfig, draw_drill, parse_incident

# A query (a rule's evaluation too) ends after this: the lab's take milliseconds, and `runwatch
# reload` bounds its wait for the new rules' first evaluations by it (runwatch.prom.checks).
QUERY_TIMEOUT_S = 20

# Shared with docker-compose.yml (tests/test_compose.py holds them equal). The external URLs are
# where a learner's browser reaches each server, natively and through compose's published ports,
# so the links in alerts (generatorURL, Alertmanager's) open in both worlds.
# No --web.enable-lifecycle: a web page could POST /-/quit or /-/reload (issue 40, N20), and
# `runwatch reload` sends SIGHUP, as `down` sends SIGTERM. CORS answers only Prometheus's own
# origin (its default, `.*`, let any page read any query); external() moves both with the port.
PROMETHEUS_FLAGS = [
    "--web.cors.origin=" + re.escape(f"http://{LOOPBACK}:{PORTS['prometheus']}"),
    f"--web.external-url=http://{LOOPBACK}:{PORTS['prometheus']}/",
    "--rules.alert.resend-delay=2s",  # an Alertmanager that restarts hears of firing alerts in 2 s, not 1 m
    "--storage.tsdb.retention.time=30d",
    f"--query.timeout={QUERY_TIMEOUT_S}s",
]


ALERTMANAGER_FLAGS = [
    "--cluster.listen-address=",  # one Alertmanager: no gossip port
    f"--web.external-url=http://{LOOPBACK}:{PORTS['alertmanager']}/",
]


PY = [sys.executable, "-m", "runwatch"]  # our own commands, in this interpreter
JOB_TAG = "RUNWATCH_JOB_TAG"  # in the environment of each component and all it starts (Lab.stop)


def loopback(config: str, ports: dict[str, int] = PORTS) -> str:
    """A config file's compose addresses (`http://pager:9095`) as the native lab has them: every
    service on 127.0.0.1, at the port the lab gave it (by default, the same port)."""
    return re.sub(rf"//({'|'.join(map(re.escape, PORTS))}):\d+", lambda m: f"//{LOOPBACK}:{ports[m[1]]}", config)


def external(flags: list[str], url: str) -> list[str]:
    """PROMETHEUS_FLAGS or ALERTMANAGER_FLAGS with the external URL (and CORS origin) of a lab on other ports."""
    moved = {"--web.external-url=": f"{url}/", "--web.cors.origin=": re.escape(url)}
    return [next((k + v for k, v in moved.items() if f.startswith(k)), f) for f in flags]


@dataclass
class Component:
    name: str
    argv: list[str]  # the process's own command line, by which `down` knows it (Lab.process)
    ready_url: str
    url: str
    launch: list[str] = dataclasses.field(default_factory=list)  # execs argv (Alertmanager's namespace)

    @classmethod
    def from_record(cls, name: str, record: dict) -> Component:
        """The component a PID file recorded, to start again as it was."""
        return cls(name, record["argv"], record["ready_url"], record["url"], record.get("launch", []))


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
        self.pager_token = self.state / "pager.token"  # the webhooks' Bearer credential, owner-only
        self.runs = self.state / "runs"
        self._ports: dict[str, int] | None = None  # set by `up` as it starts the lab

    # --- where its components listen (runwatch.core.addresses): chosen by `up`, kept in lab.json ---

    @property
    def ports(self) -> dict[str, int]:
        if self._ports is None:
            return {name: int(u.rsplit(":", 1)[1]) for name, u in lab_urls(self.state).items()}
        return self._ports

    @ports.setter
    def ports(self, ports: dict[str, int]) -> None:
        self._ports = dict(ports)

    def url(self, component: str) -> str:
        """Where this lab serves a component: http://127.0.0.1:PORT."""
        return url_at(self.ports[component])

    def address(self, component: str) -> str:
        """A component's target, as Prometheus scrapes it: 127.0.0.1:PORT."""
        return f"{LOOPBACK}:{self.ports[component]}"

    # --- the configuration Prometheus reads: the repo's files, plus loopback targets ---

    def link_config(self) -> None:
        self.targets.mkdir(parents=True, exist_ok=True)
        self.render_alertmanager_config()
        self.render_prometheus_config()
        self.install_rules()

    def render_prometheus_config(self) -> None:
        """prometheus.yml as the repository has it, with the lab's Alertmanager password on the
        alerting and scrape configs that reach Alertmanager (runwatch.core.credentials)."""
        import yaml  # here: `runwatch status` and `ack` need no YAML

        source, link = self.layout.prometheus_yml, self.prometheus_dir / "prometheus.yml"
        try:
            config = load_yaml(source, "Prometheus's configuration")
        except (FileNotFoundError, BoundedReadError) as err:
            raise UsageError(f"{err}; see `runwatch check`") from None
        auth = {
            "basic_auth": {"username": credentials.USER, "password_file": str(credentials.password_file(self.state))}
        }
        if isinstance(config, dict):  # promtool names what else is wrong
            alerting = config.get("alerting") if isinstance(config.get("alerting"), dict) else {}
            to_am = alerting.get("alertmanagers") if isinstance(alerting.get("alertmanagers"), list) else []
            jobs = config.get("scrape_configs") if isinstance(config.get("scrape_configs"), list) else []
            to_am = [*to_am, *(j for j in jobs if isinstance(j, dict) and j.get("job_name") == "alertmanager")]
            for entry in (e for e in to_am if isinstance(e, dict)):
                entry.update(auth)
        header = (f"# {source}, as `runwatch up` serves it: with the lab's Alertmanager password.\n"
                  f"# Edit {source.name} there, not here.\n")  # fmt: skip
        if link.is_symlink():  # a lab started before the config was rendered
            link.unlink()
        write_atomic(link, header + yaml.safe_dump(config, sort_keys=False, width=120))

    # The rules Prometheus reads are a copy, made at `up` and at each reload: a reload whose
    # rules Prometheus cannot evaluate in time puts the copy in force before it back (issue 28).
    def install_rules(self) -> None:
        """Put a copy of the configuration's rule files in force (state/prometheus/rules); the
        ones in force before go to rules.previous, for restore_rules."""
        rules, previous = self.prometheus_dir / "rules", self.prometheus_dir / "rules.previous"
        staged = self.prometheus_dir / "rules.staged"
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        for f in self.layout.rule_files():  # bounded: a rule file linked to /dev/zero (issue 40)
            try:
                (staged / f.name).write_bytes(read_bytes(f, "a rule file", MAX_RULE_FILE_BYTES))
            except BoundedReadError as err:
                shutil.rmtree(staged, ignore_errors=True)
                raise UsageError(f"{err}; see `runwatch check`") from None
        shutil.rmtree(previous, ignore_errors=True)
        if rules.is_symlink():  # a lab started before the rules were copied
            rules.unlink()
        elif rules.exists():
            rules.rename(previous)
        staged.rename(rules)

    def restore_rules(self) -> None:
        """Put back the rules in force before the last install_rules."""
        rules, previous = self.prometheus_dir / "rules", self.prometheus_dir / "rules.previous"
        if previous.is_dir():
            shutil.rmtree(rules, ignore_errors=True)
            previous.rename(rules)

    def render_alertmanager_config(self) -> None:
        """Alertmanager's config as the repository has it, with loopback addresses, and each
        webhook to the pager carrying the lab's token (pager.token, made here once), which the
        pager asks of every webhook: no other process on the machine can page the learner."""
        import yaml  # here: `runwatch status` and `ack` need no YAML

        self.alertmanager_yml.parent.mkdir(parents=True, exist_ok=True)
        credentials.ensure(self.state)  # Alertmanager's own password, for its --web.config.file
        if not self.pager_token.exists():
            write_atomic(self.pager_token, secrets.token_urlsafe(32) + "\n", mode=0o600)
        source = self.layout.alertmanager_yml
        try:
            text = read_text(source, "Alertmanager's configuration", MAX_RULE_FILE_BYTES)  # bounded (issue 40)
            config = yaml.load(loopback(text, self.ports), Loader=no_aliases_loader())  # noqa: S506 (a SafeLoader)
        except (FileNotFoundError, BoundedReadError) as err:
            raise UsageError(f"{err}; see `runwatch check`") from None
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            line = f" line {where.line + 1}" if where is not None else ""
            problem = getattr(e, "problem", None) or e
            raise UsageError(f"{source}:{line}: not YAML ({problem}); see `runwatch check`") from None
        if not isinstance(config, dict):
            raise UsageError(f"{source}: not an Alertmanager configuration (a mapping); see `runwatch check`")
        pager = self.url("pager") + "/"
        receivers = config.get("receivers") if isinstance(config.get("receivers"), list) else []
        for receiver in (r for r in receivers if isinstance(r, dict)):  # amtool names what else is wrong
            hooks = receiver.get("webhook_configs") if isinstance(receiver.get("webhook_configs"), list) else []
            for hook in (h for h in hooks if isinstance(h, dict)):
                if str(hook.get("url", "")).startswith(pager):
                    auth = {"type": "Bearer", "credentials_file": str(self.pager_token)}
                    given = hook.get("http_config") if isinstance(hook.get("http_config"), dict) else {}
                    hook["http_config"] = {**given, "authorization": auth}
        header = (f"# {source}, as `runwatch up` serves it: compose's service names on loopback, and the\n"
                  f"# lab's token on each webhook to the pager. Edit {source.name} there, not here.\n")  # fmt: skip
        write_atomic(self.alertmanager_yml, header + yaml.safe_dump(config, sort_keys=False, width=120))

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

    def seal_drill(
        self, run_id: str, drill_seed: int | None, seed: int = 0, ranks: int = 1, difficulty: str = "normal"
    ) -> None:
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
        drawn = draw_drill(rng, cluster=ranks > 1, difficulty=difficulty)
        # the training seed is the drawn one, sealed with the answer: `seed` is not a drill's
        cfg = TrainConfig(incident=drawn["incident"], onset=drawn["onset"], seed=drawn["seed"], ranks=ranks,
                          run_id=run_id, strength=drawn.get("strength", 1.0))  # fmt: skip
        seal_answer(self.sealed_answer(run_id), cfg)

    # --- processes ---

    def components(self, args: argparse.Namespace, run_id: str) -> list[Component]:
        """What `up` starts, in order: the trainer (and a healthy control), the pager,
        Alertmanager, Prometheus, which scrapes and alerts on the others, then the console,
        which reads them all. With `--watch` no trainer: the user's job is scraped instead."""
        comps = [self._pager(), self._alertmanager(), self._prometheus(), self._console()]
        if getattr(args, "watch", None):  # `up --watch`: the user's job is the trainer (runwatch.lab.watched)
            return comps
        comps.insert(0, self._trainer(args, run_id))
        if args.control:
            comps.insert(1, self._control(args, run_id))
        return comps

    def _serving(self, name: str, argv: list[str], path: str = "") -> Component:
        url = self.url(name)
        return Component(name, argv, f"{url}/-/ready", f"{url}{path}")

    def _train_argv(self, args: argparse.Namespace, run_id: str, port: int, drill: bool = False) -> list[str]:
        # A drill's seed is read from its sealed answer, never from argv (a replay of it would name the onset).
        seed = [] if drill else ["--seed", str(args.seed)]
        argv = [*PY, "train", *seed, "--run-id", run_id, "--port", str(port)]
        argv += ["--run-dir", str(self.runs / run_id)]
        if not args.no_wait_for_prometheus:  # the lab's clock waits for Prometheus (trainer.live)
            argv += ["--wait-for-prometheus", "--prometheus", self.url("prometheus")]
        return argv + (["--fast-forward", str(args.fast_forward)] if args.fast_forward else [])

    def _trainer(self, args: argparse.Namespace, run_id: str) -> Component:
        argv = self._train_argv(args, run_id, self.ports["trainer"], drill=args.incident == "random")
        argv += ["--incident", args.incident, "--precision", args.precision]
        if args.onset is not None:
            argv += ["--onset", str(args.onset)]
        if args.incident == "random":  # the answer is drawn and sealed by `up`, never in argv
            argv += ["--sealed-answer", str(self.sealed_answer(run_id))]
        if args.ranks > 1:  # rank 0 serves the job's metrics on the trainer's port, as one process does
            argv += ["--ranks", str(args.ranks), "--rank-port-base", str(self.ports["ranks"])]
            argv += ["--launcher-port", str(self.ports["launcher"])]
        return self._serving("trainer", argv, "/metrics")

    def _control(self, args: argparse.Namespace, run_id: str) -> Component:
        """A healthy run of the same seed beside the incident's, on its own port."""
        control_id = f"none-{args.seed}-control-{run_id.rsplit('-', 1)[-1]}"
        argv = self._train_argv(args, control_id, self.ports["control"])
        return self._serving("control", argv, "/metrics")

    def _pager(self) -> Component:
        argv = [*PY, "pager-serve", "--port", str(self.ports["pager"]), "--log", str(self.page_log)]
        argv += ["--runbooks", str(self.layout.runbooks_dir), "--prometheus", self.url("prometheus")]
        argv += ["--token-file", str(self.pager_token)]  # made with Alertmanager's config, before either starts
        return self._serving("pager", argv, "/metrics")

    def _alertmanager(self) -> Component:
        argv = [binary("alertmanager"), f"--config.file={self.alertmanager_yml}"]
        argv += [f"--storage.path={self.state / 'alertmanager-data'}"]
        argv += [f"--web.listen-address={self.address('alertmanager')}"]
        argv += [f"--web.config.file={credentials.folder(self.state) / 'web.yml'}"]  # its password (issue 40)
        argv += external(ALERTMANAGER_FLAGS, self.url("alertmanager"))
        # its API: Debian's Alertmanager has no web UI, and its root page says only that
        comp = self._serving("alertmanager", argv, "/api/v2/alerts")
        comp.launch = alertmanager_launch(argv[0])  # its template where Debian's build looks
        return comp

    def _console(self) -> Component:
        argv = [*PY, "console", "--port", str(self.ports["console"]), "--state-dir", str(self.state)]
        for name in ("prometheus", "alertmanager", "pager"):
            argv += [f"--{name}", self.url(name)]
        return self._serving("console", argv, "/")

    def _prometheus(self) -> Component:
        config, tsdb = self.prometheus_dir / "prometheus.yml", self.state / "prometheus-data"
        flags = external(PROMETHEUS_FLAGS, self.url("prometheus"))
        argv = prometheus_argv(binary("prometheus"), config, tsdb, self.ports["prometheus"], *flags)
        return self._serving("prometheus", argv, "/api/v1/targets")  # no web UI: its API

    def start(self, comp: Component) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{comp.name}.log", "ab") as log, _Interrupts.held_back():
            # A session of its own: Ctrl-C in the terminal reaches `up`, which stops them in order.
            tag = secrets.token_hex(8)  # inherited by all it starts: `stop` finds them by it (_job)
            proc = subprocess.Popen(
                [*comp.launch, *comp.argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, JOB_TAG: tag},
            )  # fmt: skip
            # The start time with the PID: a PID the kernel reuses for another process is not ours.
            started = psutil.Process(proc.pid).create_time()
            record = {
                "pid": proc.pid,
                "create_time": started,
                "argv": comp.argv,
                "launch": comp.launch,
                "ready_url": comp.ready_url,
                "url": comp.url,
                "tag": tag,
            }
            write_atomic(self.pids / f"{comp.name}.json", json.dumps(record) + "\n")
        if not wait_ready(comp.ready_url, 60, proc, auth=self.auth(comp.name)):
            raise UsageError(f"{comp.name} did not start: {self.log_tail(comp.name)}")
        return proc.pid

    def auth(self, name: str) -> tuple[str, str] | None:
        """What a client of the component carries: the password, for Alertmanager (issue 40)."""
        return credentials.basic_auth(self.state) if name == "alertmanager" else None

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
                record = read_json(path, "a PID file")
                shape = {"pid": int, "argv": list}
                wrong = [k for k, kind in shape.items() if not isinstance(record.get(k), kind)]
                if wrong:  # valid JSON of the wrong shape names no process either
                    raise UsageError(f"{path}: a PID file is damaged (no {wrong[0]}); `runwatch down` removes it")
                records[path.stem] = record
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
        # Its whole job, not only its first process: a launcher killed -9 left mpiexec, its
        # proxy and the ranks training on, holding the trainer's port (issue 28).
        members = self._job(record)
        if proc is not None:
            proc.terminate()
            if not self._exits(record, timeout):
                proc.kill()
                self._exits(record, 5)
        if members:
            for member in members:
                with contextlib.suppress(psutil.Error):
                    member.terminate()
            _, left = psutil.wait_procs(members, timeout=timeout)
            for member in left:
                with contextlib.suppress(psutil.Error):
                    member.kill()
            psutil.wait_procs(left, timeout=5)
        path.unlink(missing_ok=True)
        return proc is not None or bool(members)

    @staticmethod
    def _job(record: dict) -> list[psutil.Process]:
        """Every other process that carries the component's tag in its environment: all that it
        started, however they were detached (mpiexec, its proxy and each rank set up sessions of
        their own) and after it died (then they are init's children, in no tree of its)."""
        tag = record.get("tag")
        if not isinstance(tag, str) or not tag:
            return []
        found = []
        for other in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if other.pid != record.get("pid") and other.environ().get(JOB_TAG) == tag:
                    found.append(other)
        return found

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
    return UsageError(
        f"port {port} is already in use ({name}): stop what holds it, `runwatch down` a lab, or move it with --ports"
    )


def choose_ports(asked: dict[str, int], ranks: int) -> dict[str, int]:
    """Every component's port: the documented one unless --ports names it, 0 being a free port
    (for the ranks, the first of `ranks` free ports in a row)."""
    ports = {**DEFAULT_PORTS, **asked}
    for name, port in ports.items():
        if port == 0:
            ports[name] = free_ports_in_a_row(ranks) if name == "ranks" else free_port()
    return ports


def add_ports(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ports", type=parse_ports, default={}, metavar="free|NAME=PORT,...",
        help=f"move components off their documented ports ({', '.join(DEFAULT_PORTS)}; 0: a free port), "
        "or `free` for all: labs in other state directories then run side by side",
    )  # fmt: skip


def check_run(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, a run the trainer would refuse once started."""
    try:
        name, strength = ("none", 1.0) if args.incident == "random" else parse_incident(args.incident)
    except ConfigError as err:
        raise UsageError(f"--incident: {err.problem}") from None
    if name not in (*INCIDENTS, *CLUSTER_INCIDENTS, "none"):
        known = ", ".join((*INCIDENTS, *CLUSTER_INCIDENTS))
        raise UsageError(f"--incident: unknown incident {args.incident!r}; choose one of {known}, random")
    cfg = TrainConfig(incident=name, strength=strength, seed=args.seed, precision=args.precision, ranks=args.ranks)
    try:
        dataclasses.replace(cfg, onset=cfg.onset if args.onset is None else args.onset).validate()
    except ConfigError as err:
        raise (UsageError(f"--incident: {err.problem}") if err.field == "strength" else config_error(err)) from None


def up(args: argparse.Namespace) -> int:
    check_run(args)
    lab = Lab(args.state_dir, args.root)
    # `kill` stops the lab as Ctrl-C does, never orphaning it: while starting (start_lab stops
    # what had started) and in the foreground.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _Interrupts.handle)
    with lab.locked(wait=False):
        run_id = start_lab(lab, args)
    what = f"run {run_id}" if run_id else f"watching {', '.join(args.watch)}"
    print(f"{what}: pages with `runwatch pager --follow --log {lab.page_log}`; "
          f"stop with `runwatch down{state_flag(args.state_dir)}`")  # fmt: skip
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


def start_lab(lab: Lab, args: argparse.Namespace) -> str | None:
    """Start every component in order, under the lab's lock; on any failure stop what started."""
    running = [n for n, r in lab.records().items() if lab.alive(r)]
    if running:
        raise UsageError(f"a lab is already running in {lab.state} ({', '.join(running)}): `runwatch down` first")
    from runwatch.trainer.live import unique_run_id  # the trainer's, and numpy: `up` alone needs them

    watched = getattr(args, "watch", None)  # the user's job serves its own run id (runwatch.watch)
    label = "drill" if args.incident == "random" else f"{args.incident}-{args.seed}"
    run_id = None if watched else unique_run_id(label)
    lab.ports = ports = choose_ports(args.ports, args.ranks)
    comps = lab.components(args, run_id)  # finds the binaries first: a missing one says what to install
    for comp in comps:
        if not port_is_free(ports[comp.name]):
            raise _port_owner_error(comp.name, ports[comp.name])
    for rank in range(args.ranks if args.ranks > 1 else 0):  # one rank serves on the trainer's port
        if not port_is_free(ports["ranks"] + rank):
            raise _port_owner_error(f"trainer rank {rank}", ports["ranks"] + rank)
    if args.ranks > 1 and not port_is_free(ports["launcher"]):
        raise _port_owner_error("trainer launcher", ports["launcher"])
    for stale in lab.records():
        (lab.pids / f"{stale}.json").unlink()
    lab.link_config()
    trainers = watched or [lab.address("trainer")] + ([lab.address("control")] if args.control else [])
    lab.write_target("trainer", trainers)
    cluster = args.ranks > 1
    lab.write_groups("ranks", rank_targets(run_id, args.ranks, ports["ranks"]) if cluster else [])
    lab.write_target("launcher", [lab.address("launcher")] if cluster else [])
    for name in ("prometheus", "alertmanager", "pager"):
        lab.write_target(name, [lab.address(name)])
    if args.incident == "random":
        lab.seal_drill(run_id, args.drill_seed, args.seed, args.ranks, getattr(args, "difficulty", "normal"))
    # started_at: `runwatch pager` shows this lab's pages, not those of earlier labs; urls: where
    # every command that talks to this lab finds it (runwatch.core.addresses)
    urls = {name: lab.url(name) for name in ports}
    record = {"run_id": run_id, "root": str(lab.layout.root), "started_at": time.time(), "urls": urls}
    if watched:
        record["watch"] = watched
    write_atomic(lab.state / "lab.json", json.dumps(record) + "\n")
    print(f"console: {lab.url('console')}/ (the run, its pages and runbooks, ack and diagnose)", flush=True)
    try:
        for comp in comps:
            lab.start(comp)
            print(f"  {comp.name:13s} {comp.url}", flush=True)
        for rank in range(args.ranks if cluster else 0):  # the trainer's ranks and launcher: targets of their own
            print(f"  {f'rank {rank}':13s} {url_at(ports['ranks'] + rank)}/metrics", flush=True)
        if cluster:
            print(f"  {'launcher':13s} {lab.url('launcher')}/metrics", flush=True)
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
