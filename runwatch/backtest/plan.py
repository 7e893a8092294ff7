"""Stage 2 of the backtest: its plan. Which runs it trains (seeds x incidents, each incident run
at a strength), which of the trainer's families it loads, and how each rule is evaluated on
the grid: each recording inlined where its readers read it, or backfilled first, and each
alert's firing query, its `for:` or its `keep_firing_for:` evaluated by Prometheus.

    how = plan(rules, DEFAULT_START)            # how.conditions, how.queries, how.passes

The grid is the live lab's scrapes (data.GRID_PHASE_MS); the order of the groups after each
scrape is a Schedule: every recording read fresh by default, or a running lab's order.

Imports the rules stage only, of the stages: the data, the evaluation and the report come after.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import requests

from runwatch.backtest import signatures
from runwatch.backtest.inline import Inliner, references
from runwatch.backtest.rules import Rules, holds
from runwatch.core.command import UsageError
from runwatch.exporter.metrics import STEP
from runwatch.trainer.config import MAX_SEED, SCALED_INCIDENTS
from runwatch.trainer.offline import FAMILIES

# The throwaway's lookback: backfilled data carries no staleness markers; a 3 s lookback lets a
# run's series vanish when it ends, as staleness makes them vanish in the live lab.
LOOKBACK = "3s"


# --- the runs ---

ALL_INCIDENTS = signatures.INCIDENTS + signatures.CLUSTER_INCIDENTS

# 1,000 seeds (5,000 runs) is ten times docs/readouts.md's 100-seed backtest: more than any exercise needs.
# A typo such as 0-99999999999 is refused before building the range (that took 3.8 GB in 7 s).
MAX_SEEDS = 1000


def parse_seeds(text: str) -> list[int]:
    """'0-99' or '3,5,10-12' -> sorted unique seeds; UsageError naming --seeds otherwise."""
    seeds: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise UsageError(f"--seeds: expected a range like 0-99 or a list like 1,2,5-7, got {text!r}")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo:
            raise UsageError(f"--seeds: range {lo}-{hi} runs backwards")
        if hi > MAX_SEED:
            raise UsageError(f"--seeds: seeds go up to {MAX_SEED}, got {hi}")
        if hi - lo + 1 + len(seeds) > MAX_SEEDS:  # counted before the range is built
            raise UsageError(f"--seeds: at most {MAX_SEEDS} seeds in one backtest, got {text!r}")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


def parse_incidents(text: str | None, ranks: int) -> tuple[str, ...]:
    """'lr_spike,none' -> the incidents to run; None: the plate's five, and the cluster's with
    ranks over 1. UsageError naming --incidents for an unknown one, or a cluster one on one rank."""
    default = signatures.INCIDENTS + (signatures.CLUSTER_INCIDENTS if ranks > 1 else ())
    incidents = tuple(i.strip() for i in (text or ",".join(default)).split(",") if i.strip())
    unknown = [i for i in incidents if i not in ALL_INCIDENTS]
    if unknown:
        raise UsageError(f"--incidents: unknown incident {unknown[0]!r}; choose from {', '.join(ALL_INCIDENTS)}")
    cluster = [i for i in incidents if i in signatures.CLUSTER_INCIDENTS]
    if cluster and ranks == 1:
        raise UsageError(f"--incidents: {cluster[0]} is a cluster incident: it needs --ranks 2 or more")
    return incidents


# --strengths: a range is cut into this many bands of equal width for the table
STRENGTH_BANDS = 4


@dataclass(frozen=True)
class Strengths:
    """Each incident run's strength (trainer.config's TrainConfig.strength), drawn from its seed
    and incident: uniformly over [low, high], to the thousandth, or from `values` in turn by seed.
    A healthy run and a fault have none (1).

        >>> Strengths(values=(0.1, 0.5)).of(7, "lr_spike")
        0.5
    """

    low: float = 1.0
    high: float = 1.0
    values: tuple[float, ...] = ()

    @property
    def spec(self) -> str:
        return ",".join(f"{v:g}" for v in self.values) if self.values else f"{self.low:g}-{self.high:g}"

    def of(self, seed: int, incident: str) -> float:
        if incident not in SCALED_INCIDENTS:
            return 1.0
        if self.values:
            return self.values[seed % len(self.values)]
        u = random.Random(f"strength/{seed}/{incident}").random()  # a str seed: the same on every machine
        return round(self.low + u * (self.high - self.low), 3)

    def bands(self) -> list[tuple[float, float]]:
        """The table's strength bands, weakest first: each value of a list, or a range in equal parts."""
        if self.values:
            return [(v, v) for v in sorted(set(self.values))]
        width = (self.high - self.low) / STRENGTH_BANDS
        return [(self.low + i * width, self.low + (i + 1) * width) for i in range(STRENGTH_BANDS)]

    def band(self, strength: float) -> str:
        """The band a run's strength falls in, as the table names it."""
        for lo, hi in self.bands():
            if lo == hi == strength or lo <= strength < hi or strength == hi == self.high:
                return f"{lo:g}" if lo == hi else f"{lo:.2f}-{hi:.2f}"
        return f"{strength:g}"


def parse_strengths(text: str) -> Strengths:
    """'0.05-1' (a range) or '0.1,0.3,1' (a list) -> Strengths; UsageError naming --strengths otherwise."""
    usage = f"--strengths: expected a range like 0.05-1 or a list like 0.1,0.3,1 of strengths in (0, 1], got {text!r}"
    number_ = r"\s*(\d*\.?\d+(?:[eE][-+]?\d+)?)\s*"
    m = re.fullmatch(f"{number_}-{number_}", text)
    try:
        values = (float(m[1]), float(m[2])) if m else tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(usage) from None
    if not all(0.001 <= v <= 1 for v in values):  # NaN fails too; a thousandth is the finest drawn
        raise UsageError(usage)
    if m is None:
        return Strengths(values=values)
    if values[0] >= values[1]:
        raise UsageError(f"--strengths: the range {text} must run from a weaker strength to a stronger one")
    return Strengths(low=values[0], high=values[1])


def families_read(rules: Rules) -> set[str]:
    """The trainer's metric families that some rule names, plus the step (for readouts) and up.
    A whole name: runwatch_train_tokens is not read by a rule on runwatch_train_tokens_per_second,
    but is by one on runwatch_train_tokens_total."""
    names = {ref.name for r in rules.recording + rules.alerting for ref in references(r["expr"])}
    if any("__name__" in r["expr"] for r in rules.recording + rules.alerting):
        names = set(FAMILIES)  # a rule may select families by a pattern: load them all
    return {f for f in FAMILIES if f in names or f"{f}_total" in names} | {STEP, "up"}  # a counter's samples: _total


# --- the order of the groups after a scrape ---


@dataclass(frozen=True)
class Schedule:
    """When each rule group evaluates after the scrape it reads, in seconds (0 to 1): the order a
    live Prometheus gives them (each group's phase comes from a hash of its name and file, each
    target's from a hash of its labels, so it differs from lab to lab and between versions).

    A rule reads a recording of another group one scrape late when that group evaluates later
    after the scrape (it last evaluated before it); of its own group, when the recording comes
    later in the group. Not for labs of several scrape phases at once (the ranks of a cluster).

        >>> Schedule({"runwatch-baselines": 0.9, "runwatch-training": 0.7}).lag(
        ...     ("runwatch-training", 0), ("runwatch-baselines", 3))
        1
    """

    after_scrape: dict[str, float]  # group -> seconds from the scrape (its sample in the TSDB) to its evaluation
    # groups that evaluate while the scrape is in flight: each evaluation may or may not see it
    racing: frozenset[str] = frozenset()

    def lag(self, reader: tuple[str, int], recorded: tuple[str, int]) -> int:
        (group, pos), (rgroup, rpos) = reader, recorded
        if group == rgroup:
            return int(rpos > pos)
        missing = [g for g in (group, rgroup) if g not in self.after_scrape]
        if missing:
            raise UsageError(f"--lab: the lab's Prometheus has no rule group {missing[0]!r}: reload it with the rules")
        return int(self.after_scrape[rgroup] > self.after_scrape[group])

    @classmethod
    def of_lab(cls, base: str, port: int) -> Schedule:
        """A running lab's: its groups' last evaluations (/api/v1/rules) against the last scrape of
        its target on `port` (/api/v1/targets), which is seen once the scrape has ended."""
        try:
            groups = requests.get(f"{base}/api/v1/rules", timeout=10).json()["data"]["groups"]
            targets = requests.get(f"{base}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        except (requests.RequestException, ValueError, KeyError) as err:
            raise UsageError(f"--lab: cannot read the rules and targets of {base}: {err}") from None
        scrape = [t for t in targets if t["scrapeUrl"].split("/")[2].endswith(f":{port}") and t["health"] == "up"]
        if not scrape:
            raise UsageError(f"--lab: {base} scrapes no target on port {port}: start the lab first")
        waiting = [float(g.get("interval", 1)) for g in groups if g["lastEvaluation"].startswith("0001-")]
        if waiting:  # Go's zero time: not evaluated yet (cluster.yml's 30 s group, up to 30 s after the start)
            raise UsageError(f"--lab: {base} has not evaluated every rule group yet: try again in {max(waiting):g}s")
        started = _phase(scrape[0]["lastScrape"])
        seen = started + float(scrape[0]["lastScrapeDuration"])
        after = {g["name"]: (_phase(g["lastEvaluation"]) - seen) % 1.0 for g in groups}
        # from the scrape's start to RACE_S past its end, an evaluation may run before or after
        # the scrape's samples are appended (the scrape took lastScrapeDuration once, not always)
        window = seen - started + RACE_S
        racing = {g for g in after if (after[g] + seen - started) % 1.0 < window}
        return cls(after, frozenset(racing))


RACE_S = 0.02  # how much longer than its last one a scrape may take (10 ms here with four labs on 2 cores)


def _phase(stamp: str) -> float:
    """The fraction of a second of an RFC 3339 time as Prometheus's API writes it (ns digits)."""
    frac = re.search(r"\.(\d+)", stamp)
    return float(f"0.{frac[1]}") if frac else 0.0


# --- how each rule is evaluated ---


def recording_levels(recording: list[dict]) -> list[list[dict]]:
    """Recording rules in backfill passes: a rule that reads another recorded series waits for it."""
    names = {r["record"] for r in recording}
    done: set[str] = set()
    levels, left = [], list(recording)
    while left:
        ready = [r for r in left if not ({n for n in names if n in r["expr"]} - done - {r["record"]})]
        if not ready:  # a cycle: backfill the rest together and let Prometheus say what is missing
            ready = left
        levels.append(ready)
        done |= {r["record"] for r in ready}
        left = [r for r in left if r not in ready]
    return levels


@dataclass
class Plan:
    """How the rules are evaluated: which recordings are backfilled first, in passes, each
    alert's condition with every other recording inlined, and its firing query over it."""

    passes: list[list[dict]]
    conditions: list[str]
    queries: list[str]  # rules.alerting[i] fires where queries[i] has a series (firing_query)


def firing_query(condition: str, rule: dict) -> str:
    """PromQL over an alert's condition: a series wherever Prometheus would have it firing, on a
    1 s grid. `for: D`: firing at T when the condition held at every evaluation in [T-D, T].
    `keep_firing_for: K`: when it held at some evaluation in [T-K, T] (Prometheus keeps a
    firing alert firing until K after the condition stopped holding). Both: refused (holds)."""
    hold, keep = holds(rule)
    if hold:
        return f"count_over_time(({condition})[{hold * 1000 + 500}ms:1s]) >= {hold + 1}"
    if keep:
        return f"count_over_time(({condition})[{keep * 1000 + 500}ms:1s])"
    return condition  # held at the one evaluation in [T, T]: the condition itself, without a subquery's cost


def plan(rules: Rules, since: float, inline: bool = True, schedule: Schedule | None = None) -> Plan:
    """Inline every recording rule that can be inlined exactly (all of them, with `inline`);
    backfill the others, with what they read inlined, on the grid from `since`. With `schedule`,
    an inlined recording is read as late as that schedule has its reader read it; a backfilled
    one is read fresh."""
    labelled = {r["record"] for r in rules.recording if r.get("labels")}
    defs = {r["record"]: r["expr"] for r in rules.recording if r["record"] not in labelled}
    # a name several rules record, told apart by their `labels:` (alerts.yml's thresholds)
    variants: dict[str, list[tuple[dict[str, str], str]]] = {}
    for r in rules.recording:
        if r["record"] in labelled:
            variants.setdefault(r["record"], []).append(({k: str(v) for k, v in (r.get("labels") or {}).items()},
                                                         r["expr"]))  # fmt: skip

    def lag(reader: object, name: str) -> int:
        where = rules.alert_at[reader] if isinstance(reader, int) else rules.recorded_at[reader]
        if schedule is None:  # fresh: only a recording later in the reader's own group is a scrape late
            return int(where[0] == rules.recorded_at[name][0] and rules.recorded_at[name][1] > where[1])
        return schedule.lag(where, rules.recorded_at[name])

    inliner = Inliner(defs, LOOKBACK, since, variants, lag)
    conditions = [r["expr"] for r in rules.alerting]
    inlined = inliner.inlinable(conditions, labelled) if inline else set()
    # the recordings an alert reads, directly or through another recording
    reads = {n: [e] for n, e in defs.items()} | {n: [e for _, e in v] for n, v in variants.items()}
    needed, todo = set(), [n.name for c in conditions for n in references(c) if n.name in reads]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += [n.name for e in reads[name] for n in references(e) if n.name in reads]
    recorded = [
        {**r, "expr": inliner.inline(r["expr"], inlined, reader=r["record"])}
        for r in rules.recording
        if r["record"] in needed - inlined
    ]
    inlined_conditions = [inliner.guarded(inliner.inline(c, inlined, reader=i)) for i, c in enumerate(conditions)]
    return Plan(
        passes=recording_levels(recorded) if recorded else [],
        conditions=inlined_conditions,
        queries=[firing_query(c, r) for c, r in zip(inlined_conditions, rules.alerting, strict=True)],
    )
