"""The console's Lessons page: the lab guide's lessons, your progress, and the current lesson's
steps, which complete themselves as the learner does the work.

It runs `runwatch lesson --json` and `runwatch lesson check N [--open] --json` itself
(runwatch/lesson.py), so the console checks exactly what the command line checks, and keeps no
copy of a check: the checks live in docs/lab-guide.md. Each step shows OK or NO, what its check
asks (the PromQL, the pager's incident, the file) and what it found, with a hint to reveal.

The page's script (static/lessons.js) polls POST /lessons/poll every POLL_S, one request at a
time, while the lesson it shows has open steps: each poll checks only those (`--open`), so a
step turns OK without a click on Check once its check passes. Here, one poll runs at a time per
console, whatever number of tabs asks: a poll that finds one running is answered `busy`.
Progress is the lab's (lessons.json in its state directory): it only goes up, whichever checked.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

CHECK_TIMEOUT_S = 60  # a lesson's few instant queries and file reads: seconds, even on a busy lab
# A GET of the page lists the lessons through a child process: at most one every few seconds,
# however often a page (any page the learner's browser has open) asks for it.
LIST_KEPT_S = 5.0
_listed: dict[int, tuple[float, dict | None, str]] = {}  # by console: when, what it listed, what it said
_listing = threading.Lock()
POLL_S = 3  # the page's poll of the current lesson's open steps: after each answer, this long
_polling: dict[int, threading.Lock] = {}  # by console: the one poll it runs at a time


def _lesson(console: Any, *args: str) -> tuple[dict | None, str]:
    """`runwatch lesson ARGS --json` against this console's lab: (its JSON, or None and what it said)."""
    state = [f"--state-dir={console.sources.state_dir}"] if console.sources.state_dir is not None else []
    urls = [f"--prometheus={console.sources.prometheus}", f"--pager={console.sources.pager}"]
    tmp = [f"--tmp-dir={console.lesson_tmp}"] if console.lesson_tmp is not None else []
    argv = [*console.runwatch, "lesson", *args, *state, *urls, *tmp, "--json"]
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


def _page(console: Any, checked: dict | None = None, problem: str = "", asked: str = "") -> Response:
    found, said = _listed_now(console, fresh=checked is not None or bool(problem))
    problems = [p for p in (said, problem) if p]
    current = None
    if found:  # the lesson shown: the one checked, else ?lesson=N, else the next to do (else the last)
        rows = found["lessons"]
        number = checked["lesson"] if checked else int(asked) if asked.isdigit() else 0
        if not 1 <= number <= len(rows):
            number = found["next"]["lesson"] if found["next"] else len(rows)
        current = rows[number - 1]
    return console.render("lessons.html", progress=found, checked=checked, current=current, problems=problems,
                          poll_ms=int(POLL_S * 1000))  # fmt: skip


def lessons_page(request: Request) -> Response:
    return _page(request.app.state.console, asked=request.query_params.get("lesson", ""))


async def _asked(request: Request) -> tuple[Any, str] | Response:
    """The console and the lesson number a form asks for ("" if it names none), or the form's refusal."""
    console = request.app.state.console
    form = await request.app.state.form(console, request)
    if isinstance(form, Response):
        return form
    number = form.get("lesson", "")
    return console, number if number.isdigit() else ""


async def check(request: Request) -> Response:
    asked = await _asked(request)
    if isinstance(asked, Response):
        return asked
    console, number = asked
    if not number:
        return _page(console, problem="check: choose a lesson (its Check button says which)")
    checked, said = await run_in_threadpool(_lesson, console, "check", number)
    return await run_in_threadpool(_page, console, checked, said)


def _poll_once(console: Any, number: str) -> tuple[dict | None, str]:
    """`runwatch lesson check N --open`, unless this console runs one already: then (None, "busy")."""
    lock = _polling.setdefault(id(console), threading.Lock())
    if not lock.acquire(blocking=False):
        return None, "busy"
    try:
        return _lesson(console, "check", number, "--open")
    finally:
        lock.release()


async def poll(request: Request) -> Response:
    """The current lesson's open steps checked now, as JSON for static/lessons.js."""
    asked = await _asked(request)
    if isinstance(asked, Response):
        return asked
    console, number = asked
    if not number:
        return JSONResponse({"error": "lesson: which lesson, e.g. lesson=1"}, 400)
    checked, said = await run_in_threadpool(_poll_once, console, number)
    if checked is None:
        return JSONResponse({"busy": True} if said == "busy" else {"error": said}, 200 if said == "busy" else 503)
    return JSONResponse(checked)


ROUTES = [
    Route("/lessons", lessons_page),
    Route("/lessons/check", check, methods=["POST"]),
    Route("/lessons/poll", poll, methods=["POST"]),
]
