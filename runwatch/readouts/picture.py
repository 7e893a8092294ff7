"""The plate as a picture, drawn from a live Prometheus without Grafana: `runwatch plate` draws
it, the postmortem of a drill embeds it, the console collects the same data for its panels.

    >>> draw(collect("http://127.0.0.1:9090", "corrupt_shard-0-083113", since_s=1200), Path("plate.png"))

It runs the very queries of grafana/dashboards/watching-a-run.json (one source of truth for
the PromQL) and lays them out as the plate does: training loss (thin) and held-out loss (dots),
the 5-step mean, gradient norm and throughput, each with its alert threshold dashed (the
threshold rule in force times the baseline, so an edited and reloaded rule moves the line),
the incident window shaded, and the
readouts (the step at which each alert first fired, as alerts.yml recorded it) written on the
figure and marked on every panel by a dotted line. The x axis is the
training step, read from runwatch_train_step at each query time.
"""

from __future__ import annotations

import io
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from runwatch.core.command import UsageError
from runwatch.core.files import write_atomic
from runwatch.core.names import FIRST_FIRED, FIRST_FIRED_RANKS
from runwatch.core.paths import Layout
from runwatch.prom.server import instant, query_range, quoted
from runwatch.readouts import colours
from runwatch.readouts import dashboard_queries as dq

# Colours of the dotted marks where alerts first fired, in order of firing.
MARKS = ("tab:purple", "tab:orange", "tab:green", "tab:brown", "tab:pink", "tab:olive")

QUERIES_AT_ONCE = 8  # the plate's queries in flight at once (Prometheus's own default allows 20)
PANELS = {
    "loss": "Training loss (thin) and held-out loss (dots)",
    "grad": "Gradient norm",
    "throughput": "Throughput (tokens/s per GPU)",
    "readouts": "Readouts: step at which each alert first fired",
    # Lesson 20's stability row (a mixed-precision run's; none in fp64)
    "scale": "Loss scale",
    "norm": "Activation norm",
}


@dataclass
class PlateData:
    """Everything the figure shows, by training step: what tests assert on."""

    run_id: str
    series: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)  # panel -> legend -> points
    incident: list[tuple[int, int]] = field(default_factory=list)  # step ranges
    readouts: dict[str, int | None] = field(default_factory=dict)


def latest_run(base: str) -> str:
    found = instant(base, "max by (run_id) (runwatch_train_run_start_time_seconds)")  # the newest start
    if not found:
        raise UsageError("--run: Prometheus holds no run yet; start one with `runwatch up`")
    return max(found, key=lambda s: float(s["value"][1]))["metric"]["run_id"]


def collect(base: str, run_id: str, since_s: float, now: float | None = None) -> PlateData:
    """Run the dashboard's queries for one run over the last since_s seconds."""
    # whole seconds, as the panels' 1 s steps; rounded up, so the last scrape is not cut off
    end = math.ceil(now if now is not None else time.time())
    start = end - math.ceil(since_s)
    dash = dq.load(Layout().dashboards_dir / "watching-a-run.json")
    variables = {"run": run_id}
    step_series = query_range(base, f'runwatch_train_step{{run_id="{quoted(run_id)}"}}', start, end, 1.0)
    if not step_series:
        raise UsageError(f"--run: no samples of run {run_id!r} in the last {since_s / 60:g} minutes (--since)")
    step_at = {round(float(t), 3): int(float(v)) for t, v in step_series[0]["values"]}
    first, last = min(step_at), max(step_at)
    start, end = first - 1, last + 1  # the run itself, not the empty minutes around it
    data = PlateData(run_id)
    queries = dq.queries(dash)
    panels = [(key, q) for key, title in PANELS.items() for q in queries if q.kind == "panel" and q.title == title]
    incident = [q for q in queries if q.kind == "annotation" and q.title == "Incident window"]
    # Every other alert that fired in the run (the cluster's, ActivationNormSpike, ...), from the
    # same first-fire records: the panel names only the plate's own, with a dash for "never"
    fired = [f'last_over_time({name}{{run_id="{run_id}"}}[{math.ceil(end - start)}s])'
             for name in (FIRST_FIRED, FIRST_FIRED_RANKS)]  # fmt: skip
    # All at once: one at a time, the plate's 21 queries took the console's view past
    # its 200 ms (bench_console); Prometheus answers them side by side. Read back in order.
    with ThreadPoolExecutor(QUERIES_AT_ONCE) as pool:
        drawn = pool.map(lambda kq: dq.run(base, kq[1], variables, start, end), panels)
        shaded = pool.map(lambda q: dq.run(base, q, variables, start, end), incident)
        also = pool.map(lambda query: instant(base, query, end), fired)
        for (key, q), found in zip(panels, drawn, strict=True):
            for series in found:
                if key == "readouts":
                    value = int(float(series["value"][1]))
                    data.readouts[q.legend] = None if value < 0 else value
                    continue
                pts = [
                    (step_at[round(float(t), 3)], float(v))
                    for t, v in series["values"]
                    if round(float(t), 3) in step_at
                ]
                data.series.setdefault(key, {})[q.legend] = pts
        for found in also:
            for series in found:
                data.readouts.setdefault(series["metric"].get("alertname", ""), int(float(series["value"][1])))
        for found in shaded:
            for series in found:
                active = sorted(
                    {step_at[round(float(t), 3)] for t, _ in series["values"] if round(float(t), 3) in step_at}
                )
                data.incident = windows(active, observed=set(step_at.values()))
    return data


def windows(active: list[int], observed: set[int]) -> list[tuple[int, int]]:
    """Join the sorted active steps into shaded (first, last) windows.

    A step shorter than the 1 s scrape interval can fall between two scrapes, so Prometheus
    never holds it. Such a gap says nothing about the incident; only a step that was scraped
    and found inactive ends a window.
    """
    out: list[tuple[int, int]] = []
    for s in active:
        if out and not any(out[-1][1] < o < s for o in observed):
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def draw(data: PlateData, out: Path) -> None:
    """Write the figure as PNG, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True, constrained_layout=True)
    readouts = "   ".join(f"{a} {'—' if s is None else s}" for a, s in data.readouts.items())
    fig.suptitle(f"Watching a Run: {data.run_id}\nfirst fired at step:  {readouts}", fontsize=11, x=0.01, ha="left")
    styles = {"held-out loss": dict(marker="o", linestyle="none", markersize=5)}
    fired: dict[int, list[str]] = {}  # step -> the alerts that first fired there, one mark each step
    for alert, step in sorted(((a, s) for a, s in data.readouts.items() if s is not None), key=lambda a_s: a_s[1]):
        fired.setdefault(step, []).append(alert)
    for ax, key, ylabel in zip(
        axes, ("loss", "grad", "throughput"), ("loss (nats)", "gradient norm", "tokens/s"), strict=True
    ):
        for legend, pts in data.series.get(key, {}).items():
            if pts:
                xs, ys = zip(*pts, strict=True)
                # each curve in the colour of its meaning, as the console and Grafana draw it
                style = styles.get(legend, {"linewidth": 0.8, "linestyle": "--" if colours.dashed(legend) else "-"})
                if colours.colour(legend):
                    style = {**style, "color": colours.colour(legend)}
                ax.plot(xs, ys, label=legend, **style)
        for lo, hi in data.incident:
            ax.axvspan(lo, hi + 1, color="red", alpha=0.12, label="incident" if key == "loss" else None)
        previous = None
        for (step, alerts), color in zip(fired.items(), MARKS, strict=False):
            ax.axvline(step, color=color, linestyle=":", linewidth=1.2)
            # Name each mark once, at the top of the figure; a mark within 15 steps of the one
            # before has its name lower down, so two names a step apart do not print over each other.
            close = previous is not None and step - previous[0] <= 15 and previous[1] == 0
            previous = (step, 1 if close else 0)
            if key == "loss":
                ax.annotate(
                    f"{', '.join(alerts)} {step}", (step, 0.5 if close else 1), xycoords=("data", "axes fraction"),
                    xytext=(2, -2), textcoords="offset points", rotation=90, va="top", fontsize=7, color=color,
                )  # fmt: skip
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[-1].set_xlabel("training step")
    image = io.BytesIO()
    try:
        fig.savefig(image, format="png", dpi=100)
    finally:
        plt.close(fig)
    write_atomic(out, image.getvalue())  # whole, fsynced, readable by others (mkstemp's 0600 was not)
