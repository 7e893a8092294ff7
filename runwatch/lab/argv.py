"""What `up` starts and with which command lines: each component's argv, its flags and the
URL that says it is ready. Nothing here starts a process (processes.py does).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass

from runwatch.core import credentials
from runwatch.core.names import LOOPBACK, PORTS
from runwatch.lab.state import LabDir
from runwatch.prom.server import prometheus_argv
from runwatch.prom.tools import alertmanager_launch, binary

# A query (a rule's evaluation too) ends after this: the lab's take milliseconds, and `runwatch
# reload` bounds its wait for the new rules' first evaluations by it (runwatch.prom.checks).
QUERY_TIMEOUT_S = 20

# How soon Prometheus sends a firing alert again: a drill's window for a page counts it
# (runwatch.drill.confirm).
RESEND_DELAY_S = 2

# Shared with docker-compose.yml (tests/test_compose.py holds them equal). The external URLs are
# where a learner's browser reaches each server, natively and through compose's published ports,
# so the links in alerts (generatorURL, Alertmanager's) open in both worlds.
# No --web.enable-lifecycle: a web page could POST /-/quit or /-/reload (issue 40, N20), and
# `runwatch reload` sends SIGHUP, as `down` sends SIGTERM. CORS answers only Prometheus's own
# origin (its default, `.*`, let any page read any query); external() moves both with the port.
PROMETHEUS_FLAGS = [
    "--web.cors.origin=" + re.escape(f"http://{LOOPBACK}:{PORTS['prometheus']}"),
    f"--web.external-url=http://{LOOPBACK}:{PORTS['prometheus']}/",
    f"--rules.alert.resend-delay={RESEND_DELAY_S}s",  # a restarted Alertmanager hears of firing alerts in 2 s, not 1 m
    "--storage.tsdb.retention.time=30d",
    f"--query.timeout={QUERY_TIMEOUT_S}s",
]


ALERTMANAGER_FLAGS = [
    "--cluster.listen-address=",  # one Alertmanager: no gossip port
    f"--web.external-url=http://{LOOPBACK}:{PORTS['alertmanager']}/",
]


PY = [sys.executable, "-m", "runwatch"]  # our own commands, in this interpreter


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


class Argv(LabDir):
    """The components a lab runs, as command lines."""

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
