"""The plate's incidents overlaid on a recorded run (`runwatch backtest --from-prometheus --inject`):
the run moved to the backtest's clock, and copies of it with an incident from an onset on.

    >>> run = on_the_grid("my-run", found)  # found: the run's raw samples, as Prometheus returns them
    >>> [injected(run, Injection("throughput_cut", 0.3), t, step, None) for t, step in onsets(run, 5)]

Not for the lab's simulated runs, whose incidents the trainer makes (trainer.config).
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass

from runwatch.core.command import UsageError
from runwatch.core.names import RECORDED_INCIDENTS
from runwatch.exporter import metrics as m
from runwatch.trainer.offline import DEFAULT_START

INJECTIONS = {  # kind -> (the alert the plate pages it with, default strength, what it is)
    "loss_to_chance": (RECORDED_INCIDENTS["loss_to_chance"], 1.0, "loss a share S of the way to chance, lasting"),
    "gradient_spike": (RECORDED_INCIDENTS["gradient_spike"], 1.0, "gradient norm x 10^S for 5 samples"),
    "throughput_cut": (RECORDED_INCIDENTS["throughput_cut"], 0.3, "tokens/s x (1 - S), lasting"),
}
SPIKE_SAMPLES = 5  # a gradient spike's length: the plate's lr spike lasts 5 steps
WARMUP_S = 90  # no onset before this much history: the baselines need 20-30 samples
HORIZON_S = 300  # an injection not seen in 5 minutes is missed; a copy ends here
BASELINE_S = 1860  # a copy keeps this much history before its onset: ThroughputDrop's 30 m baseline, 30 s back


@dataclass(frozen=True)
class Injection:
    kind: str
    strength: float

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.strength:g}"

    @property
    def alert(self) -> str:
        return INJECTIONS[self.kind][0]


def parse_injections(text: str) -> list[Injection]:
    """'throughput_cut:0.3,gradient_spike' -> [Injection]; UsageError naming --inject otherwise."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        kind, _, strength = part.partition(":")
        if kind not in INJECTIONS:
            known = ", ".join(f"{k} ({v[2]})" for k, v in INJECTIONS.items())
            raise UsageError(f"--inject: unknown incident {kind!r}; choose from {known}")
        try:
            s = float(strength) if strength else INJECTIONS[kind][1]
        except ValueError:
            s = math.nan
        if not 0 < s <= 1:
            raise UsageError(f"--inject: {kind}'s strength must be a number in (0, 1], got {strength!r}")
        out.append(Injection(kind, s))
    if len(set(out)) != len(out):
        raise UsageError(f"--inject: an incident is given twice in {text!r}")
    return out


@dataclass
class Run:
    run_id: str  # in the throwaway: the recorded id, or a copy's
    source: str  # the recorded run it is (a copy's parent)
    series: list[tuple[str, list[tuple[str, str]], list[float], list[int]]]  # as write_request takes them
    end_ms: int
    injection: Injection | None = None
    onset_ms: int | None = None
    onset_step: int | None = None
    first_ms: int = 0
    trained_ms: int = 0  # when its step last moved: a finished run's series are scraped on after its end

    @property
    def hours(self) -> float:
        """How long it trained: from its first sample to its last step."""
        return (self.trained_ms - self.first_ms) / 3.6e6


def on_the_grid(run_id: str, found: list[dict]) -> Run:
    """The run's samples, moved by whole seconds and its scrape phase so that it starts at
    DEFAULT_START and each scrape falls half a second before a whole second, where the
    backtest's grid reads it (as the live lab's rules read the scrape before them). Its target
    labels become the backtest's (job trainer, instance offline/RUN), with an `up` of 1 at each of
    its steps; a second target of the run (a rank) keeps its address after the run's."""
    steps = [s for s in found if s["metric"]["__name__"] == m.STEP]
    if not steps:
        raise UsageError(f"--run-ids: run {run_id} has no {m.STEP} samples: did its job call step()?")
    main = steps[0]["metric"].get("instance", "")
    stamps = [round(float(t) * 1000) for t, _ in steps[0]["values"]]
    phase = int(statistics.median(t % 1000 for t in stamps))
    shift = int(DEFAULT_START * 1000) - (stamps[0] - phase) + (500 - phase)  # whole seconds, then to .500
    series = []
    for s in found:
        labels = {k: v for k, v in s["metric"].items() if k not in ("__name__", "job", "instance")}
        where = s["metric"].get("instance", "")
        instance = f"offline/{run_id}" + ("" if where == main else f"/{where}")
        values = [float(v) for _, v in s["values"]]
        series.append((s["metric"]["__name__"], sorted({**labels, "job": "trainer", "instance": instance}.items()),
                       values, [round(float(t) * 1000) + shift for t, _ in s["values"]]))  # fmt: skip
    t = [x + shift for x in stamps]
    series.append(("up", [("instance", f"offline/{run_id}"), ("job", "trainer")], [1.0] * len(t), t))
    values = [float(v) for _, v in steps[0]["values"]]
    trained = next((t[i] for i in range(len(t) - 1, 0, -1) if values[i] != values[i - 1]), t[-1])
    return Run(run_id, run_id, series, max(max(s[3]) for s in series), first_ms=t[0], trained_ms=trained)


def onsets(run: Run, count: int) -> list[tuple[int, int]]:
    """(time, step) of `count` onsets spread evenly over the run's history, WARMUP_S after its
    start and before its last minute of training; a UsageError if it is too short for one."""
    name, _, values, stamps = next(s for s in run.series if s[0] == m.STEP)
    usable = [(t, int(v)) for t, v in zip(stamps, values, strict=True)
              if t >= run.first_ms + WARMUP_S * 1000 and t <= run.trained_ms - 60_000]  # fmt: skip
    if not usable:
        need = WARMUP_S + 60
        raise UsageError(f"--inject: run {run.source} trained {run.hours * 3600:.0f} s; an injection "
                         f"needs {need} s ({WARMUP_S} s of history before its onset, a minute after)")  # fmt: skip
    picks = [usable[int(i * (len(usable) - 1) / max(count - 1, 1))] for i in range(count)] if count > 1 else [
        usable[len(usable) // 2]]  # fmt: skip
    return list(dict.fromkeys(picks))


def injected(run: Run, inj: Injection, onset_ms: int, onset_step: int, chance: float | None) -> Run:
    """A copy of the run with the incident overlaid from onset_ms on, cut to BASELINE_S before it
    and HORIZON_S after it."""
    copy_id = f"{run.source}+{inj.name}@{onset_step}"
    lo, hi = onset_ms - BASELINE_S * 1000, onset_ms + HORIZON_S * 1000
    out = []
    for name, labels, values, stamps in run.series:  # each series' stamps rise
        a, b = bisect.bisect_left(stamps, lo), bisect.bisect_right(stamps, hi)
        v, t = values[a:b], stamps[a:b]
        after = range(bisect.bisect_left(t, onset_ms), len(t))
        if inj.kind == "loss_to_chance" and name in (m.LOSS, m.HELDOUT_LOSS):
            for i in after:
                v[i] += inj.strength * (chance - v[i])
        elif inj.kind == "gradient_spike" and name == m.GRADIENT_NORM:
            for i in after[:SPIKE_SAMPLES]:
                v[i] *= 10**inj.strength
        elif inj.kind == "throughput_cut" and name == m.TOKENS_PER_SECOND:
            for i in after:
                v[i] *= 1 - inj.strength
        elif inj.kind == "throughput_cut" and name == m.TOKENS + "_total" and after:
            base = v[max(after[0] - 1, 0)]
            for i in after:
                v[i] = base + (v[i] - base) * (1 - inj.strength)
        labels = [(k, copy_id if k == "run_id" else x.replace(f"offline/{run.run_id}", f"offline/{copy_id}", 1)
                   if k == "instance" else x) for k, x in labels]  # fmt: skip
        if t:
            out.append((name, labels, v, t))
    end, first = max(max(s[3]) for s in out), min(s[3][0] for s in out)
    return Run(copy_id, run.source, out, end, inj, onset_ms, onset_step, first)
