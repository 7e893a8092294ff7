"""Incidents, as PagerDuty, Opsgenie and Grafana OnCall keep them: the pages of one alert of one
run make one incident, which stays open, unacknowledged, whatever its alert does next, until a
person acknowledges it with a comment, and its alert has resolved. Re-firing joins it.

A pure function of the page log's lines: the pager groups pages into incidents by alert and
run; it never decides whether one fired.

    >>> [i["state"] for i in incidents(read_log(Path(".runwatch/pages.jsonl")))]
    ['triggered', 'resolved']
"""

from __future__ import annotations

from typing import Any

from runwatch.oncall.records import is_page, received_time

TRIGGERED, ACKNOWLEDGED, RESOLVED = "triggered", "acknowledged", "resolved"


def incidents(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group the log's lines (oldest first) into incidents, one per (alert, run): open ones first,
    oldest first, then the resolved ones, oldest first.

    An incident is "triggered" until acknowledged, "acknowledged" while any of its alert's
    series still fires, "resolved" once acknowledged and every series has resolved. Its
    "events" are its state changes, oldest first: each page ("fired"/"resolved") and the ack.
    An ack of an (alert, run) with no page is not an incident and is left out.

        >>> [i["state"] for i in incidents(read_log(Path(".runwatch/pages.jsonl")))]
        ['triggered', 'resolved']
    """
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in entries:
        key = (str(entry.get("alert", "")), str(entry.get("run_id", "")))
        if not is_page(entry):
            incident = found.get(key)
            if incident is None or entry.get("kind") != "ack" or incident["acked_at"]:
                continue  # an ack of no incident, or a second one: the first ack is the ack
            incident.update(acked_at=entry.get("received_at", ""), acked_by=entry.get("by", ""),
                            comment=entry.get("comment", ""))  # fmt: skip
            incident["events"].append({"at": entry.get("received_at", ""), "what": "acknowledged",
                                       "by": entry.get("by", ""), "comment": entry.get("comment", "")})  # fmt: skip
            continue
        incident = found.setdefault(key, {
            "alert": key[0], "run_id": key[1], "severity": entry.get("severity", ""),
            "opened_at": entry.get("received_at", ""), "first_page": None, "acked_at": "", "acked_by": "",
            "comment": "", "resolved_at": "", "pages": [], "events": [], "_firing": set(),
        })  # fmt: skip
        incident["pages"].append(entry)
        series = entry.get("fingerprint", "")
        if entry.get("status") == "firing":
            incident["_firing"].add(series)
            if incident["first_page"] is None:
                incident["first_page"] = entry.get("received_at", "")
        else:
            incident["_firing"].discard(series)
        what = "fired" if entry.get("status") == "firing" else "resolved"
        incident["events"].append({"at": entry.get("received_at", ""), "what": what, "step": entry.get("step", "")})
    out = []
    for incident in found.values():
        firing = incident.pop("_firing")
        incident["firing"] = bool(firing)
        incident["first_page"] = incident["first_page"] or incident["opened_at"]
        if not incident["acked_at"]:
            incident["state"] = TRIGGERED
        elif firing:
            incident["state"] = ACKNOWLEDGED
        else:
            incident["state"] = RESOLVED
            last = [e["at"] for e in incident["events"] if e["what"] in ("resolved", "acknowledged")]
            incident["resolved_at"] = max(last) if last else ""
        out.append(incident)
    return sorted(out, key=lambda i: (i["state"] == RESOLVED, i["first_page"]))


def time_to_ack(incident: dict[str, Any]) -> float | None:
    """Seconds from an incident's first page to its ack, None while unacknowledged."""
    first = received_time({"received_at": incident["first_page"]})
    acked = received_time({"received_at": incident["acked_at"]}) if incident["acked_at"] else None
    return None if first is None or acked is None else round(acked - first, 1)
