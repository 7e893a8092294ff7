"""What the console reads, each over HTTP from the component that holds it.

Prometheus: the runs and the plate, through the very queries of the "Watching a Run" dashboard
(runwatch.readouts.dashboard_queries and runwatch.readouts.picture run them, so there is one copy of the PromQL).
Alertmanager: which alerts fire unacknowledged. The pager: the page log and the runbooks.
Nothing here decides whether an alert fired: the rules did, and the page log says so.

Do not use this to act: acks and diagnoses go through `runwatch ack` and `runwatch diagnose`
(console.app), so the console grades and silences exactly as the command line does.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import requests

from runwatch.core.bounded import load_json_object
from runwatch.core.names import WATCH_GRACE_S
from runwatch.core.paths import Layout
from runwatch.prom.server import PromQLError, instant, quoted
from runwatch.readouts import colours
from runwatch.readouts import dashboard_queries as dq
from runwatch.readouts.picture import PANELS, PlateData, collect

ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")  # a run's folder under the lab's runs/
# the plate's panels the console draws: the plate's three, then Lesson 20's stability row
# (a mixed-precision run's loss scale and activation norm; empty, and hidden, in fp64)
PLATE_PANELS = ("loss", "grad", "throughput", "scale", "norm")
RUNS_LOOKBACK_S = 7 * 24 * 3600  # the run picker offers every run started in the last week
TIMEOUT_S = 5


# The dashboard's cluster-row panels the console shows, each as a field of a rank (or the job's)
RANK_FIELDS = {
    ("Compute time per rank", "A"): "compute", ("Collective wait per rank", "A"): "wait",
    ("Collective sequence number", "A"): "seq", ("Seconds since each rank's last step", "A"): "since",
    ("GPU temperature", "A"): "temp", ("GPU SM clock", "A"): "clock", ("GPU XID errors", "A"): "xid",
    ("Restarts, steps lost, ETTR", "A"): "restarts", ("Restarts, steps lost, ETTR", "B"): "lost",
    ("Restarts, steps lost, ETTR", "C"): "ettr",
}  # fmt: skip
JOB_FIELDS = ("restarts", "lost", "ettr")
# The cluster row over time, as the dashboard draws it: each rank's step time and collective wait
RANK_HISTORY = {("Step time per rank", "A"): "steptime", ("Collective wait per rank", "A"): "wait",
                ("Compute time per rank", "A"): "compute"}  # fmt: skip
RANK_HISTORY_S = 600  # the last ten minutes of the run: a straggler's onset and what followed
RANKS_WINDOW_S = 60  # a rank last scraped longer ago than this is not shown
# A run whose step was last scraped longer ago than this (five 1 s scrape intervals, as
# TrainerDown counts a target) has stopped: stopped with Ctrl-C it records no end time. Natively,
# not while its run.json was written as recently (its trainer does so at every step).
LIVE_WITHIN_S = 5


def _last_value(series: dict) -> float | None:
    value = float(series["values"][-1][1]) if series.get("values") else float(series["value"][1])
    return None if math.isnan(value) else value


class UnavailableError(RuntimeError):
    """A component did not answer; the message names it and its address."""


@dataclass
class Sources:
    """Where the console reads from (server side) and what it links to (the learner's browser).

    In compose the two differ: the console reaches Prometheus as http://prometheus:9090, the
    browser as http://127.0.0.1:9090.
    """

    prometheus: str
    alertmanager: str
    pager: str
    prometheus_link: str = ""
    grafana_link: str = ""
    state_dir: Path | None = None  # the native lab's: its run, and its drill
    dashboard: dict = field(default_factory=dict)
    _has_ui: bool | None = None  # whether this Prometheus serves its web UI (Debian's 3.x build has none)

    def __post_init__(self) -> None:
        self.prometheus, self.alertmanager, self.pager = (
            u.rstrip("/") for u in (self.prometheus, self.alertmanager, self.pager)
        )
        self.prometheus_link = (self.prometheus_link or self.prometheus).rstrip("/")
        self.grafana_link = self.grafana_link.rstrip("/")
        if not self.dashboard:
            self.dashboard = dq.load(Layout().dashboards_dir / "watching-a-run.json")

    # --- runs ---

    def runs(self, now: float | None = None) -> list[str]:
        """Every run Prometheus holds from the last week, newest first: the dashboard's $run."""
        end = now if now is not None else time.time()
        [variable] = [q for q in dq.queries(self.dashboard) if q.kind == "variable" and q.title == "run"]
        try:
            return [r["metric"]["value"] for r in dq.run(self.prometheus, variable, {}, end - RUNS_LOOKBACK_S, end)]
        except (requests.RequestException, PromQLError) as err:
            raise UnavailableError(f"Prometheus at {self.prometheus} did not answer ({type(err).__name__})") from None

    def runs_lab_first(self, runs: list[str]) -> list[str]:
        """The picker's runs: the lab's own first (even before Prometheus holds a sample of it),
        then the others, newest first."""
        lab = self.lab_run()
        return list(dict.fromkeys(runs if lab is None else [lab, *runs]))  # each run once

    def lab_run(self) -> str | None:
        """The native lab's current run (its lab.json), if the console was given its state dir."""
        if self.state_dir is None:
            return None
        try:
            run_id = load_json_object(self.state_dir / "lab.json", "the lab's record")["run_id"]
        except (OSError, ValueError, KeyError, TypeError):  # BoundedReadError is a ValueError
            return None
        # `up --watch` runs no trainer of its own (run_id null): the newest run is shown
        return run_id if isinstance(run_id, str) and run_id else None

    def run_info(self, run_id: str) -> dict[str, Any]:
        """A run's start and end (Unix seconds; end None while it runs) and whether it is a drill."""
        sel = f'{{run_id="{quoted(run_id)}"}}'
        window = f"[{RUNS_LOOKBACK_S}s]"

        def last(metric: str) -> float | None:
            found = instant(self.prometheus, f"last_over_time({metric}{sel}{window})")
            return float(found[0]["value"][1]) if found else None

        try:
            started, ended = last("runwatch_train_run_start_time_seconds"), last("runwatch_train_run_end_time_seconds")
            info = instant(self.prometheus, f"last_over_time(runwatch_train_run_info{sel}{window})")
            step = last("runwatch_train_step")
            # how long Prometheus has gone without a sample of the run, within the last 5 minutes (a
            # failed scrape or a target gone marks the series stale at once, so not its lookback)
            unseen = instant(self.prometheus, f"time() - max_over_time(timestamp(runwatch_train_step{sel})[5m:1s])")
        except (requests.RequestException, PromQLError) as err:
            raise UnavailableError(f"Prometheus at {self.prometheus} did not answer ({type(err).__name__})") from None
        incident = info[0]["metric"].get("incident", "") if info else ""
        away = float(unseen[0]["value"][1]) if unseen else None
        record = self.run_record(run_id)
        if ended is not None or step is None:
            paused, stopped = False, False
        elif record is not None and record.get("paused_since"):  # the trainer's own word: it holds
            paused, stopped = True, False
        else:  # it ended, or Prometheus has lost it (a trainer killed -9 leaves run.json "running")
            # A live trainer rewrites run.json at every step: natively, its own fresh word that it
            # runs outweighs a few late scrapes (a starved host, a scrape that timed out).
            fresh = record is not None and record.get("status") == "running" and self._written_within(run_id)
            lost = (away is None or away > LIVE_WITHIN_S) and not fresh
            paused, stopped = False, lost or (record is not None and record.get("status") != "running")
        return {
            "started": started, "ended": ended, "drill": incident == "hidden", "incident": incident,
            "step": None if step is None else int(step), "stopped": stopped, "known": record is not None,
            "paused_for": away if paused and away is not None and away > WATCH_GRACE_S else None,
            "unseen": away,
        }  # fmt: skip

    def run_record(self, run_id: str) -> dict | None:
        """The native lab's run.json of a run (its trainer's own word on whether it runs, holds
        for Prometheus, or ended), if the console was given the lab's state dir."""
        if self.state_dir is None or not RUN_ID.fullmatch(run_id):
            return None
        try:
            record = load_json_object(self.state_dir / "runs" / run_id / "run.json", "the run's record")
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def _written_within(self, run_id: str, seconds: float = LIVE_WITHIN_S) -> bool:
        """Whether the run's run.json was last written within `seconds` (it is, at every step)."""
        try:
            return time.time() - (self.state_dir / "runs" / run_id / "run.json").stat().st_mtime <= seconds
        except (OSError, TypeError):
            return False

    # --- the cluster: each rank now ---

    def ranks(self, run_id: str, now: float | None = None) -> dict[str, Any]:
        """Each rank of a cluster run as last scraped, and the launcher's restarts, steps lost and
        ETTR, through the dashboard's cluster-row queries; no ranks for a run of one process."""
        end = now if now is not None else time.time()
        rows: dict[str, dict[str, Any]] = {}  # by instance: a rank's series and its GPU's share it
        job: dict[str, float] = {}
        try:
            for q in dq.queries(self.dashboard):
                field = RANK_FIELDS.get((q.title, q.ref))
                if field is None:
                    continue
                for series in dq.run(self.prometheus, q, {"run": run_id}, end - RANKS_WINDOW_S, end):
                    value = _last_value(series)
                    if field in JOB_FIELDS:
                        job[field] = value
                        continue
                    row = rows.setdefault(series["metric"].get("instance", ""), {})
                    row[field] = value
                    row.update({k: series["metric"][k] for k in ("rank", "node") if k in series["metric"]})
        except (requests.RequestException, PromQLError) as err:
            raise UnavailableError(f"Prometheus at {self.prometheus} did not answer ({type(err).__name__})") from None
        ranked = sorted((r for r in rows.values() if "rank" in r), key=lambda r: int(r["rank"]))
        return {"ranks": ranked, "job": job}

    def rank_history(self, run_id: str, now: float | None = None) -> dict[str, Any]:
        """Each rank's step time, collective wait and compute time over the last RANK_HISTORY_S seconds, one
        curve a rank on one time axis (Unix seconds), as uPlot takes them, through the
        dashboard's own queries; and `odd`: the ranks a firing alert of the run names (what
        Prometheus says fires, read here, never decided here). Empty for a run of one process."""
        end = now if now is not None else time.time()
        out: dict[str, Any] = {}
        try:
            for q in dq.queries(self.dashboard):
                key = RANK_HISTORY.get((q.title, q.ref))
                if key is not None:
                    out[key] = _by_rank(dq.run(self.prometheus, q, {"run": run_id}, end - RANK_HISTORY_S, end))
            sel = f'ALERTS{{alertstate="firing",run_id="{quoted(run_id)}",rank!=""}}'
            odd = sorted({s["metric"]["rank"] for s in instant(self.prometheus, sel, end)}, key=int)
        except (requests.RequestException, PromQLError) as err:
            raise UnavailableError(f"Prometheus at {self.prometheus} did not answer ({type(err).__name__})") from None
        return {"history": out, "odd": odd}

    # --- the plate ---

    def plate(self, run_id: str, now: float | None = None) -> dict[str, Any]:
        """The run's plate by training step, as uPlot draws it: for each panel the steps and one
        list of values per curve (None where a curve has no point), the incident windows (in a
        drill, none until it is graded), the step each alert first fired at, and a Prometheus link per panel."""
        info = self.run_info(run_id)
        end = now if now is not None else time.time()
        if info["ended"] is not None:
            end = min(end, info["ended"] + 5)
        start = (info["started"] or end - 900) - 5
        try:
            data = collect(self.prometheus, run_id, since_s=max(end - start, 10), now=end)
        except (requests.RequestException, PromQLError) as err:
            raise UnavailableError(f"Prometheus at {self.prometheus} did not answer ({type(err).__name__})") from None
        return {
            "run_id": run_id,
            "drill": info["drill"],
            "started": info["started"],
            "ended": info["ended"],
            "stopped": info["stopped"],
            "known": info["known"],
            "step": info["step"],
            # the lab's trainer holds its clock while Prometheus has not scraped it (trainer.live)
            "paused_for": info["paused_for"],
            "unseen": info["unseen"],
            "panels": {key: aligned(data, key) for key in PLATE_PANELS},
            "incident": self.revealed(run_id) if info["drill"] else data.incident,
            "readouts": data.readouts,
            "links": {key: self.graph_link(key, run_id, end - start) for key in ("loss", "grad", "throughput")}
            if self.has_ui()
            else {},
        }

    def has_ui(self) -> bool:
        """Whether Prometheus serves its web UI, asked once: upstream's builds (compose's image)
        do, at /query; Debian's 3.x build has none (/query answers 404), and a link into it
        would be a dead page, so none is offered."""
        if self._has_ui is None:
            try:
                found = requests.get(f"{self.prometheus}/query", timeout=TIMEOUT_S).status_code == 200
            except requests.RequestException:
                return False  # ask again next time
            self._has_ui = found
        return self._has_ui

    def graph_link(self, key: str, run_id: str, range_s: float) -> str:
        """The panel's queries, opened in Prometheus's query page (ask `has_ui` first)."""
        params: dict[str, str] = {}
        panel = [q for q in dq.queries(self.dashboard) if q.kind == "panel" and q.title == PANELS[key]]
        for i, q in enumerate(panel):
            params[f"g{i}.expr"] = dq.substitute(q.expr, {"run": run_id}, range_s, q)
            params[f"g{i}.tab"] = "0"
            params[f"g{i}.range_input"] = f"{max(int(range_s // 60) + 1, 1)}m"
        return f"{self.prometheus_link}/query?{urlencode(params)}"

    def rules_link(self) -> str:
        """Prometheus's alerting rules page, or "" where it serves no UI."""
        return f"{self.prometheus_link}/alerts" if self.has_ui() else ""

    def grafana(self, run_id: str) -> str:
        """The Grafana dashboard for the run, where Grafana runs (compose); "" natively."""
        if not self.grafana_link:
            return ""
        return f"{self.grafana_link}/d/runwatch-watching-a-run?var-run={quote(run_id)}"

    # --- pages, acks, runbooks ---

    def incidents(self, run_id: str) -> list[dict[str, Any]]:
        """The run's incidents as the pager groups them: open ones first, oldest first, each
        with its pages, state changes and ack."""
        try:
            resp = requests.get(f"{self.pager}/api/incidents", params={"run_id": run_id}, timeout=TIMEOUT_S)
            resp.raise_for_status()
            found = resp.json()["incidents"]
        except (requests.RequestException, ValueError, KeyError) as err:
            raise UnavailableError(f"the pager at {self.pager} did not answer ({type(err).__name__})") from None
        return [i for i in found if isinstance(i, dict)]

    def runbook(self, alert: str) -> str | None:
        """The runbook's Markdown, as the pager serves it; None if there is none."""
        if not ALERT_NAME.fullmatch(alert):
            return None
        try:
            resp = requests.get(f"{self.pager}/runbooks/{alert}.md", timeout=TIMEOUT_S)
        except requests.RequestException as err:
            raise UnavailableError(f"the pager at {self.pager} did not answer ({type(err).__name__})") from None
        return resp.text if resp.status_code == 200 else None

    # --- the drill ---

    def revealed(self, run_id: str) -> list[list[int]]:
        """A drill's incident windows once `runwatch diagnose` has graded it (drill.json's grade,
        runwatch.drill.coach); none before: the plate hides them until then."""
        record = self.drill()
        found = (record or {}).get("grade", {}).get("revealed") if (record or {}).get("run_id") == run_id else None
        if not isinstance(found, list):
            return []
        return [[w[0], w[1]] for w in found if isinstance(w, list) and len(w) == 2 and all(type(s) is int for s in w)]

    def drill(self) -> dict[str, Any] | None:
        """The native lab's drill record (drill.json), if there is one."""
        if self.state_dir is None:
            return None
        try:
            record = load_json_object(self.state_dir / "drill.json", "the drill's record")  # bounded (issue 40, B9)
        except (OSError, ValueError):  # BoundedReadError is a ValueError
            return None
        return record if isinstance(record, dict) and isinstance(record.get("run_id"), str) else None


def _by_rank(found: list[dict]) -> dict[str, Any]:
    """A range query's series, one a rank, on one time axis: {"times", "series": [{"label",
    "rank", "values"}]}, rank by rank (None where a rank has no sample)."""
    times = sorted({float(t) for s in found for t, _ in s["values"]})
    series = []
    for s in sorted(found, key=lambda s: int(s["metric"].get("rank", "0") or 0)):
        at = {float(t): float(v) for t, v in s["values"] if math.isfinite(float(v))}
        rank = s["metric"].get("rank", "")
        series.append({"label": f"rank {rank}", "rank": rank, "values": [at.get(t) for t in times]})
    return {"times": times, "series": series}


def aligned(data: PlateData, key: str) -> dict[str, Any]:
    """One panel's curves on one x axis of steps, as uPlot takes them ([x, y1, y2, ...])."""
    curves = data.series.get(key, {})
    steps = sorted({s for pts in curves.values() for s, _ in pts})
    series = []
    for label, pts in curves.items():
        at = {s: v for s, v in pts if math.isfinite(v)}  # JSON has no NaN; a gap draws as one
        # its colour by what it means (readouts.colours), as the plate PNG and Grafana draw it
        series.append({"label": label, "values": [at.get(s) for s in steps], "colour": colours.colour(label)})
    return {"steps": steps, "series": series}
