"""A lab's state directory: where it keeps each thing, and where its components listen.

Every part of the lab (render, argv, processes, locks) reads its paths from here, and `Lab`
(supervise.py) is this directory with those parts added. Use it on its own for a lab's paths
and addresses without starting anything:

    >>> LabDir(Path(".runwatch")).page_log
"""

from __future__ import annotations

from pathlib import Path

from runwatch.core.addresses import lab_urls
from runwatch.core.addresses import url as url_at
from runwatch.core.command import DEFAULT_STATE
from runwatch.core.names import LOOPBACK
from runwatch.core.paths import Layout
from runwatch.drill.answer import answer_path


class LabDir:
    """One lab's state directory: its paths, and the ports its components listen on."""

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

    def sealed_answer(self, run_id: str) -> Path:
        """Where a drill's answer is sealed (runwatch.drill.answer), in the run's directory."""
        return answer_path(self.runs / run_id)
