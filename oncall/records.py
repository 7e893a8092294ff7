"""The lines of the page log and what becomes them: Alertmanager's webhook payload, checked
whole, turned into one page per alert; an ack's body turned into an ack line; and the key that
keeps each line once.

Do not use this to decide whether an alert should fire; that lives in the PromQL rule files.

    >>> [page_record(a, rfc3339_ms(time.time()))["alert"] for a in validate_payload(body)]
    ['TrainingLossJump']
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

STATUSES = ("firing", "resolved")


class PayloadError(ValueError):
    """A webhook payload that cannot be stored; ``field`` names the offending part, e.g. ``alerts[2].status``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def rfc3339_ms(t: float) -> str:
    """Format a Unix time as RFC3339 UTC with milliseconds, e.g. ``2024-05-01T12:00:00.250Z``."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def received_time(page: dict[str, Any]) -> float | None:
    """A page's received_at as a Unix time, or None if it is unreadable (a hand-edited line)."""
    try:
        return datetime.fromisoformat(str(page.get("received_at", "")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _string_map(value: Any, field: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(field, f"must be an object of string to string, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise PayloadError(f"{field}.{key}", f"must be a string, got {type(item).__name__}")
    return value


def validate_payload(payload: Any) -> list[dict[str, Any]]:
    """Check a whole Alertmanager v4 webhook payload and return its alerts; raise PayloadError on the first bad field.

    Do not use this on partial payloads: it checks everything so that nothing is stored from a bad one.

        >>> validate_payload({"alerts": []})
        []
    """
    if not isinstance(payload, dict):
        raise PayloadError("body", f"must be a JSON object, got {type(payload).__name__}")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts", "must be a list of alerts" if "alerts" in payload else "is missing")
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(alert, dict):
            raise PayloadError(where, f"must be an object, got {type(alert).__name__}")
        for key in ("status", "labels", "fingerprint", "startsAt"):
            if key not in alert:
                raise PayloadError(f"{where}.{key}", "is missing")
            if key == "status" and alert[key] not in STATUSES:
                raise PayloadError(f"{where}.status", f'must be "firing" or "resolved", got {alert[key]!r}')
            if key in ("fingerprint", "startsAt") and (not isinstance(alert[key], str) or not alert[key]):
                raise PayloadError(f"{where}.{key}", "must be a non-empty string")
        if not isinstance(alert.get("endsAt", ""), str):
            raise PayloadError(f"{where}.endsAt", "must be a string")
        _string_map(alert["labels"], f"{where}.labels")
        _string_map(alert.get("annotations", {}), f"{where}.annotations")
    return alerts


def page_record(alert: dict[str, Any], received_at: str, rule: dict[str, str] | None = None) -> dict[str, Any]:
    """Turn one validated alert into the page record stored as one line of the page log.

    rule: the alert's rule in force when the page came ({"expr", "for", "thresholds"}), None if unknown.
    """
    labels, annotations = alert["labels"], alert.get("annotations", {})
    return {
        "received_at": received_at,
        "alert": labels.get("alertname", ""),
        "status": alert["status"],
        "severity": labels.get("severity", ""),
        "run_id": labels.get("run_id", ""),
        "step": annotations.get("step", ""),
        "summary": annotations.get("summary", ""),
        "description": annotations.get("description", ""),
        "runbook_url": annotations.get("runbook_url", ""),
        "rule": rule,
        "fingerprint": alert["fingerprint"],
        "starts_at": alert["startsAt"],
        "ends_at": alert.get("endsAt", ""),
        "labels": labels,
        "annotations": annotations,
    }


def page_key(page: dict[str, Any]) -> tuple[str, str, str]:
    if page.get("kind") == "ack":  # an ack is kept once by the id its sender gave it
        return ("ack", str(page.get("ack_id", "")), "")
    # str(): a hand-edited line's list or mapping must not stop the pager (unhashable; issue 40, P1)
    return (str(page.get("fingerprint", "")), str(page.get("starts_at", "")), str(page.get("status", "")))


def is_page(entry: dict[str, Any]) -> bool:
    """Whether a line of the log is a page (the log also holds acks, `"kind": "ack"`)."""
    return entry.get("kind", "page") == "page"


def ack_record(body: Any, received_at: str) -> dict[str, Any]:
    """Check a POST /api/ack body and return the ack line to store; raise PayloadError on a bad field.

    >>> body = {"alert": "HeldOutGap", "run_id": "r", "comment": "looking", "by": "ada", "ack_id": "1"}
    >>> ack_record(body, "2024-05-01T12:00:05.000Z")["kind"]
    'ack'
    """
    if not isinstance(body, dict):
        raise PayloadError("body", f"must be a JSON object, got {type(body).__name__}")
    for key in ("alert", "run_id", "comment", "by", "ack_id"):
        if not isinstance(body.get(key), str):
            raise PayloadError(key, "is missing" if key not in body else "must be a string")
    for key in ("alert", "comment", "by", "ack_id"):
        if not body[key].strip():
            raise PayloadError(key, "must not be empty" + (": say what you know so far" if key == "comment" else ""))
    silence = body.get("silence", "")
    if not isinstance(silence, str):
        raise PayloadError("silence", "must be a string")
    return {
        "kind": "ack", "received_at": received_at, "alert": body["alert"], "run_id": body["run_id"],
        "comment": body["comment"], "by": body["by"], "ack_id": body["ack_id"], "silence": silence,
    }  # fmt: skip
