"""What the pager asks Prometheus about a page: the alert's rule in force when it came, and what
that rule measured when the alert resolved. Prometheus evaluates; the pager only stores.

Every lookup is bounded by RULES_TIMEOUT_S, name resolution included: a Prometheus that does not
answer delays a page by at most that, and the page is stored without it.

    >>> rules_in_force("http://127.0.0.1:9090")["HeldOutGap"]["for"]
    '10s'
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import urlencode
from urllib.request import ProxyHandler, build_opener

from runwatch.oncall.records import received_time

# How long a webhook waits for Prometheus's rules before storing its pages without them.
RULES_TIMEOUT_S = 2.0


def rules_in_force(prometheus: str, timeout: float = RULES_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """Each alerting rule's expression, `for:` and thresholds as Prometheus holds them now, by alert name.

    A page stores its alert's rule, so it quotes the threshold that fired it, whatever a
    description says and however the rule is edited later. A model alert reads its threshold
    from a recording rule labelled with its name (alerts.yml's alert:runwatch_threshold:ratio),
    so "thresholds" holds every recording rule labelled alertname=<this alert>, as
    name{labels} -> expression. Empty if Prometheus does not answer within timeout: pages are
    stored all the same, without their rule.

        >>> rules_in_force("http://127.0.0.1:9090")["HeldOutGap"]["thresholds"]
        {'alert:runwatch_threshold:ratio{alertname="HeldOutGap"}': 'vector(2)'}
    """
    if not prometheus:
        return {}
    # In a thread, so that the whole lookup, name resolution included (which a socket timeout
    # does not bound, and which Podman's DNS can stall for seconds), delays pages by at most
    # timeout. A lookup still running then finishes on its own and is dropped.
    found: dict[str, dict[str, Any]] = {}
    lookup = threading.Thread(target=_read_rules, args=(prometheus, timeout, found), daemon=True)
    lookup.start()
    lookup.join(timeout)
    return dict(found) if not lookup.is_alive() else {}


def _read_rules(prometheus: str, timeout: float, found: dict[str, dict[str, Any]]) -> None:
    opener = build_opener(ProxyHandler({}))  # the lab's Prometheus is local: never through a proxy
    try:
        with opener.open(f"{prometheus.rstrip('/')}/api/v1/rules", timeout=timeout) as resp:
            groups = json.loads(resp.read())["data"]["groups"]
        every = [r for g in groups for r in g["rules"]]
        thresholds: dict[str, dict[str, str]] = {}  # alert name -> {name{labels}: expression}
        for r in (r for r in every if r.get("type") == "recording" and (r.get("labels") or {}).get("alertname")):
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(r["labels"].items()))
            thresholds.setdefault(str(r["labels"]["alertname"]), {})[f"{r['name']}{{{labels}}}"] = str(r["query"])
        read: dict[str, dict[str, Any]] = {}
        for r in (r for r in every if r.get("type") == "alerting"):  # in two groups: the first, as listed
            name = str(r["name"])
            read.setdefault(
                name,
                {"expr": str(r["query"]), "for": f"{float(r.get('duration', 0)):g}s",
                 "thresholds": thresholds.get(name, {})},
            )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # OSError covers URLError and timeouts
        return
    found.update(read)


# A comparison an alert ends in, and the threshold that makes it hold for every value
ALWAYS_HOLDS = {">": "-Inf", ">=": "-Inf", "<": "+Inf", "<=": "+Inf"}


def value_at_resolution(prometheus: str, rule: dict[str, Any] | None, alert: dict[str, Any],
                        timeout: float = RULES_TIMEOUT_S) -> float | None:  # fmt: skip
    """What the alert's rule measured when the alert resolved (its endsAt), as Prometheus
    evaluates it: a resolved notification carries the annotations of the last firing
    evaluation, so its description quotes a value the run no longer has.

    Only for a rule of the form MEASURE OP scalar(THRESHOLD RULE) (alerts.yml's model alerts):
    Prometheus parses the expression and names its comparison; the threshold rule's selector is
    put to the value that makes that comparison hold for every measure, and Prometheus
    evaluates the result at endsAt. Python compares nothing. None where it cannot say.

        >>> value_at_resolution("http://127.0.0.1:9090", page["rule"], alert)
        1.62
    """
    thresholds = (rule or {}).get("thresholds") or {}
    expr = str((rule or {}).get("expr", ""))
    ends = received_time({"received_at": alert.get("endsAt", "")})
    if not prometheus or len(thresholds) != 1 or ends is None or next(iter(thresholds)) not in expr:
        return None
    found: list[float] = []
    ask = threading.Thread(target=_measure, args=(prometheus, expr, next(iter(thresholds)), ends, alert, found),
                           daemon=True)  # fmt: skip
    ask.start()
    ask.join(timeout)
    return found[0] if found and not ask.is_alive() else None


def _measure(prometheus: str, expr: str, selector: str, at: float, alert: dict[str, Any], found: list) -> None:
    opener = build_opener(ProxyHandler({}))
    base = prometheus.rstrip("/")
    try:
        with opener.open(f"{base}/api/v1/parse_query?{urlencode({'query': expr})}", timeout=RULES_TIMEOUT_S) as resp:
            tree = json.loads(resp.read())["data"]
        fill = (
            ALWAYS_HOLDS.get(tree.get("op", "")) if tree.get("type") == "binaryExpr" and not tree.get("bool") else None
        )
        if fill is None:
            return
        query = urlencode({"query": expr.replace(selector, f"vector({fill})"), "time": f"{at:.3f}"})
        with opener.open(f"{base}/api/v1/query?{query}", timeout=RULES_TIMEOUT_S) as resp:
            result = json.loads(resp.read())["data"]["result"]
        labels = alert.get("labels", {})
        mine = [r for r in result if all(labels.get(k) == v for k, v in r["metric"].items() if k != "__name__")]
        if len(mine) == 1:
            found.append(float(mine[0]["value"][1]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
