"""What a graded drill teaches: the hidden incident revealed, and par times beside the learner's.

`runwatch diagnose` grades once; this module says what the grade is measured against, and keeps
what the drill hid so the console's plate can show it afterwards:

- `windows(answer, ranks)`: the incident's steps, from the sealed answer and the trainer's own
  definition of each incident (`trainer.run.incident_active`), as the plate shades them;
- `detection_par(incident, layout)`: how soon after the onset the lab pages this incident at best:
  the plate's window for its first alert (runwatch.backtest.signatures, which the backtest holds
  the rules to), in lab seconds, plus the group_wait of that alert's route in alertmanager.yml;
- `response_par(incident, layout)`: how soon after the first page a learner who reads what the
  lab gives them acks and diagnoses: the first alert's runbook read at READING_WPM (ack), then its
  table of incidents (diagnosis), and never before the incident's signature has paged in full;
- `coaching(grade, earlier)`: the grade's times beside the par and the learner's own earlier
  drills (scoreboard.jsonl), so "first page -> ack: 144.2 s" has something to be compared with.

It never decides whether an alert fired: the first page is the pager's, the par a window the
backtest checks. Not for a healthy run or a cluster fault (whose strike is drawn after the
onset): those have no detection par, and say so.

    >>> windows({"incident": "lr_spike", "onset": 287, "seed": 3, "run_id": "drill-1"}, ranks=1)
    [[287, 291]]
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import requests
import yaml

from runwatch.backtest.signatures import CLUSTER_SIGNATURES, FAULT_SIGNATURES, SIGNATURES
from runwatch.core.durations import duration_seconds
from runwatch.core.paths import Layout
from runwatch.prom.server import PromQLError, instant, quoted
from runwatch.trainer.config import ConfigError, TrainConfig
from runwatch.trainer.run import incident_active

# Seconds of lab clock a step takes from the onset on: one, but on a slower device (trainer.config)
SLOWED = {"slow_node": "slow_factor", "straggler": "straggler_clock"}
# The mean silent reading rate of adults for English non-fiction, in words a minute (Brysbaert,
# "How many words do we read per minute?", Journal of Memory and Language 109, 2019): the
# ack and diagnosis pars are the time to read what the lab gives the learner at this rate.
READING_WPM = 238
# The runbook's sections a learner reads: to ack (what the page means), then to diagnose
UNTIL_ACK = "## Which incidents produce it"


def windows(answer: dict, ranks: int = 1) -> list[list[int]]:
    """The incident's step ranges [first, last], as the plate shades them; none for a healthy run."""
    if answer.get("incident") in (None, "none"):
        return []
    try:
        cfg = TrainConfig(incident=answer["incident"], onset=int(answer["onset"]), seed=int(answer.get("seed", 0)),
                          ranks=ranks, run_id=str(answer.get("run_id", "drill")),
                          strength=float(answer.get("strength", 1.0)))  # fmt: skip
        cfg.validate()
    except (KeyError, TypeError, ValueError, ConfigError):  # an answer of another shape: reveal nothing
        return []
    found: list[list[int]] = []
    for step in range(cfg.steps):
        if incident_active(cfg, step):
            if found and found[-1][1] == step - 1:
                found[-1][1] = step
            else:
                found.append([step, step])
    return found


def seconds(text: object) -> float:
    """A configuration's Prometheus duration (`5s`, `1m30s`) in seconds: runwatch.core.durations'
    grammar, the one every reader shares."""
    return duration_seconds(str(text), "a duration in prometheus.yml or alertmanager.yml")


def severity(alert: str, layout: Layout) -> str:
    """The alert's severity label, as its rule file gives it ("" if no rule says)."""
    for path in layout.rule_files():
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            for rule in group.get("rules", []):
                if rule.get("alert") == alert:
                    return str((rule.get("labels") or {}).get("severity", ""))
    return ""


def group_wait_s(alert_severity: str, alertmanager_yml: Path) -> float:
    """The group_wait of the first route whose severity matcher takes this severity (else the
    root's): how long Alertmanager holds a new group before its first page."""
    root = yaml.safe_load(alertmanager_yml.read_text())["route"]
    wait = root.get("group_wait", "30s")  # Alertmanager's default
    for route in root.get("routes") or []:
        for matcher in route.get("matchers") or []:
            m = re.fullmatch(r'\s*severity\s*(=~|=)\s*"([^"]*)"\s*', str(matcher))
            if m and (alert_severity == m[2] if m[1] == "=" else re.fullmatch(m[2], alert_severity)):
                return seconds(route.get("group_wait", wait))
    return seconds(wait)


def step_seconds(incident: str) -> float:
    """Lab seconds a step of this incident lasts after its onset (a fault's windows are in seconds)."""
    return 1 / getattr(TrainConfig(), SLOWED[incident]) if incident in SLOWED else 1.0


def detection_par(incident: str, layout: Layout | None = None) -> tuple[float, str] | None:
    """(seconds from the onset to the first page at par, how that is made up), or None where
    there is none (a healthy run, a cluster fault)."""
    expects = SIGNATURES.get(incident) or CLUSTER_SIGNATURES.get(incident)
    if incident == "none" or not expects:
        return None
    layout = layout or Layout()
    onset = TrainConfig().onset  # the signatures' windows are for the default onset
    hi, alert = min((e.fires[1], a) for a, e in expects.items() if e.fires is not None)
    step_s = step_seconds(incident)
    wait = group_wait_s(severity(alert, layout), layout.alertmanager_yml)
    # the step's scrape is evaluated within one evaluation interval (prometheus.yml)
    evaluation = seconds(yaml.safe_load(layout.prometheus_yml.read_text())["global"]["evaluation_interval"])
    par = round((hi - onset) * step_s + evaluation + wait, 1)
    why = f"{alert} by {hi - onset} steps after the onset, one {evaluation:g} s evaluation, group_wait {wait:g} s"
    return par, why


def reading_s(text: str) -> float:
    """Seconds to read `text` at READING_WPM, counting its words as written (code included)."""
    return len(text.split()) * 60 / READING_WPM


def runbook_parts(alert: str, layout: Layout) -> tuple[str, str]:
    """The alert's runbook up to UNTIL_ACK (its summary and what it means), and that section (which
    incidents produce it, up to the next heading); ("", "") if it has no runbook."""
    path = layout.runbooks_dir / f"{alert}.md"
    try:
        text = path.read_text()
    except OSError:
        return "", ""
    head, _, rest = text.partition(UNTIL_ACK)
    table = re.split(r"^## ", rest, maxsplit=1, flags=re.M)[0]
    return head, table


def response_par(incident: str, layout: Layout | None = None) -> dict[str, tuple[float, str]] | None:
    """{"ack": (s, why), "diagnosis": (s, why)}: seconds from the first page, at par, or None for a
    healthy run (no page). The first page is the alert whose signature window closes first (as
    for detection); acking at par is reading its runbook's summary and "What it means" at
    READING_WPM; diagnosing at par is reading on through "Which incidents produce it", but never
    before every alert the incident's signature fires has paged (its window's end, in lab
    seconds after the first's, and its route's group_wait): the pages alone then name it."""
    expects = SIGNATURES.get(incident) or CLUSTER_SIGNATURES.get(incident) or FAULT_SIGNATURES.get(incident)
    if incident == "none" or not expects:
        return None
    layout = layout or Layout()
    firing = sorted((e.fires[1], a) for a, e in expects.items() if e.fires is not None)
    (hi, alert), (last_hi, last) = firing[0], firing[-1]
    head, table = runbook_parts(alert, layout)
    ack = round(reading_s(head), 1)
    alertmanager_yml = layout.alertmanager_yml

    def paged(a: str, at: int) -> float:
        return at * step_seconds(incident) + group_wait_s(severity(a, layout), alertmanager_yml)

    complete = round(max(0.0, paged(last, last_hi) - paged(alert, hi)), 1)
    read_on = round(ack + reading_s(table), 1)
    words = f"{len(head.split())} words of {alert}'s runbook at {READING_WPM} words a minute"
    why_ack = f"reading {words}" if head else f"{alert} has no runbook to read"
    why_diag = (f"reading on through its {len(table.split())} words of which incidents produce it"
                if table else "nothing more to read")  # fmt: skip
    if complete > read_on:
        why_diag = f"{last} pages {complete:g} s after {alert}: the signature is whole then ({why_diag}: {read_on:g} s)"
    return {"ack": (ack, why_ack), "diagnosis": (max(read_on, complete), why_diag)}


def first_firings(prometheus: str, run_id: str, start: float, end: float) -> list[tuple[float, str]]:
    """(when, alert) for each of the run's alerts, at the first sample of Prometheus's own ALERTS
    holding it firing between start and end (its raw samples, stamped at the rule evaluation that
    fired it): the postmortem's "fired in Prometheus" events, between the onset and the page.
    None if Prometheus does not answer (the timeline goes without them)."""
    selector = f'ALERTS{{run_id="{quoted(run_id)}",alertstate="firing"}}[{max(1, int(end - start) + 1)}s]'
    try:
        found = instant(prometheus, selector, end)
    except (requests.RequestException, PromQLError):
        return []
    first: dict[str, float] = {}
    for series in found:
        alert, values = series["metric"].get("alertname", ""), series.get("values") or []
        if values:
            first[alert] = min(first.get(alert, float(values[0][0])), float(values[0][0]))
    return sorted((t, alert) for alert, t in first.items())


def _earlier(earlier: list[dict], key: str) -> str:
    times = [r[key] for r in earlier if isinstance(r.get(key), int | float)]
    if not times:
        return "your first timed drill"
    return f"your best {min(times):.1f} s, median {statistics.median(times):.1f} s over {len(times)} earlier"


def coaching(
    grade: dict, earlier: list[dict], par: tuple[float, str] | None,
    response: dict[str, tuple[float, str]] | None = None,
) -> list[str]:  # fmt: skip
    """The lines that put the grade's times in context (`runwatch diagnose` prints them)."""
    lines = []
    detect = grade.get("onset_to_first_page_s")
    if par is None:
        lines.append("par: none for this incident (a healthy run pages nothing; a fault strikes after the onset)")
    else:
        mine = "no page" if detect is None else f"{detect:.1f} s"
        lines.append(f"onset -> first page: {mine}; par {par[0]:.1f} s ({par[1]})")
    for key, what, part in (
        ("first_page_to_ack_s", "first page -> ack", "ack"),
        ("first_page_to_diagnosis_s", "first page -> diagnosis", "diagnosis"),
    ):
        if grade.get(key) is not None:
            at_par = f"par {response[part][0]:.1f} s ({response[part][1]}); " if response else ""
            lines.append(f"{what}: {grade[key]:.1f} s; {at_par}{_earlier(earlier, key)}")
    if grade.get("onset") is not None:
        lines.append(
            f"the incident ran over steps {_spans(grade.get('revealed') or [])}: the console's plate now shades it"
        )
    return lines


def _spans(found: list[list[int]]) -> str:
    return ", ".join(f"{lo}-{hi}" for lo, hi in found) or "-"
