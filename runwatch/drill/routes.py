"""Alertmanager's route timings as they are in force: one home for reading group_wait,
group_interval and repeat_interval out of alertmanager.yml, with Alertmanager's inheritance (a
route without its own takes its parent's; the root, Alertmanager's defaults). The drill's par
(coach.py) and its window for confirming a page (confirm.py) both read them here, and each
duration with runwatch.core.durations; tests/test_durations.py fails on a second reader.

Alertmanager resolves them only inside its dispatcher. Neither its API (/api/v2/status gives the
configuration as written, without even the root's defaults) nor `amtool config routes` (matchers
and receivers only, in every output format) says what a route's group_wait is in force, so there
is nothing to ask. Not a router: only a severity matcher of a top-level route is matched here.

    >>> route_for("warning", Path("alertmanager/alertmanager.yml")).seconds("group_wait")
    5.0
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runwatch.core.durations import duration_seconds

# Alertmanager's own, for a root route that gives none (its config.DefaultRouteOpts)
DEFAULTS = {"group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"}
SEVERITY_MATCHER = re.compile(r'\s*severity\s*(=~|=)\s*"([^"]*)"\s*')


@dataclass(frozen=True)
class Route:
    """One route of alertmanager.yml, with the timings in force for it (as written, e.g. "5s")."""

    source: Path
    matchers: tuple[str, ...]
    timings: dict[str, str]
    depth: int  # 0: the root; 1: one of its routes

    def seconds(self, key: str) -> float:
        """A timing in seconds; a one-line DurationError naming the file if it is not a duration."""
        return duration_seconds(str(self.timings[key]), f"{self.source}: route's {key}")

    def takes_severity(self, severity: str) -> bool:
        """Whether one of its matchers is on severity and takes this one (`=` or `=~`)."""
        for matcher in self.matchers:
            m = SEVERITY_MATCHER.fullmatch(str(matcher))
            if m and (severity == m[2] if m[1] == "=" else re.fullmatch(m[2], severity)):
                return True
        return False


def load(alertmanager_yml: Path) -> dict:
    """The file's `route` (KeyError if it has none; OSError, yaml.YAMLError as they come)."""
    import yaml  # here: the drill's commands that read no route need no YAML

    return yaml.safe_load(Path(alertmanager_yml).read_text())["route"]


def routes(alertmanager_yml: Path) -> list[Route]:
    """Every route, the root first and then depth-first, each with its timings in force."""
    source = Path(alertmanager_yml)

    def walk(route: dict, inherited: dict[str, str], depth: int) -> Iterator[Route]:
        own = {**inherited, **{k: route[k] for k in DEFAULTS if k in route}}
        yield Route(source, tuple(route.get("matchers") or ()), own, depth)
        for child in route.get("routes") or []:
            yield from walk(child, own, depth + 1)

    return list(walk(load(source), DEFAULTS, 0))


def route_for(severity: str, alertmanager_yml: Path) -> Route:
    """The first top-level route whose severity matcher takes this severity, else the root: the
    route an alert of that severity is grouped and paged by."""
    every = routes(alertmanager_yml)
    return next((r for r in every if r.depth == 1 and r.takes_severity(severity)), every[0])
