"""Read the provisioned dashboards' queries and run them against Prometheus as Grafana would.

Grafana does not run on the machines this lab is built on, so this is how the dashboards are
proven (tests/test_dashboards.py) and how `runwatch plate` draws the plate without a second
copy of the PromQL: every query comes from grafana/dashboards/*.json.

    >>> qs = queries(load(Layout().dashboards_dir / "watching-a-run.json"))
    >>> expr = substitute(qs[0].expr, {"run": "corrupt_shard-0-083113"}, range_s=600)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import requests

from runwatch.promserver import instant, query_range

SCRAPE_INTERVAL_S = 1  # the Prometheus datasource's timeInterval (grafana/provisioning)
MAX_DATA_POINTS = 1000  # about a panel's width in pixels, which Grafana uses to pick $__interval


@dataclass(frozen=True)
class Query:
    kind: str  # "panel", "annotation" or "variable"
    title: str  # panel title, annotation name or variable name
    ref: str  # the target's refId ("" for annotations and variables)
    expr: str
    legend: str = ""
    instant: bool = False
    datasource_uid: str = ""


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def queries(dashboard: dict) -> list[Query]:
    """Every PromQL query of a dashboard: panel targets, annotation queries, template variables."""
    out = []
    for panel in dashboard.get("panels", []):
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
                )
            )
    for ann in dashboard.get("annotations", {}).get("list", []):
        if "expr" in ann:
            out.append(Query("annotation", ann["name"], "", ann["expr"], datasource_uid=ann["datasource"]["uid"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"] if isinstance(var["query"], str) else var["query"]["query"]
            out.append(Query("variable", var["name"], "", q, datasource_uid=var["datasource"]["uid"]))
    return out


def grafana_intervals(range_s: float) -> dict[str, str]:
    """$__interval, $__rate_interval and $__range for a time range, as Grafana computes them."""
    interval = max(SCRAPE_INTERVAL_S, int(range_s // MAX_DATA_POINTS))
    rate = max(interval + SCRAPE_INTERVAL_S, 4 * SCRAPE_INTERVAL_S)
    return {
        "__rate_interval": f"{rate}s",
        "__interval_ms": str(interval * 1000),
        "__interval": f"{interval}s",
        "__range_s": str(int(range_s)),
        "__range_ms": str(int(range_s * 1000)),
        "__range": f"{int(range_s)}s",
    }


def substitute(expr: str, variables: dict[str, str], range_s: float) -> str:
    """Replace Grafana's built-in and template variables ($x and ${x}) in expr."""
    values = {**grafana_intervals(range_s), **variables}
    # longest names first, so $__range_s is not read as $__range followed by "_s"
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name])
        expr = re.sub(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])", lambda _m, v=values[name]: v, expr)
    return expr


LABEL_VALUES = re.compile(r"label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>[a-zA-Z_]\w*)\s*\)")


def run(base: str, q: Query, variables: dict[str, str], start: float, end: float) -> list[dict]:
    """Execute one query the way Grafana's Prometheus datasource would, returning Prometheus's result.

    Variables: label_values(match, label) goes to /api/v1/series. Instant targets are queried at
    `end`; range targets and annotations over [start, end] at $__interval.
    """
    expr = substitute(q.expr, variables, end - start)
    if q.kind == "variable":
        m = LABEL_VALUES.fullmatch(expr.strip())
        if not m:
            raise ValueError(f"variable {q.title}: only label_values(...) queries are supported, got {expr!r}")
        resp = requests.get(
            f"{base}/api/v1/series", params={"match[]": m["match"], "start": start, "end": end}, timeout=30
        )
        resp.raise_for_status()
        values = sorted({s[m["label"]] for s in resp.json()["data"] if m["label"] in s})
        return [{"metric": {m["label"]: v}} for v in values]
    if q.instant:
        return instant(base, expr, end)
    step = float(grafana_intervals(end - start)["__interval"].rstrip("s"))
    return query_range(base, expr, start, end, step)
