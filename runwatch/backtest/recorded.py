"""`runwatch backtest --from-prometheus`: your own recorded runs through the rules, with the
plate's incidents overlaid on them.

    runwatch backtest --from-prometheus                           # the lab's (.runwatch/lab.json)
    runwatch backtest --from-prometheus http://127.0.0.1:9090 --run-ids my-run
    runwatch backtest --from-prometheus SNAPSHOT_DIR --inject throughput_cut:0.3 --sweep ThroughputDrop=0.7,0.8
    runwatch backtest --from-prometheus --inject loss_to_chance:0.5 --num-classes 50257

1. Reads each run's raw samples of the series the rules read (a range selector at one instant:
   every sample as scraped, with its own stamp) from the lab's Prometheus, another one, or a
   TSDB snapshot (a directory of blocks, served by a Prometheus of its own over a copy).
2. Moves each run to the backtest's clock (runwatch.backtest.data: it starts at
   DEFAULT_START, its scrapes half a second before each whole second, where the grid reads them),
   and, with `--inject`, adds copies of it with an incident overlaid from an onset on, at
   `--onsets` points spread over its history:
   - `loss_to_chance:S`: the training and held-out loss moved a share S of the way to chance,
     ln(--num-classes) nats, from the onset on (a collapse: it lasts);
   - `gradient_spike:S`: the gradient norm x 10^S for 5 samples (S = 1: ten times);
   - `throughput_cut:S`: tokens/s, and the tokens counter's increase, x (1 - S) from the onset on.
3. Loads them over remote write into a throwaway Prometheus, as the backtest loads its runs, and
   evaluates every alert there on the 1 s grid (runwatch.backtest.plan: its plan, and its
   firing_query, which honours `for:` and `keep_firing_for:` in PromQL). Nothing here decides
   whether an alert fired.
4. Reports each alert's pages on the untouched history: false alarms, if the runs were healthy
   (each unbroken stretch of firing is one page Alertmanager would send); with `--inject`, per
   incident and alert, the copies caught (the alert fires within HORIZON_S of the onset where the
   untouched run does not, at the same instant) and the delay, in the run's own steps; with
   `--sweep`, both for every value.

Not for the lab's simulated runs (`runwatch backtest --seeds`), nor for a recorded run's
TrainerDown: a replay has no scrape that failed (`up` is 1 wherever the run has a sample).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from runwatch.backtest import data, plan, variants
from runwatch.backtest import evaluate as ev
from runwatch.backtest.overlay import INJECTIONS, Injection, Run, injected, on_the_grid, onsets, parse_injections
from runwatch.backtest.recorded_report import catches, false_alarms, report, sweep_report
from runwatch.backtest.remote_write import push, write_request
from runwatch.backtest.rules import Rules, load_rules, written
from runwatch.core.command import DEFAULT_STATE, UsageError, check_writable, number
from runwatch.core.durations import duration_seconds
from runwatch.core.files import write_atomic
from runwatch.core.paths import Layout
from runwatch.exporter import metrics as m
from runwatch.prom.server import quoted
from runwatch.prom.tools import binary

LAB = "lab"  # --from-prometheus without a value: the lab of .runwatch
LAB_TSDB = "prometheus-data"  # a lab's Prometheus keeps its TSDB here in its state directory (runwatch.lab.supervise)
MAX_RUNS = 50
MAX_ONSETS = 50
QUERY_SPAN_S = 10_000  # Prometheus answers at most 11,000 points a series to a range query
# remote write in half-hour slices, in time order: a head takes no sample an hour older than its newest
PUSH_SPAN_MS = 1_800_000
FETCH_TIMEOUT_S = 120


# --- input ---


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a backtest over recorded runs, beside the backtest's own."""
    p.add_argument(
        "--from-prometheus", nargs="?", const=LAB, default=None, metavar="URL|DIR",
        help="replay your own recorded runs instead of simulated ones: from a Prometheus at URL, a lab's state "
        "directory, or a TSDB snapshot directory (no value: the lab's, in .runwatch)",
    )  # fmt: skip
    p.add_argument("--run-ids", default=None, help="with --from-prometheus: the runs to replay (default: every run)")
    p.add_argument(
        "--since", default="7d", help="with --from-prometheus: how far back from the newest sample to read (default 7d)"
    )
    p.add_argument(
        "--inject", default=None, metavar="KIND[:S],...",
        help="with --from-prometheus: overlay incidents on copies of each run: "
        + "; ".join(f"{k} ({v[2]}, default S {v[1]:g})" for k, v in INJECTIONS.items()),
    )  # fmt: skip
    p.add_argument(
        "--onsets", type=number(int, 1, MAX_ONSETS), default=5,
        help="with --inject: onsets spread over each run's history, one copy each (default 5)",
    )  # fmt: skip
    p.add_argument(
        "--num-classes", type=number(int, 2, 1 << 40), default=None,
        help="with --inject loss_to_chance: your model's classes (a vocabulary's size); chance is ln N nats",
    )  # fmt: skip


# Flags of the simulated backtest that mean nothing for recorded runs: refused, naming them.
SIMULATED_ONLY = {"incidents": None, "ranks": 1, "strengths": None, "lab": None, "precision": "fp64",
                  "plot": None, "edit_of": None, "workers": None}  # fmt: skip
RECORDED_ONLY = {"run_ids": None, "inject": None, "onsets": 5, "num_classes": None, "since": "7d"}


def check_flags(args: argparse.Namespace) -> None:
    """--from-prometheus beside a flag of the simulated backtest, or its own flags without it: refused."""
    if args.from_prometheus is None:
        for name, default in RECORDED_ONLY.items():
            if getattr(args, name) != default:
                raise UsageError(f"--{name.replace('_', '-')}: reads recorded runs: give --from-prometheus too")
        return
    for name, default in SIMULATED_ONLY.items():
        if getattr(args, name, default) != default:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag}: configures the simulated runs; --from-prometheus replays recorded ones")
    if args.seeds != "100-199":
        raise UsageError("--seeds: configures the simulated runs; --from-prometheus replays recorded ones")


# --- 1: read ---


@dataclass
class Source:
    base: str  # the Prometheus read from
    end: float  # the newest instant to read at
    what: str  # as the report names it


def _get(base: str, path: str, params: dict, flag: str = "--from-prometheus") -> dict:
    try:
        resp = requests.get(f"{base}/api/v1/{path}", params=params, timeout=FETCH_TIMEOUT_S)
        body = resp.json()
    except requests.RequestException as err:
        raise UsageError(f"{flag}: cannot reach Prometheus at {base}: {type(err).__name__}") from None
    except ValueError:
        raise UsageError(f"{flag}: {base} does not answer as Prometheus does (HTTP {resp.status_code})") from None
    if body.get("status") != "success":
        raise UsageError(f"{flag}: {base} refused {path}: {body.get('error', resp.text[:200])}")
    return body["data"]


def run_ids_in(base: str) -> list[str]:
    """Every run id some series of the Prometheus at base carries, all time."""
    return sorted(_get(base, "label/run_id/values", {"match[]": '{run_id!=""}'}))


def fetch(base: str, run_id: str, families: set[str], end: float, since_s: float) -> list[dict]:
    """Every raw sample, as scraped, of the run's series of these families in (end - since, end]."""
    names = "|".join(sorted(re.escape(f) + "(_total)?" for f in families))
    query = f'{{__name__=~"{names}",run_id="{quoted(run_id)}"}}[{int(since_s)}s]'
    return _get(base, "query", {"query": query, "time": end})["result"]


# --- 3: evaluate ---


def _load(runs: list[Run], prometheus: str, tmp: Path) -> int:
    """Every run's samples into tmp/data, in half-hour slices in time order (one loading Prometheus)."""
    loader = data.loading_server(prometheus, tmp)
    t0, t1 = min(r.first_ms for r in runs) - 10_000, max(r.end_ms for r in runs)
    samples = 0
    with loader.running():
        for lo in range(t0, t1 + 1, PUSH_SPAN_MS):
            hi = lo + PUSH_SPAN_MS

            def part(lo=lo, hi=hi):
                for r in runs:
                    for name, labels, values, stamps in r.series:  # each series' stamps rise
                        a, b = bisect.bisect_left(stamps, lo), bisect.bisect_left(stamps, hi)
                        if b > a:
                            yield name, labels, values[a:b], stamps[a:b]

            body, n = write_request(part())
            if n:
                push(loader.base, body)
                samples += n
        data.snapshot(loader, tmp / "data")
    return samples


def ranged(base: str, query: str, start: float, end: float) -> list[dict]:
    """A range query on the 1 s grid, in spans Prometheus answers, each series' values joined."""
    from runwatch.prom.server import query_range

    joined: dict[tuple, dict] = {}
    lo = start
    while lo <= end:
        hi = min(lo + QUERY_SPAN_S - 1, end)
        for s in query_range(base, query, lo, hi):
            key = tuple(sorted(s["metric"].items()))
            joined.setdefault(key, {"metric": s["metric"], "values": []})["values"] += s["values"]
        lo = hi + 1
    return list(joined.values())


def evaluate(runs: list[Run], rules: Rules, progress: data.Progress) -> tuple[dict, dict, int]:
    """Each alert's firing instants per run (run -> alert -> sorted whole seconds), each run's
    step at every instant (run -> second -> step), and the samples loaded."""
    prometheus = binary("prometheus")
    with tempfile.TemporaryDirectory(prefix="runwatch-recorded-") as tmp:
        samples = _load(runs, prometheus, Path(tmp))
        progress(f"loaded {len(runs)} runs ({samples:,} samples)")
        prom = data.throwaway(prometheus, Path(tmp), [{"end": r.end_ms / 1000} for r in runs])
        how = plan.plan(rules, prom.start)
        ev.backfill(prom, how.passes, progress)
        ids = {r.run_id for r in runs}
        fired: dict[str, dict[str, set[int]]] = {r: {} for r in ids}

        def firing(i: int) -> list[dict]:
            rule = rules.alerting[i]
            progress(f"reading {rule['alert']} ({i + 1}/{len(rules.alerting)})", done=i + 1 == len(rules.alerting))
            return ranged(prom.base, plan.firing_query(how.conditions[i], rule), prom.start, prom.end)

        with ThreadPoolExecutor(max(1, min(len(rules.alerting), ev.MAX_QUERIES))) as pool, prom.running():
            for rule, found in zip(rules.alerting, pool.map(firing, range(len(rules.alerting))), strict=True):
                for s in found:
                    run = ev.run_of(s["metric"], ids)
                    if run is not None:
                        fired[run].setdefault(rule["alert"], set()).update(round(float(t)) for t, _ in s["values"])
            steps = ranged(prom.base, f"last_over_time({m.STEP}[1m])", prom.start, prom.end)
    step_at = {s["metric"].get("run_id"): {round(float(t)): int(float(v)) for t, v in s["values"]} for s in steps}
    return {r: {a: sorted(t) for a, t in alerts.items()} for r, alerts in fired.items()}, step_at, samples


# --- the command ---


def source_of(spec: str, tmp: Path, stack: contextlib.ExitStack) -> Source:
    """--from-prometheus's value as a Prometheus to read: a URL; a lab's state directory (its
    Prometheus, or if that is down its TSDB on disk); or a TSDB directory (a snapshot, or a
    stopped Prometheus's data), served by a Prometheus of its own over a copy, kept running on `stack`."""
    from runwatch.core.addresses import lab_url

    if spec == LAB or (Path(spec) / "lab.json").is_file():
        state = DEFAULT_STATE if spec == LAB else Path(spec)
        if not (Path(state) / "lab.json").is_file():
            raise UsageError(f"--from-prometheus: no lab in {state} (no lab.json): give its Prometheus's URL")
        url, tsdb = lab_url(Path(state), "prometheus"), Path(state) / LAB_TSDB
        try:
            return source_of(url, tmp, stack)
        except UsageError:
            if not tsdb.is_dir():
                raise
        spec = str(tsdb)  # the lab is down: its data on disk
    if re.match(r"https?://", spec):
        base = spec.rstrip("/")
        _get(base, "query", {"query": "vector(1)"})  # reachable, and Prometheus
        return Source(base, time.time(), base)
    tsdb = Path(spec)
    if not tsdb.is_dir():
        raise UsageError(f"--from-prometheus: {spec} is no URL (http://...), lab state directory or TSDB directory")
    shutil.copytree(tsdb, tmp / "tsdb", ignore=shutil.ignore_patterns("lock", "snapshots"))
    server = data.server(binary("prometheus"), tmp, "tsdb", "tsdb", 0, 0)
    stack.enter_context(server.running())
    return Source(server.base, newest(server.base, tmp / "tsdb", spec), f"the TSDB in {tsdb}")


def newest(base: str, tsdb: Path, spec: str) -> float:
    """The newest instant a served TSDB holds: its blocks' (meta.json) or its head's (the WAL a
    stopped Prometheus left), whichever is later; a UsageError naming the directory if it holds none."""
    ends = [json.loads(p.read_text())["maxTime"] for p in tsdb.glob("*/meta.json")]
    head = _get(base, "status/tsdb", {}).get("headStats", {})
    if head.get("numSeries"):
        ends.append(head["maxTime"])
    if not ends:
        raise UsageError(f"--from-prometheus: {spec} holds no samples (no TSDB block, no head)")
    return max(ends) / 1000


@dataclass
class Settings:
    """What the command line asks for, checked."""

    rules_dir: Path
    since_s: float
    injections: list[Injection]
    chance: float | None
    swept: variants.Sweep | None


def settings(args: argparse.Namespace) -> Settings:
    """The flags, each bad one refused with a line that names it."""
    check_flags(args)
    rules_dir = args.rules or Layout().rules_dir
    if not rules_dir.is_dir():
        raise UsageError(f"--rules: {rules_dir} is not a directory")
    if args.json is not None:
        check_writable(args.json, "--json")
    since_s = duration_seconds(args.since, "--since")
    if since_s <= 0:
        raise UsageError(f"--since: must be a positive duration such as 7d, got {args.since!r}")
    injections = parse_injections(args.inject) if args.inject else []
    if any(i.kind == "loss_to_chance" for i in injections) and args.num_classes is None:
        raise UsageError("--inject: loss_to_chance needs --num-classes N (your model's classes; chance is ln N nats)")
    chance = math.log(args.num_classes) if args.num_classes else None
    swept = variants.parse_sweep(args.sweep) if args.sweep else None
    return Settings(rules_dir, since_s, injections, chance, swept)


def read_runs(spec: str, run_ids: str | None, families: set[str], since_s: float, progress: data.Progress,
              injecting: bool = False) -> tuple[str, list[Run]]:  # fmt: skip
    """(where they came from, each run asked for on the backtest's clock) from --from-prometheus's
    source; `injecting`: each must be long enough for an onset."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="runwatch-source-")))
        source = source_of(spec, tmp, stack)
        known = run_ids_in(source.base)
        if not known:
            raise UsageError(f"--from-prometheus: {source.what} holds no run (no series with a run_id)")
        wanted = [r.strip() for r in run_ids.split(",") if r.strip()] if run_ids else known
        for r in wanted:
            if r not in known:
                listed = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "")
                raise UsageError(f"--run-ids: {source.what} holds no run {r!r}; it holds {listed}")
        if len(wanted) > MAX_RUNS:
            raise UsageError(f"--run-ids: at most {MAX_RUNS} runs in one backtest, got {len(wanted)}: name them")
        runs = []
        for r in wanted:
            found = fetch(source.base, r, families, source.end, since_s)
            if not found:
                when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(source.end))
                raise UsageError(f"--run-ids: run {r} has no samples of the series the rules read in the "
                                 f"{since_s:g} s before {when} UTC (--since)")  # fmt: skip
            runs.append(on_the_grid(r, found))
            if injecting:
                onsets(runs[-1], 1)  # refused before any work, naming --inject
            progress(f"read {r}: {sum(len(s[3]) for s in runs[-1].series):,} samples")
    return source.what, runs


def run(args: argparse.Namespace) -> int:
    """`runwatch backtest --from-prometheus`: read, overlay, evaluate, report."""
    import signal

    asked = settings(args)
    # SIGTERM as well as Ctrl-C unwinds through the finally blocks that stop every Prometheus started here.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    progress, t0 = data.Progress(), time.perf_counter()
    rules = load_rules(asked.rules_dir, binary("promtool"))
    if asked.swept is not None:
        rules = variants.variants(asked.swept)(rules)
    what, runs = read_runs(args.from_prometheus, args.run_ids, plan.families_read(rules) - {"up"}, asked.since_s,
                           progress, bool(asked.injections))  # fmt: skip
    at = {r.run_id: onsets(r, args.onsets) if asked.injections else [] for r in runs}
    copies = [injected(r, inj, t, step, asked.chance) for r in runs for t, step in at[r.run_id]
              for inj in asked.injections]  # fmt: skip
    alerts = list(dict.fromkeys(rule["alert"] for rule in rules.alerting))
    fired, step_at, samples = evaluate(runs + copies, rules, progress)
    found = results(what, runs, copies, fired, step_at, alerts, asked)
    print(found.pop("text"))
    wall = time.perf_counter() - t0
    print(f"\n{len(runs)} recorded runs and {len(copies)} injected copies, {samples:,} samples, in {wall:.1f}s")
    if args.json is not None:
        write_atomic(args.json, json.dumps(found, indent=1) + "\n")
    return 0


def results(what: str, runs: list[Run], copies: list[Run], fired: dict, step_at: dict, alerts: list[str],
            asked: Settings) -> dict:  # fmt: skip
    """What the report says, as JSON, and as text under "text"."""
    found: dict = {"source": what, "runs": [{"run_id": r.run_id, "seconds": round(r.hours * 3600),
                   "steps": _span(step_at.get(r.run_id, {}))} for r in runs],
                   "false_alarms": false_alarms(runs, fired, step_at, alerts)}  # fmt: skip
    names = ", ".join(f"{r['run_id']} (steps {r['steps']}, {r['seconds']:.0f} s)" for r in found["runs"])
    text = [f"recorded runs from {what}: {names}"]
    if copies:
        found["catches"] = catches(copies, fired, step_at, alerts)
        first = asked.injections[0]
        found["onsets"] = {r.run_id: [c.onset_step for c in copies if c.source == r.run_id and c.injection == first]
                           for r in runs}  # fmt: skip
        text.append("onsets, by step: " + "; ".join(f"{r}: {', '.join(map(str, s))}"
                                                     for r, s in found["onsets"].items()))  # fmt: skip
    swept = asked.swept
    in_force = [a for a in alerts if swept is None or a not in swept.names]
    text += ["", report(found, in_force, asked.injections)]
    if swept is not None:
        current = variants.in_force(written(asked.rules_dir), swept)
        text += ["", sweep_report(found, swept, current, asked.injections)]
        found["sweep"] = {"alert": swept.alert, "field": swept.field, "values": list(swept.values),
                          "in_force": current}  # fmt: skip
    found["text"] = "\n".join(text)
    return found


def _span(steps: dict[int, int]) -> str:
    return f"{min(steps.values())}-{max(steps.values())}" if steps else "-"


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as `runwatch backtest --from-prometheus`")
