"""The console's Lessons page: the lab guide's lessons, your progress, and each lesson's checks
run against the lab with one button.

It runs `runwatch lesson --json` and `runwatch lesson check N --json` itself (runwatch/lesson.py),
so the console checks exactly what the command line checks, and keeps no copy of a check: the
checks live in docs/lab-guide.md. Each step shows OK or NO, what its check asks (the PromQL, the
pager's incident, the file) and what it found, with a hint to reveal. Progress is the lab's
(lessons.json in its state directory): it only goes up, whichever of the two checked.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

CHECK_TIMEOUT_S = 60  # a lesson's few instant queries and file reads: seconds, even on a busy lab
# A GET of the page lists the lessons through a child process: at most one every few seconds,
# however often a page (any page the learner's browser has open) asks for it.
LIST_KEPT_S = 5.0
_listed: dict[int, tuple[float, dict | None, str]] = {}  # by console: when, what it listed, what it said
_listing = threading.Lock()


def _lesson(console: Any, *args: str) -> tuple[dict | None, str]:
    """`runwatch lesson ARGS --json` against this console's lab: (its JSON, or None and what it said)."""
    state = [f"--state-dir={console.sources.state_dir}"] if console.sources.state_dir is not None else []
    urls = [f"--prometheus={console.sources.prometheus}", f"--pager={console.sources.pager}"]
    argv = [*console.runwatch, "lesson", *args, *state, *urls, "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"runwatch lesson did not finish in {CHECK_TIMEOUT_S} s"
    try:
        return json.loads(proc.stdout), ""
    except ValueError:
        return None, (proc.stdout + proc.stderr).strip() or f"runwatch lesson exited {proc.returncode}"


def _listed_now(console: Any, fresh: bool) -> tuple[dict | None, str]:
    """The lessons and their progress, listed again if `fresh` (after a check) or older than LIST_KEPT_S."""
    with _listing:
        at, found, said = _listed.get(id(console), (0.0, None, ""))
        if fresh or time.monotonic() - at > LIST_KEPT_S:
            found, said = _lesson(console, "list")
            _listed[id(console)] = (time.monotonic(), found, said)
        return found, said


def _page(console: Any, checked: dict | None = None, problem: str = "") -> Response:
    found, said = _listed_now(console, fresh=checked is not None or bool(problem))
    problems = [p for p in (said, problem) if p]
    return console.render("lessons.html", progress=found, checked=checked, problems=problems)


def lessons_page(request: Request) -> Response:
    return _page(request.app.state.console)


async def check(request: Request) -> Response:
    console = request.app.state.console
    form = await request.app.state.form(console, request)
    if isinstance(form, Response):
        return form
    number = form.get("lesson", "")
    if not number.isdigit():
        return _page(console, problem="check: choose a lesson (its Check button says which)")
    checked, said = await run_in_threadpool(_lesson, console, "check", number)
    return await run_in_threadpool(_page, console, checked, said)


ROUTES = [
    Route("/lessons", lessons_page),
    Route("/lessons/check", check, methods=["POST"]),
]
