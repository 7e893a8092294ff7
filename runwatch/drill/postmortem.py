"""`runwatch postmortem [--out FILE]`: write the diagnosed drill's postmortem, in PagerDuty's
sections: the timeline (start, onset, pages Prometheus confirms, acks, diagnosis, the run's end)
and the plate, as Markdown beside the drill (STATE_DIR/postmortem-RUN.md).
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from datetime import datetime
from pathlib import Path

import requests

from runwatch.core.command import Command, UsageError, add_state_dir, check_writable, read_json
from runwatch.core.files import write_atomic
from runwatch.drill import coach
from runwatch.drill.confirm import fired_in_prometheus, notification_window_s, received_at
from runwatch.drill.record import Drill, acked_at, iso, now, seconds
from runwatch.oncall.incidents import time_to_ack
from runwatch.oncall.page_log import read_incidents, read_pages
from runwatch.readouts import picture as plate


def postmortem(args: argparse.Namespace) -> int:
    d = Drill(args.state_dir)
    record = d.load()
    run_id = record["run_id"]
    grade = record.get("grade")
    if grade is None:
        raise UsageError("diagnose the drill first (`runwatch diagnose INCIDENT`): the timeline needs the truth")
    out = args.out or d.lab.state / f"postmortem-{run_id}.md"  # beside the drill, not in a checkout
    check_writable(out, "--out")
    try:
        events = timeline(d, record, grade)
        postmortem_markdown(run_id, grade, events, "")  # the same record's shape, before the plate is drawn
    except (KeyError, TypeError, AttributeError, ValueError) as err:  # a hand-edited drill.json
        raise UsageError(f"{d.path}: the drill's record is damaged ({type(err).__name__}: {err})") from None
    image = out.with_name(f"{out.stem}-plate.png")
    try:
        plate.draw(plate.collect(d.lab.url("prometheus"), run_id, since_s=now() - record["started_at"] + 60), image)
        plate_md = f"![The run, drawn by runwatch plate]({image.name})"
    except (UsageError, requests.RequestException) as err:
        plate_md = f"(no plate: {err})"
    write_atomic(out, postmortem_markdown(run_id, grade, events, plate_md))
    print(f"wrote {out} ({len(events)} timeline events)")
    return 0


def timeline(d: Drill, record: dict, grade: dict) -> list[tuple[float, str]]:
    """The drill's events, oldest first: start, onset, each alert's first firing, pages, acks,
    diagnosis, the run's end."""
    run_id = record["run_id"]
    events = [(record["started_at"], "Drill started (lab up, trainer running)")]
    if record["diagnosis"].get("onset_at"):
        events.append(
            (record["diagnosis"]["onset_at"], f"Incident began: {grade['incident']} at step {grade['onset']}")
        )
    fired = coach.first_firings(d.lab.url("prometheus"), run_id, record["started_at"], record["diagnosis"]["at"])
    events += [(t, f"Fired in Prometheus: {alert} (its rule, before Alertmanager pages it)") for t, alert in fired]
    for p in read_pages(d.lab.page_log):
        if p.get("run_id") == run_id and received_at(p) is not None:
            what = "Page" if p.get("status") == "firing" else "Resolved"
            if not fired_in_prometheus(
                d.lab.url("prometheus"), p, run_id, notification_window_s(d.lab.alertmanager_yml)
            ):
                what = f"Unconfirmed {what.lower()} (Prometheus was not firing this alert as it came)"
            value = p.get("value_at_resolution")
            measured = f", its rule measuring {value:.3g}" if isinstance(value, float) else ""
            events.append(
                (
                    received_at(p),
                    f"{what}: {p.get('alert')} (step {p.get('step') or '-'}{measured}): {p.get('summary')}",
                )
            )
    for incident in read_incidents(d.lab.page_log, run_id):
        if (at := acked_at(incident)) is not None:
            after = time_to_ack(incident)
            events.append((at, f"Acknowledged {incident['alert']} by {incident['acked_by']}, "
                               f"{seconds(after)} after its first page: {incident['comment']}"))  # fmt: skip
    events.append(
        (record["diagnosis"]["at"], f"Diagnosed as {grade['diagnosed']} ({'correct' if grade['correct'] else 'wrong'})")
    )
    run_json = d.lab.runs / run_id / "run.json"
    try:  # the trainer's record: damaged, the timeline goes without its end, and says why
        ended = read_json(run_json, "the run's record").get("ended_at") if run_json.exists() else None
        if ended:
            events.append((datetime.fromisoformat(str(ended)).timestamp(), "Run ended"))
    except (UsageError, ValueError) as err:
        print(f"runwatch postmortem: the timeline has no run end: {err}", file=sys.stderr)
    events.sort(key=lambda e: e[0])
    return events


# Inside a table cell only these act: code, emphasis, links, strikethrough and the cell's end
# (a heading, list or quote needs the start of a line, which a flattened cell never is).
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md_text(text: object) -> str:
    """Text from a page (any local process can post one) as inert Markdown on one line: HTML
    escaped, Markdown's inline punctuation backslash-escaped, control characters and newlines as
    spaces, so a summary cannot leave its table cell, start a heading, or inject a link or a tag.

    >>> md_text("a | b\\n## <b>x</b>")
    'a \\\\| b ## &lt;b&gt;x&lt;/b&gt;'
    """
    flat = "".join(ch if ch.isprintable() else " " for ch in str(text))
    return MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(flat, quote=False))


def _par(grade: dict, key: str) -> str:
    """The par beside a time, " (par N s)", from the grade (runwatch/drill/coach.py); "" if it has none."""
    par = grade.get(f"par_{key}")
    return f" (par {seconds(par)})" if isinstance(par, int | float) else ""


def postmortem_markdown(run_id: str, grade: dict, events: list[tuple[float, str]], plate_md: str) -> str:
    """PagerDuty's postmortem sections, filled from the grade and the timeline."""
    impact = (
        "None: the run was healthy." if grade["incident"] == "none"
        else f"{grade['incident']} from step {grade['onset']}; first page "
        f"{seconds(grade['onset_to_first_page_s'])} after the onset."
    )  # fmt: skip
    md = [
        f"# Postmortem: drill {run_id}",
        "",
        "## Overview",
        f"A drill on the runwatch lab. The hidden incident was **{grade['incident']}**; it was diagnosed as "
        f"**{grade['diagnosed']}** ({'correct' if grade['correct'] else 'wrong'}).",
        "",
        "## What happened",
        f"First page: {md_text(grade['first_page'] or 'none')}. "
        f"Onset to first page: {seconds(grade['onset_to_first_page_s'])}{_par(grade, 'onset_to_first_page_s')}; "
        f"first page to ack: {seconds(grade['first_page_to_ack_s'])}{_par(grade, 'first_page_to_ack_s')}; "
        f"first page to diagnosis: {seconds(grade['first_page_to_diagnosis_s'])}"
        f"{_par(grade, 'first_page_to_diagnosis_s')}.",
        "",
        plate_md,
        "",
        "## Contributing factors",
        "_Fill in: what let this happen, and what made it harder to see?"
        " (Which signal showed it first? Which stayed quiet?)_",
        "",
        "## Resolution",
        "_Fill in: what you would do to recover (see the runbook of the first page)._",
        "",
        "## Impact",
        impact,
        "",
        "## Timeline",
        "| time (UTC) | event |",
        "|---|---|",
        *[f"| {iso(t)} | {md_text(text)} |" for t, text in events],
        "",
        "## Action items",
        "_Fill in: owner, action, due. Alert changes can be measured first with `runwatch backtest`._",
        "",
    ]
    return "\n".join(md)


def add_postmortem(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("--out", type=Path, default=None, help="Markdown file (default STATE_DIR/postmortem-RUN.md)")
    return postmortem
