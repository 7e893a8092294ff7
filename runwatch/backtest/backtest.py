"""`runwatch backtest`: every seed x incident through a real Prometheus, read like the plate.

    runwatch backtest --seeds 100-199 [--rules DIR] [--json FILE] [--no-cache]
    runwatch backtest --strengths 0.05-1 --sweep TrainingLossJump=2,2.5,3,4,5 --plot sweep.png

`--strengths` draws each incident run's strength (trainer.config: the plate's is 1), and the
table then reads per incident and strength band. `--sweep` evaluates one alert at several
values of its threshold or its `for:` (variants.py, sweep.py), beside the rules in force.

The command parses its flags and runs the stages in order, each a module that imports only
the ones before it (tests/test_layers.py):

1. rules.py: the rules folder, checked by promtool; each alert's `for:` and `keep_firing_for:`
   read, and an alert whose pair cannot be replayed refused by name.
2. plan.py: the runs (seeds x incidents x strengths), the families they load, and how each rule
   is evaluated: recording rules inlined where the alerts read them, as subqueries on a 1 s grid
   (inline.py), or backfilled first when read in a form that cannot be inlined exactly; each
   alert's firing query. `for: D` fires at T when the condition held at every evaluation in
   [T-D, T], `count_over_time((condition)[D + 0.5s:1s]) >= D/1s + 1`; `keep_firing_for: K` at T
   when it held at some evaluation in [T-K, T], as Prometheus keeps a firing alert firing.
3. data.py: every seed x incident trained offline in batches (trainer.batch: bit for bit the runs
   `runwatch train --offline` writes), pushed into a loading Prometheus over remote write
   (remote_write.py) and snapshotted as a TSDB block, cached between runs (datacache.py); a
   throwaway Prometheus over it (loopback, free port, retention 100y).
4. evaluate.py: the backfill, then each alert read on the grid, and each run's step at its first
   firing evaluation.
5. report.py: the readouts against the plate's signatures (signatures.py); sweep.py: the
   workbench's tables and plot.

The grid is the live lab's scrapes. The live trainer sets its lab clock so that a scrape falls
SCRAPE_PHASE (half a second) after every whole lab second (trainer.live); a live rule group
evaluates some fixed fraction of a second later, reading that scrape. So every grid point is a
scrape, and each rule reads the steps that ended by it. What the groups' phases change is only
their order after a scrape: a group that reads a recording of a group evaluated *before* the
scrape sees it one scrape late (plan.Schedule). By default every recording is read fresh, as
promtool's tests read them; `--lab URL` reads a running lab's order from its Prometheus.

Python only starts, feeds, queries and reports; Prometheus evaluates every expression.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from runwatch.backtest import signatures, variants
from runwatch.backtest import sweep as workbench
from runwatch.backtest.data import Progress, cache_key, load, throwaway
from runwatch.backtest.datacache import DataCache, default_root
from runwatch.backtest.evaluate import Result, evaluate, kept_for
from runwatch.backtest.plan import (
    Schedule,
    Strengths,
    families_read,
    parse_incidents,
    parse_seeds,
    parse_strengths,
    plan,
)
from runwatch.backtest.report import report, summarise
from runwatch.backtest.rules import Rules, load_rules, written
from runwatch.core.command import Command, UsageError, check_writable, config_error, number
from runwatch.core.files import write_atomic
from runwatch.core.names import PORTS
from runwatch.core.paths import Layout
from runwatch.prom.tools import binary
from runwatch.trainer.config import MAX_RANKS, ConfigError, TrainConfig
from runwatch.trainer.offline import DEFAULT_START

CACHE_MAX_MB = 512  # about 34 backtests of 100 seeds (15 MB each)


def backtest(
    seeds: list[int],
    rules_dir: Path | Rules,
    incidents: tuple[str, ...] = signatures.INCIDENTS,
    workers: int | None = None,
    progress: Progress | None = None,
    precision: str = "fp64",
    cache: DataCache | None = None,
    inline: bool = True,
    ranks: int = 1,
    schedule: Schedule | None = None,
    strengths: Strengths | None = None,
    edit: Callable[[Rules], Rules] | None = None,
) -> Result:
    """The stages in order, rules to evaluation: the rules of `rules_dir` (or those given, as
    load_rules read them) over every seed x incident. `cache` keeps the loaded runs between calls
    (None: train afresh), `inline=False` backfills every recording rule first, as the backtest
    used to, `ranks` trains every run data-parallel over that many ranks, with their series, and
    `schedule` evaluates the groups in a live lab's order (Schedule.of_lab; None: every recording
    fresh). `strengths` draws each incident run's strength (None: the plate's, 1); `edit` adds to
    the rules read (variants.py's variants of one alert), evaluated beside them."""
    progress = progress or Progress()
    promtool, prometheus = binary("promtool"), binary("prometheus")
    # 1. rules
    rules = rules_dir if isinstance(rules_dir, Rules) else load_rules(rules_dir, promtool)
    rules = (edit or (lambda r: r))(rules)
    # 2. plan: before any run is trained, so that an alert it cannot evaluate is refused first;
    # its grid starts where every run starts, as data.throwaway's does
    how = plan(rules, DEFAULT_START, inline, schedule)
    families = families_read(rules)
    # 3. data
    workers = workers or os.cpu_count() or 1
    timings: dict[str, float] = {}
    key = cache_key(seeds, incidents, precision, families, prometheus, ranks, strengths) if cache is not None else ""
    with tempfile.TemporaryDirectory(prefix="runwatch-backtest-") as tmp:
        t0 = time.perf_counter()
        meta, samples, cached = load(seeds, incidents, Path(tmp), families, prometheus, workers, precision,
                                     progress, cache, key, ranks, strengths)  # fmt: skip
        timings["train_and_load"] = time.perf_counter() - t0
        prom = throwaway(prometheus, Path(tmp), meta)
        # 4. evaluate
        kept = None if cache is None else kept_for(cache, key, prom, how, prometheus, promtool)
        runs, unattributed = evaluate(prom, rules, how, meta, progress, kept, ranks, timings)
    alerts = list(dict.fromkeys(r["alert"] for r in rules.alerting))
    return Result(runs, unattributed, alerts, timings, samples, cached, ranks)


# --- command line ---


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("--seeds", default="100-199", help="seeds to run, e.g. 0-99 or 1,2,5-7 (default 100-199)")
    p.add_argument("--rules", type=Path, default=None, help="rules directory (default prometheus/rules)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument(
        "--incidents", default=None,
        help="comma-separated incidents (default: the plate's five, and the cluster's with --ranks)",
    )  # fmt: skip
    p.add_argument(
        "--ranks", type=number(int, 1, MAX_RANKS), default=1, help="train every run data-parallel over N ranks"
    )
    p.add_argument(
        "--workers", type=number(int, 1, 64), default=None, help="training processes (default: one per core)"
    )
    p.add_argument("--precision", choices=("fp64", "fp16"), default="fp64", help="train the runs in this precision")
    p.add_argument(
        "--lab", metavar="URL", default=None,
        help="evaluate the rule groups in the order this lab's Prometheus evaluates them after its trainer's scrape "
        "(e.g. http://127.0.0.1:9090; default: every recording read fresh)",
    )  # fmt: skip
    p.add_argument(
        "--strengths", default=None, metavar="LO-HI|S1,S2,...",
        help="draw each incident run's strength from this range (e.g. 0.05-1) or list; the table then reads by "
        "strength band (default: every incident at the plate's strength, 1)",
    )  # fmt: skip
    p.add_argument(
        "--sweep", default=None, metavar="ALERT=V1,V2,...",
        help="also evaluate ALERT at each of these thresholds (ALERT=2,2.5,3 or ALERT=2-5:0.5), or for: values "
        "(ALERT.for=0s,10s,20s), on the same runs, and print the trade-off",
    )  # fmt: skip
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="with --sweep, draw the trade-off here")
    p.add_argument(
        "--edit-of", type=Path, default=None, metavar="RULES_DIR",
        help="with --sweep: --rules are an edit of the rules in RULES_DIR (those in force); the sweep's alert as "
        "they write it is evaluated beside the edit, and the trade-off marks the edit and the rule in force",
    )  # fmt: skip
    p.add_argument(
        "--no-cache", action="store_true", help="train and load the runs afresh, and keep nothing in the cache"
    )
    p.add_argument(
        "--cache-max-mb", type=number(int, 1, 1 << 20), default=CACHE_MAX_MB,
        help=f"the cache's size cap in MB, least recently used entries first out (default {CACHE_MAX_MB})",
    )  # fmt: skip
    return run


def _workbench_report(
    summary: dict, result: Result, in_force: Result, strengths: Strengths | None, swept: variants.Sweep | None,
    plot: Path | None, current: str | None, forced: str | None,
) -> None:  # fmt: skip
    """--strengths' table by band and --sweep's trade-off (sweep.py), printed and kept in the
    summary; --plot's figure. `current`, `forced`: the swept alert's value in the rules
    backtested and, with --edit-of, in the rules in force, as written."""
    if strengths is not None:
        summary["by_strength"] = workbench.catches(in_force, strengths, in_force.alerts)
        print("\n" + workbench.catches_table(summary["by_strength"], in_force.alerts))
    if swept is None:
        return
    rows = workbench.trade_off(result, swept, strengths, current, forced)
    title, cells = workbench.sweep_cells(rows, swept)
    summary["sweep"] = {"alert": swept.alert, "field": swept.field, "values": list(swept.values), "rows": rows,
                        "table": {"title": title, "rows": cells}}  # fmt: skip
    print("\n" + workbench.sweep_table(rows, swept))
    if plot is not None:
        workbench.plot(rows, swept, plot)
        print(f"backtest: wrote the trade-off to {plot}", file=sys.stderr)


def _sweep_edit(swept: variants.Sweep | None, in_force_rules: list[dict] | None) -> Callable[[Rules], Rules] | None:
    """The rules' edit a sweep makes: its variants, and with --edit-of (the rules in force, as
    written) the rule in force beside them."""
    if swept is None:
        return None
    edit = variants.variants(swept)
    if in_force_rules is None:
        return edit
    beside = variants.with_in_force(swept, in_force_rules)
    return lambda rules: beside(edit(rules))


def _check(args: argparse.Namespace) -> tuple[variants.Sweep | None, Strengths | None]:
    """Every flag checked before anything runs: (the sweep, the strengths)."""
    try:
        TrainConfig(ranks=args.ranks, precision=args.precision).validate()
    except ConfigError as err:
        raise config_error(err) from None
    if not args.rules.is_dir():
        raise UsageError(f"--rules: {args.rules} is not a directory")
    if args.json is not None:
        check_writable(args.json, "--json")
    strengths = None if args.strengths is None else parse_strengths(args.strengths)
    swept = None if args.sweep is None else variants.parse_sweep(args.sweep)
    if args.edit_of is not None and (swept is None or not args.edit_of.is_dir()):
        why = "compares a sweep's alert: give --sweep too" if swept is None else f"{args.edit_of} is not a directory"
        raise UsageError(f"--edit-of: {why}")
    if args.plot is not None:
        if swept is None:
            raise UsageError("--plot: draws a sweep's trade-off: give --sweep too")
        if args.plot.suffix.lower() != ".png":
            raise UsageError(f"--plot: writes a PNG, name it FILE.png, got {args.plot}")
        check_writable(args.plot, "--plot")
    return swept, strengths


def _lab_schedule(lab: str | None) -> Schedule | None:
    """--lab's order of the groups, said on stderr; None without --lab."""
    if lab is None:
        return None
    schedule = Schedule.of_lab(lab.rstrip("/"), PORTS["trainer"])
    order = ", ".join(f"{g} {t:.3f} s" for g, t in sorted(schedule.after_scrape.items(), key=lambda i: i[1]))
    print(f"backtest: the lab's groups evaluate after its trainer's scrape: {order}", file=sys.stderr)
    for group in sorted(schedule.racing):
        print(f"backtest: {group} evaluates while the trainer's scrape is in flight: in the lab its readouts "
              "may be a step later than here", file=sys.stderr)  # fmt: skip
    return schedule


def run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    incidents = parse_incidents(args.incidents, args.ranks)
    args.rules = args.rules or Layout().rules_dir
    swept, strengths = _check(args)
    # the rules in force beside an edit, as written (the rule compared with the edit, and its value)
    in_force_rules = None if args.edit_of is None else written(args.edit_of, "--edit-of")
    forced = None if in_force_rules is None else variants.in_force(in_force_rules, swept)
    # SIGTERM as well as Ctrl-C unwinds through the finally blocks that stop Prometheus.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.perf_counter()
    schedule = _lab_schedule(args.lab)
    rules = load_rules(args.rules, binary("promtool"))
    current = None if swept is None else variants.in_force(rules.recording + rules.alerting, swept)  # as written
    cache = None if args.no_cache else DataCache(default_root(), args.cache_max_mb << 20)
    result = backtest(
        seeds, rules, incidents, args.workers, precision=args.precision, cache=cache, ranks=args.ranks,
        schedule=schedule, strengths=strengths, edit=_sweep_edit(swept, in_force_rules),
    )  # fmt: skip
    wall = time.perf_counter() - t0
    extra = set(swept.names) | {f"{swept.alert}@{variants.IN_FORCE}"} if swept else set()
    in_force = dataclasses.replace(result, alerts=[a for a in result.alerts if a not in extra])
    summary = summarise(in_force)
    summary["seconds"]["total"] = round(wall, 1)
    print(report(summary, in_force.alerts))
    _workbench_report(summary, result, in_force, strengths, swept, args.plot, current, forced)
    over = f" over {args.ranks} ranks" if args.ranks > 1 else ""
    print(f"\n{len(result.runs)} {args.precision} runs{over} ({len(seeds)} seeds x {len(incidents)} incidents), "
          f"{result.samples:,} samples{' (from the cache)' if result.cached else ''}, in {wall:.1f}s")  # fmt: skip
    if args.json is not None:
        doc = {"runs": in_force.runs, "summary": summary}
        write_atomic(args.json, json.dumps(doc, indent=1) + "\n")
    return 0
