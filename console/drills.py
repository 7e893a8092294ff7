"""The console's Drills page: every graded drill of the lab, newest first, with its times beside
their par and the learner's best, from the lab's scoreboard (scoreboard.jsonl in its state
directory, which `runwatch diagnose` appends to; runwatch/drill/coach.py says what a par is).

It reads that file only, and never grades: a line that is not a grade (torn, hand-edited) is
left out, as `runwatch diagnose` leaves it out of its scoreboard line.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

TIMES = ("onset_to_first_page_s", "first_page_to_ack_s", "first_page_to_diagnosis_s")


def graded(console: Any) -> list[dict]:
    """The lab's graded drills, oldest first (none without a state directory: compose's console)."""
    if console.sources.state_dir is None:
        return []
    rows = []
    with contextlib.suppress(OSError):
        for line in (console.sources.state_dir / "scoreboard.jsonl").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, RecursionError):
                row = json.loads(line)
                if isinstance(row, dict) and isinstance(row.get("correct"), bool):
                    rows.append({k: v for k, v in row.items() if isinstance(v, str | int | float | bool | None)})
    return rows


def best(rows: list[dict]) -> dict[str, float | None]:
    """Each time's best over the drills that have it."""
    found = {}
    for key in TIMES:
        times = [r[key] for r in rows if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)]
        found[key] = min(times) if times else None
    return found


def drills_page(request: Request) -> Response:
    console = request.app.state.console
    rows = graded(console)
    right = sum(r["correct"] for r in rows)
    return console.render("drills.html", rows=list(reversed(rows)), best=best(rows), right=right, times=TIMES)


ROUTES = [Route("/drills", drills_page)]
