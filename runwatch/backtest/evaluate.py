"""Stage 4 of the backtest: each alert read on the grid of a Prometheus that holds the runs.

    runs, unattributed = evaluate(prom, rules, how, meta, progress)

`prom` is any server with the runs' series (data.throwaway's, or another source's) and the grid
to read them on; `how` is the plan's: the recordings it backfills first, pass by pass, and each
alert's firing query, in which Prometheus evaluates its `for:` or `keep_firing_for:`. Each run's
readout is its step at the first evaluation where an alert fired (for a fault, seconds from it),
how often each alert began to fire, and with ranks the ranks each one named.

Python renames and counts what Prometheus returns; it never decides whether an alert fired.
Imports the rules, the plan and the data of the stages; never the report.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runwatch.backtest.data import GRID_PHASE_MS, Progress, Throwaway, identity, server, snapshot
from runwatch.backtest.datacache import DataCache
from runwatch.backtest.plan import ALL_INCIDENTS, LOOKBACK, Plan
from runwatch.backtest.remote_write import push, write_request
from runwatch.backtest.rules import Rules
from runwatch.exporter.metrics import STEP
from runwatch.prom.server import query_range
from runwatch.trainer.offline import DEFAULT_START

# Alert queries in flight at once; Prometheus's own limit (--query.max-concurrency) is 20.
MAX_QUERIES = 16
RESULTS_FORMAT = 2  # an alert's kept result: each series that fired, when it first did, and how often it began


@dataclass
class Result:
    runs: list[dict]  # {"incident", "seed", "run_id", "first_fire": {alert: step | None}}
    unattributed: dict[str, int]  # alert -> firing series that belong to no run
    alerts: list[str]
    seconds: dict[str, float]
    samples: int
    cached: bool = False  # the runs' data came from the cache
    ranks: int = 1  # every run data-parallel over this many ranks


@dataclass
class Kept:
    """Alert results kept with the runs' cache entry `key`: a query evaluated once on this data,
    this grid and these backfilled recordings is read back, not evaluated again."""

    cache: DataCache
    key: str
    grid: dict  # everything besides the query's text that its result follows from

    def get(self, query: str) -> list[dict] | None:
        return self.cache.result(self.key, {**self.grid, "query": query})

    def put(self, query: str, found: list[dict]) -> None:
        self.cache.keep(self.key, {**self.grid, "query": query}, found)


def kept_for(cache: DataCache, key: str, prom: Throwaway, how: Plan, prometheus: str, promtool: str) -> Kept:
    """The alert results kept with the runs' cache entry `key`, for this grid and this plan's
    backfilled recordings, as read by these binaries."""
    grid = {"format": RESULTS_FORMAT, "start": prom.start, "end": prom.end, "lookback": LOOKBACK,
            "prometheus": identity(prometheus), "promtool": identity(promtool), "backfilled": how.passes}  # fmt: skip
    return Kept(cache, key, grid)


def evaluate(
    prom: Throwaway, rules: Rules, how: Plan, meta: list[dict], progress: Progress, kept: Kept | None = None,
    ranks: int = 1, timings: dict[str, float] | None = None,
) -> tuple[list[dict], dict[str, int]]:  # fmt: skip
    """The plan's backfill, then every alert read on prom's grid: (each run's readouts, in the
    table's order; alert -> firing series that belong to no run). `meta` holds each run's
    incident, seed, run_id and end (and fault_at for a fault); `kept` reads and keeps alert results
    in the cache; `timings` gets each step's seconds."""
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    backfill(prom, how.passes, progress)
    timings["backfill_rules"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    alerts = list(dict.fromkeys(r["alert"] for r in rules.alerting))
    first, unattributed, step_at, named, began = read_alerts(
        prom, rules, how.queries, {m["run_id"] for m in meta}, progress, kept
    )
    timings["alerts"] = time.perf_counter() - t0
    return readouts(meta, alerts, first, step_at, began, named, ranks), unattributed


def backfill(prom: Throwaway, passes: list[list[dict]], progress: Progress) -> None:
    """The recordings that are not inlined, pass by pass on the grid. Each
    rule's expression is evaluated on the grid's whole seconds, where the inlined subqueries
    evaluate, and loaded as a block beside the runs, the way the runs are loaded. (promtool's
    `create-blocks-from rules` would evaluate at its group's phase, a hash of the group's name
    and file that changes between Prometheus versions.)"""
    for i, level in enumerate(passes, 1):
        progress(f"backfilling {len(level)} rules (pass {i}/{len(passes)})")
        with prom.running():
            found = [(rule, query_range(prom.base, rule["expr"], prom.start, prom.end)) for rule in level]
        body, _ = write_request(
            (rule["record"], sorted({**_labels(s["metric"]), **rule.get("labels", {})}.items()),
             [float(v) for _, v in s["values"]], [round(float(t) * 1000) for t, _ in s["values"]])
            for rule, result in found for s in result
        )  # fmt: skip
        flags = ("--web.enable-remote-write-receiver", "--web.enable-admin-api")
        loader = server(prom.argv[0], prom.tmpdir, f"record{i}", f"record{i}", prom.start, prom.start, *flags)
        with loader.running():
            push(loader.base, body)
            snapshot(loader, Path(prom.data))


def _labels(metric: dict) -> dict[str, str]:
    """A result's labels, as a recording rule keeps them (without the metric name)."""
    return {k: v for k, v in metric.items() if k != "__name__"}


def read_alerts(
    prom: Throwaway,
    rules: Rules,
    queries: list[str],
    run_ids: set[str],
    progress: Progress,
    kept: Kept | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, int], dict[str, dict[float, int]], dict[str, dict[str, set[str]]],
           dict[str, dict[str, int]]]:  # fmt: skip
    """Each alert on the grid, and each run's step at the evaluations where one first fired.

    Returns (run -> alert -> first firing time, alert -> firing series of no run, run -> time -> step,
    run -> alert -> the `rank` labels of its series that fired first, run -> alert -> how often it
    began). `kept`: alert results of earlier backtests on the same runs, read instead of evaluated
    (and the new ones kept)."""
    first: dict[str, dict[str, float]] = {run: {} for run in run_ids}
    began: dict[str, dict[str, int]] = {run: {} for run in run_ids}  # how often each alert began to fire
    named: dict[str, dict[str, set[str]]] = {run: {} for run in run_ids}  # the ranks firing first
    unattributed: dict[str, int] = {}

    def firing(i: int) -> list[dict]:
        """Each series that fired, with the first evaluation it fired at."""
        rule, query = rules.alerting[i], queries[i]
        found = kept.get(query) if kept is not None else None
        what = f"reading {rule['alert']}" + (" from the cache" if found is not None else "")
        progress(f"{what} ({i + 1}/{len(rules.alerting)})", done=i + 1 == len(rules.alerting))
        if found is None:
            found = [{"metric": s["metric"], "at": s["values"][0][0], "began": _began(s["values"])}
                     for s in query_range(prom.base, query, prom.start, prom.end)]  # fmt: skip
            if kept is not None:
                kept.put(query, found)
        return found

    # Prometheus evaluates the queries in parallel, all at once: each query takes one core, and
    # the costliest do not wait for a thread. Prometheus stops first on the way out, so that a
    # Ctrl-C does not wait for the queries in flight.
    with ThreadPoolExecutor(max(1, min(len(queries), MAX_QUERIES))) as pool, prom.running():
        for rule, found in zip(rules.alerting, pool.map(firing, range(len(queries))), strict=True):
            for series in found:
                run = run_of(series["metric"], run_ids)
                if run is None:
                    unattributed[rule["alert"]] = unattributed.get(rule["alert"], 0) + 1
                    continue
                t, alert = float(series["at"]), rule["alert"]
                began[run][alert] = began[run].get(alert, 0) + series["began"]
                if alert not in first[run] or t < first[run][alert]:
                    first[run][alert], named[run][alert] = t, set()
                if t == first[run][alert] and "rank" in series["metric"]:
                    named[run][alert].add(series["metric"]["rank"])
        # every run's step on the grid points from the first first-firing to the last one: its
        # last step, also while a job is down and restarts (trainer.faults)
        fired = [t for alerts in first.values() for t in alerts.values()]
        steps = query_range(prom.base, f"last_over_time({STEP}[1m])", min(fired), max(fired)) if fired else []
        step_at = {s["metric"].get("run_id"): {float(t): int(float(v)) for t, v in s["values"]} for s in steps}
    return first, unattributed, step_at, named, began


def _began(values: list) -> int:
    """How many times a firing series began: its evaluations, 1 s apart, in unbroken stretches.
    Each is a page Alertmanager would send (a resolved alert that fires again pages again)."""
    times = [round(float(t)) for t, _ in values]
    return 1 + sum(b - a > 1 for a, b in zip(times, times[1:], strict=False)) if times else 0


def readouts(
    meta: list[dict], alerts: list[str], first: dict, step_at: dict, began: dict, named: dict, ranks: int
) -> list[dict]:
    """Each run's readouts, in the table's order: its first fire of each alert (a step; a fault's
    seconds after it too), how often each began to fire, and for ranks the ranks named."""
    runs = []
    for m in sorted(meta, key=lambda m: (ALL_INCIDENTS.index(m["incident"]), m["seed"])):
        fires = first[m["run_id"]]
        steps = {a: (step_at[m["run_id"]][fires[a]] if a in fires else None) for a in alerts}
        run = {**{k: m[k] for k in ("incident", "seed", "run_id")}, "strength": m.get("strength", 1.0),
               "seconds": round(m["end"] - DEFAULT_START + GRID_PHASE_MS / 1000, 3), "first_fire": steps,
               "began": {a: began[m["run_id"]].get(a, 0) for a in alerts}}  # fmt: skip
        if "fault_at" in m:  # no step ends while a job stalls or restarts: seconds from the fault
            run["after_fault"] = {a: round(fires[a] - m["fault_at"], 1) if a in fires else None for a in alerts}
        if ranks > 1:  # which ranks each alert named when it first fired
            run["named_ranks"] = {a: sorted(r, key=int) for a, r in named[m["run_id"]].items() if r}
        runs.append(run)
    return runs


def run_of(metric: dict, run_ids: set[str]) -> str | None:
    """Which run a firing series belongs to: its run_id, else its offline instance
    (offline/RUN, or offline/RUN/rankR for a rank and its GPU)."""
    if metric.get("run_id") in run_ids:
        return metric["run_id"]
    run = metric.get("instance", "").removeprefix("offline/").split("/")[0]
    return run if run in run_ids else None
