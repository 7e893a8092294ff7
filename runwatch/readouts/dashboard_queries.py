"""Read the provisioned dashboards' queries and run them against Prometheus as Grafana would.

Grafana does not run on the machines this lab is built on, so this is how the dashboards are
proven (tests/test_dashboards.py) and how `runwatch plate` draws the plate without a second
copy of the PromQL: every query comes from grafana/dashboards/*.json.

    >>> qs = queries(load(Layout().dashboards_dir / "watching-a-run.json"))
    >>> expr = substitute(qs[0].expr, {"run": "corrupt_shard-0-083113"}, range_s=600)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import requests

from runwatch.core.durations import DurationError, duration_seconds
from runwatch.prom.server import instant, query_range, quoted

SCRAPE_INTERVAL_S = 1  # the Prometheus datasource's timeInterval (grafana/provisioning)
MAX_DATA_POINTS = 1000  # about a panel's width in pixels, which Grafana uses to pick $__interval
PROMETHEUS_MAX_POINTS = 11000  # Prometheus refuses more points per series; Grafana widens the step


@dataclass(frozen=True)
class Query:
    kind: str  # "panel", "annotation" or "variable"
    title: str  # panel title, annotation name or variable name
    ref: str  # the target's refId ("" for annotations and variables)
    expr: str
    legend: str = ""
    instant: bool = False
    datasource_uid: str = ""
    max_data_points: int = MAX_DATA_POINTS  # the panel's, if it sets one
    min_interval_s: int = SCRAPE_INTERVAL_S  # the panel's "interval", if it sets one
    regex: str = ""  # a variable's regex: its first group is the value


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def queries(dashboard: dict) -> list[Query]:
    """Every PromQL query of a dashboard: panel targets, annotation queries, template variables."""
    out = []
    for panel in dashboard.get("panels", []):
        points = int(panel.get("maxDataPoints") or MAX_DATA_POINTS)
        interval = seconds(panel["interval"]) if panel.get("interval") else SCRAPE_INTERVAL_S
        for t in panel.get("targets", []):
            uid = (t.get("datasource") or panel.get("datasource") or {}).get("uid", "")
            out.append(
                Query(
                    "panel",
                    panel["title"],
                    t["refId"],
                    t["expr"],
                    t.get("legendFormat", ""),
                    bool(t.get("instant")),
                    uid,
                    points,
                    interval,
                )
            )
    for ann in dashboard.get("annotations", {}).get("list", []):
        if "expr" in ann:
            out.append(Query("annotation", ann["name"], "", ann["expr"], datasource_uid=ann["datasource"]["uid"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"] if isinstance(var["query"], str) else var["query"]["query"]
            uid = var["datasource"]["uid"]
            out.append(Query("variable", var["name"], "", q, datasource_uid=uid, regex=var.get("regex", "")))
    return out


def seconds(duration: str) -> int:
    """A panel's interval ("1s", "15s", "1m") in whole seconds."""
    value = duration_seconds(duration.strip(), "panel interval")
    if value != int(value):
        raise DurationError(f"panel interval: {duration!r} is not a whole number of seconds")
    return int(value)


def grafana_intervals(
    range_s: float, max_data_points: int = MAX_DATA_POINTS, min_interval_s: int = SCRAPE_INTERVAL_S
) -> dict[str, str]:
    """$__interval, $__rate_interval and $__range for a time range, as Grafana computes them.

    The interval is the range over the panel's maxDataPoints, at least its minimum interval,
    and widened so that no series exceeds Prometheus's 11,000 points.
    """
    interval = max(min_interval_s, int(range_s // max_data_points), math.ceil(range_s / PROMETHEUS_MAX_POINTS))
    rate = max(interval + SCRAPE_INTERVAL_S, 4 * SCRAPE_INTERVAL_S)
    return {
        "__rate_interval": f"{rate}s",
        "__interval_ms": str(interval * 1000),
        "__interval": f"{interval}s",
        "__range_s": str(int(range_s)),
        "__range_ms": str(int(range_s * 1000)),
        "__range": f"{int(range_s)}s",
    }


def substitute(expr: str, variables: dict[str, str], range_s: float, q: Query | None = None) -> str:
    """Replace Grafana's built-in and template variables ($x and ${x}) in expr."""
    limits = (q.max_data_points, q.min_interval_s) if q is not None else ()
    # a template variable's value goes inside a quoted label matcher (run_id="$run"): escaped
    values = {**grafana_intervals(range_s, *limits), **{k: quoted(v) for k, v in variables.items()}}
    # longest names first, so $__range_s is not read as $__range followed by "_s"
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name])
        expr = re.sub(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])", lambda _m, v=values[name]: v, expr)
    return expr


LABEL_VALUES = re.compile(r"label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>[a-zA-Z_]\w*)\s*\)")
QUERY_RESULT = re.compile(r"query_result\((?P<expr>.+)\)", re.DOTALL)


def result_text(series: dict) -> str:
    """One instant result as Grafana's query_result() shows it: name{labels} value timestamp."""
    labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    t, v = series["value"]
    return f"{series['metric'].get('__name__', '')}{{{inner}}} {v} {int(float(t) * 1000)}"


def variable_values(texts: list[str], regex: str) -> list[str]:
    """A variable's options from its query's texts: the regex's first group (or the whole
    match), each once, in the order the query gave them (the variable's sort is disabled)."""
    pattern = re.compile(regex[1:-1]) if regex.startswith("/") and regex.endswith("/") else None
    out: list[str] = []
    for text in texts:
        if pattern is not None:
            m = pattern.search(text)
            if m is None:
                continue
            text = m.group(1) if m.groups() else m.group(0)
        if text not in out:
            out.append(text)
    return out


def run(base: str, q: Query, variables: dict[str, str], start: float, end: float) -> list[dict]:
    """Execute one query the way Grafana's Prometheus datasource would, returning Prometheus's result.

    Variables: label_values(match, label) goes to /api/v1/series, query_result(expr) is an instant
    query at `end`; either gives [{"metric": {"value": option}}, ...] in the variable's order.
    Instant targets are queried at `end`; range targets and annotations over [start, end] at the
    panel's $__interval.
    """
    expr = substitute(q.expr, variables, end - start, q)
    if q.kind == "variable":
        if m := QUERY_RESULT.fullmatch(expr.strip()):
            texts = [result_text(s) for s in instant(base, m["expr"], end)]
            return [{"metric": {"value": v}} for v in variable_values(texts, q.regex)]
        m = LABEL_VALUES.fullmatch(expr.strip())
        if not m:
            raise ValueError(f"variable {q.title}: only label_values() and query_result() are supported, got {expr!r}")
        resp = requests.get(
            f"{base}/api/v1/series", params={"match[]": m["match"], "start": start, "end": end}, timeout=30
        )
        resp.raise_for_status()
        values = sorted({s[m["label"]] for s in resp.json()["data"] if m["label"] in s})
        return [{"metric": {"value": v}} for v in values]
    if q.instant:
        return instant(base, expr, end)
    step = float(grafana_intervals(end - start, q.max_data_points, q.min_interval_s)["__interval"].rstrip("s"))
    # Grafana aligns the range to its step, so the same panel over two ranges evaluates at the
    # same instants where they overlap.
    return query_range(base, expr, math.floor(start / step) * step, math.floor(end / step) * step, step)


def by_field(frames: dict[str, list], x: str) -> dict[str, list[tuple[float, float]]]:
    """A trend panel's drawing: each series joined by time (an outer join) to the series named x,
    and drawn against x's value at that time. frames: legend -> [[time, value], ...]."""
    at = {round(float(t), 3): float(v) for t, v in frames.get(x, [])}
    return {
        legend: [(at[round(float(t), 3)], float(v)) for t, v in values if round(float(t), 3) in at]
        for legend, values in frames.items()
        if legend != x
    }
