"""The on-call console: one page where a learner watches the run, takes the page, reads the
runbook, acks, and (in a drill) diagnoses.

A Starlette app with server-side Jinja templates (autoescaped: page text is whatever a local
process posted to the pager) and one static script that draws the plate with uPlot, served from
this package (the lab works offline). Every form carries a per-process token that a page from
another origin cannot read, and a POST whose Origin is not the console's own is refused.
Before any routing, RequestGuard answers only the console's own addresses as Host (a
DNS-rebinding page names its own) and takes only small urlencoded forms, so nothing is read,
parsed or spooled to disk for a request that is then refused (SECURITY.md).

Acks and diagnoses run `runwatch ack` and `runwatch diagnose` themselves, so the console
silences, records and grades exactly as the command line does.

    >>> app = make_app(Sources("http://127.0.0.1:9090", "http://127.0.0.1:9093", "http://127.0.0.1:9095"))
"""

from __future__ import annotations

import hmac
import itertools
import re
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markdown_it import MarkdownIt
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from runwatch.console import drills, lessons, rules
from runwatch.console.sources import ALERT_NAME, Sources, UnavailableError
from runwatch.core.addresses import host_allowed, served_hosts
from runwatch.core.bounded import BoundedReadError
from runwatch.core.command import UsageError
from runwatch.core.names import LOOPBACK, PORTS
from runwatch.trainer.config import (  # what a diagnosis may name, as runwatch diagnose takes it
    CLUSTER_INCIDENTS,
    INCIDENTS,
    TrainConfig,
)

HERE = Path(__file__).parent
COMMAND_TIMEOUT_S = 120  # a diagnosis draws nothing, but reads Prometheus and the page log
NOTICES_KEPT = 50
# No inline script or style can run: everything the page runs is this package's own file.
CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
POSTMORTEM_FILE = re.compile(r"postmortem-[A-Za-z0-9_.-]+\.(md|png)")
# The largest form the console's own page sends is an ack with its comment: a few hundred bytes.
MAX_FORM_BYTES = 16 << 10
FORM_TYPE = "application/x-www-form-urlencoded"  # the console's forms; never multipart, so never a file part


class Console:
    """The app's state: where it reads, its form token, and the results of recent actions."""

    def __init__(self, sources: Sources, runwatch: list[str] | None = None, pager_token: Path | None = None,
                 alertmanager_password: Path | None = None, lesson_tmp: Path | None = None) -> None:  # fmt: skip
        self.sources = sources
        self.lesson_tmp = lesson_tmp  # where the lab guide's commands write ($TMP of a lesson's checks; None: /tmp)
        self.pager_token = pager_token  # the pager's token file, which an Ack carries (runwatch ack --token-file)
        self.alertmanager_password = alertmanager_password  # compose's: an Ack's silence carries it
        self.runwatch = runwatch or [sys.executable, "-m", "runwatch"]
        self.token = secrets.token_urlsafe(32)
        self.notices: dict[str, str] = {}
        self._ids = itertools.count(1)
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]), trim_blocks=True
        )
        # Runbooks and postmortems are Markdown; raw HTML in them is shown as text, not run.
        self.markdown = MarkdownIt("commonmark", {"html": False}).enable("table")  # runbooks have tables

    # --- rendering ---

    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        text = self.templates.get_template(name).render(token=self.token, **context)
        # A page is whatever a local process posted: a lone surrogate in it (valid JSON, not
        # UTF-8) is shown escaped, as `runwatch pager` prints it, not a 500 hiding every page.
        return HTMLResponse(text.encode("utf-8", "backslashreplace"), status)

    def notice(self, text: str) -> str:
        """Keep an action's result for the page it redirects to; return its id."""
        key = str(next(self._ids))
        self.notices[key] = text
        for old in list(self.notices)[:-NOTICES_KEPT]:
            del self.notices[old]
        return key

    # --- acting through the command line ---

    def command(self, *args: str) -> str:
        """Run `runwatch ARGS` against this console's lab; what it printed (its result or its one-line error)."""
        state = [f"--state-dir={self.sources.state_dir}"] if self.sources.state_dir is not None else []
        argv = [*self.runwatch, args[0], *state, *args[1:]]  # before any "--" that ends the options
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"runwatch {args[0]} did not finish in {COMMAND_TIMEOUT_S} s"
        return (proc.stdout + proc.stderr).strip()


def _same_origin(request: Request) -> bool:
    """A browser names the page a POST comes from; it must be the console's own address."""
    origin = request.headers.get("origin")
    if origin is None:
        return True  # not sent by every browser on a same-origin POST; the token still guards it
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def _form(console: Console, request: Request) -> dict[str, str] | Response:
    """The POSTed form, or the response that refuses it (403 without our token or origin)."""
    form = await request.form(max_files=0, max_fields=16)  # RequestGuard has capped its size already
    token = str(form.get("token", ""))
    if not _same_origin(request) or not hmac.compare_digest(token.encode(), console.token.encode()):
        return PlainTextResponse("403 forbidden: this form was not sent by the console's own page\n", 403)
    fields = {k: str(v) for k, v in form.items()}
    for key, value in fields.items():  # a NUL cannot go into the command line an action runs
        if "\x00" in value or "\x00" in key:
            return PlainTextResponse(f"400 bad request: form field {key[:40]!r} holds a NUL byte\n", 400)
    return fields


def _console(request: Request) -> Console:
    return request.app.state.console


# Endpoints that read other components are plain functions: Starlette runs them in its thread
# pool, so one slow answer (or a diagnosis, run in the pool too) holds up no other request.


def _selected_run(request: Request, runs: list[str]) -> str | None:
    """?run=, else the native lab's run (from its start, before Prometheus holds a sample of
    it), else the newest run Prometheus holds."""
    asked = request.query_params.get("run")
    if asked:
        return asked
    lab = _console(request).sources.lab_run()
    return lab or (runs[0] if runs else None)


def index(request: Request) -> Response:
    console = _console(request)
    sources, problems = console.sources, []
    try:
        runs = sources.runs()
    except UnavailableError as err:
        runs, problems = [], [str(err)]
    runs = sources.runs_lab_first(runs)
    run = _selected_run(request, runs)
    drill = sources.drill()
    in_drill = drill is not None and drill["run_id"] == run
    postmortem = _postmortem_file(sources, run) if in_drill else None
    # a drill of one rank hides no cluster incident: the form offers only what it can be
    cluster = in_drill and int(drill.get("ranks", 1) or 1) > 1
    return console.render(
        "index.html", runs=runs, run=run, problems=problems,
        incidents=INCIDENTS + (CLUSTER_INCIDENTS if cluster else ()), cluster=cluster,
        notice=console.notices.get(request.query_params.get("notice", "")),
        diagnosable=in_drill and drill.get("diagnosis") is None, diagnosed=in_drill and drill.get("diagnosis"),
        postmortem=postmortem.name if postmortem else None, rules=sources.rules_link() if run else "",
        grafana=sources.grafana(run) if run else "", fit=TrainConfig(),
        prometheus=sources.prometheus_link if sources.has_ui() else "",  # Debian's build serves no pages
    )  # fmt: skip


def _api(request: Request, read: Callable[[Sources, str], dict], example: str) -> Response:
    """One run's JSON for console.js: 400 without a run, 503 if Prometheus does not answer, 404
    for a run it does not hold."""
    run = request.query_params.get("run", "")
    if not run:
        return JSONResponse({"error": f"run: which run, e.g. ?run={example}"}, 400)
    try:
        return JSONResponse(read(_console(request).sources, run))
    except UnavailableError as err:
        return JSONResponse({"error": str(err)}, 503)
    except UsageError as err:  # a run Prometheus does not hold: collect() says so
        return JSONResponse({"error": str(err)}, 404)


def plate(request: Request) -> Response:
    run = request.query_params.get("run", "")
    if run and run == _console(request).sources.lab_run():  # the lab's run, maybe not yet scraped
        try:
            return JSONResponse(_console(request).sources.plate(run))
        except UsageError:
            return JSONResponse({"run_id": run, "waiting": True})
        except UnavailableError as err:
            return JSONResponse({"error": str(err)}, 503)
    return _api(request, Sources.plate, "corrupt_shard-0-083113")


def ranks(request: Request) -> Response:
    return _api(request, Sources.ranks, "straggler-0-083113")


def rank_history(request: Request) -> Response:
    return _api(request, Sources.rank_history, "straggler-0-083113")


def pages(request: Request) -> Response:
    """The run's incidents, one entry each, open ones first, oldest first: their pages, state
    changes and ack. An incident not yet acknowledged offers an Ack, whatever its alert does now."""
    console, run = _console(request), request.query_params.get("run", "")
    found, problems = [], []
    try:
        found = console.sources.incidents(run) if run else []
    except UnavailableError as err:
        problems.append(str(err))
    rules = console.sources.rules_link() if found else ""
    return console.render("pages.html", incidents=found, problems=problems, rules=rules)


def runbook(request: Request) -> Response:
    """An alert's runbook. /runbook/X.md too: a runbook links another as `X.md` (as it is named
    in runbooks/, where GitHub follows it), which resolves here beside the one read."""
    console, alert = _console(request), request.path_params["alert"].removesuffix(".md")
    try:
        text = console.sources.runbook(alert)
    except UnavailableError as err:
        return console.render("runbook.html", alert=alert, html=None, problem=str(err))
    html = console.markdown.render(text) if text is not None else None
    return console.render("runbook.html", alert=alert, html=html, problem=None, status=200 if html else 404)


async def ack(request: Request) -> Response:
    console = _console(request)
    form = await _form(console, request)
    if isinstance(form, Response):
        return form
    alert, run = form.get("alert", ""), form.get("run", "")
    if not ALERT_NAME.fullmatch(alert) or not run:
        said = "ack: choose an incident of the run (its Ack button fills it in)"
    else:
        # `--flag=value`: a comment such as "--help" is a value, not an option
        args = ["ack", alert, f"--run={run}", f"--comment={form.get('comment', '')}",
                f"--alertmanager={console.sources.alertmanager}", f"--pager={console.sources.pager}"]  # fmt: skip
        args += [f"--token-file={console.pager_token}"] if console.pager_token else []
        pw = console.alertmanager_password
        args += [f"--alertmanager-password-file={pw}"] if pw else []
        said = await run_in_threadpool(console.command, *args)
    return _back(run, console.notice(said))


async def diagnose(request: Request) -> Response:
    console = _console(request)
    form = await _form(console, request)
    if isinstance(form, Response):
        return form
    incident, step, rank = form.get("incident", ""), form.get("step", "").strip(), form.get("rank", "").strip()
    flags = [*([f"--step={step}"] if step else []), *([f"--rank={rank}"] if rank else [])]
    args = ["diagnose", *flags, "--", incident]  # "--": an incident is never an option
    said = await run_in_threadpool(console.command, *args)
    return _back(form.get("run", ""), console.notice(said))


async def write_postmortem(request: Request) -> Response:
    console = _console(request)
    form = await _form(console, request)
    if isinstance(form, Response):
        return form
    said = await run_in_threadpool(console.command, "postmortem")
    run = form.get("run", "")
    if _postmortem_file(console.sources, run) is not None and said.startswith("wrote "):  # show what was written
        return RedirectResponse("/postmortem/?" + urlencode({"run": run}), status_code=303)
    return _back(run, console.notice(said))


def postmortem(request: Request) -> Response:
    console, run = _console(request), request.query_params.get("run", "")
    found = _postmortem_file(console.sources, run)
    if found is None:
        return PlainTextResponse("404 no postmortem for this run yet: diagnose the drill, then write it\n", 404)
    return console.render("postmortem.html", run=run, html=console.markdown.render(found.read_text()))


def postmortem_image(request: Request) -> Response:
    name, folder = request.path_params["name"], _console(request).sources.state_dir
    if folder is None or not POSTMORTEM_FILE.fullmatch(name) or not _own_file(folder / name):
        return PlainTextResponse("404 not found\n", 404)
    return FileResponse(folder / name)


def _own_file(path: Path) -> bool:
    """A regular file the lab wrote in its state directory: not a symlink to one elsewhere."""
    return not path.is_symlink() and path.is_file()


def ready(_: Request) -> Response:
    return PlainTextResponse("OK\n")


def favicon(_: Request) -> Response:
    """Browsers ask for /favicon.ico whatever the page links: the console's own icon."""
    return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")


ROUTES = [
    Route("/", index),
    Route("/api/plate", plate),
    Route("/api/ranks", ranks),
    Route("/api/rank_history", rank_history),
    Route("/pages", pages),
    Route("/runbook/{alert}", runbook),
    Route("/ack", ack, methods=["POST"]),
    Route("/diagnose", diagnose, methods=["POST"]),
    Route("/postmortem", write_postmortem, methods=["POST"]),
    # at /postmortem/, so the Markdown's relative picture (postmortem-RUN-plate.png) resolves
    Route("/postmortem/", postmortem, methods=["GET"]),
    Route("/postmortem/{name}", postmortem_image),
    Route("/-/ready", ready),
    Route("/favicon.ico", favicon),
    *rules.ROUTES,  # the Rules page and its workbench (console/rules.py)
    *lessons.ROUTES,  # the Lessons page: the lab guide's checks (console/lessons.py)
    *drills.ROUTES,  # the Drills page: the graded drills, their times and par (console/drills.py)
    Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
]


def make_app(sources: Sources, runwatch: list[str] | None = None, hosts: frozenset[str] | None = None,
             pager_token: Path | None = None, alertmanager_password: Path | None = None,
             lesson_tmp: Path | None = None) -> Starlette:  # fmt: skip
    """The console's ASGI app, reading from sources; runwatch: how to run the command line;
    hosts: the Host headers it answers (runwatch.core.addresses.served_hosts; by default the
    loopback names of the documented port); pager_token and alertmanager_password: the pager's
    token file and Alertmanager's password file, for acks (by default, `runwatch ack` takes the
    --state-dir lab's); lesson_tmp: the lessons' $TMP (by default /tmp)."""
    hosts = served_hosts(LOOPBACK, PORTS["console"]) if hosts is None else hosts
    app = Starlette(
        routes=ROUTES, middleware=[Middleware(SecurityHeaders), Middleware(RequestGuard, hosts=hosts)],
        exception_handlers={BoundedReadError: _unreadable},
    )  # fmt: skip
    app.state.console = Console(sources, runwatch, pager_token, alertmanager_password, lesson_tmp)
    app.state.form = _form  # how console/rules.py takes a form: this module's token and origin checks
    return app


async def _unreadable(request: Request, err: Exception) -> Response:
    """A file the console will not read (a rule file linked to /dev/zero, a damaged lab.json):
    one line naming it, and the console serves on (issue 40)."""
    return PlainTextResponse(f"422 {err}\n", 422)


class RequestGuard:
    """ASGI middleware, before routing and before any body is read: refuse a Host that is not
    one of the console's own addresses (421), and a POST from another Origin (403), that is not
    a urlencoded form (415), or whose Content-Length is missing (411) or over MAX_FORM_BYTES (413).

    The form token still guards every action; this makes a refused request cost nothing: a
    DNS-rebinding page never gets the token, and 300 fields of 1 MB or a 200 MB multipart upload
    are refused from their headers, never read or spooled to a temporary file.
    """

    def __init__(self, app: Any, hosts: frozenset[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is not None:
            # the body is left unread: the connection is closed after the answer
            refusal.headers["connection"] = "close"
            return await refusal(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, scope: Any) -> Response | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if scope["path"] == "/-/ready" and scope["method"] in ("GET", "HEAD"):
            return None  # a probe's (a kubelet's Host is the pod's address); it says only "OK"
        if not host_allowed(host, self.hosts):
            served = ", ".join(sorted(self.hosts))
            return PlainTextResponse(f"421 misdirected: this console answers only as {served}, not {host!r}\n", 421)
        if scope["method"] in ("GET", "HEAD"):
            return None
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc.lower() != host.strip().lower():
            return PlainTextResponse("403 forbidden: a POST from another page's origin\n", 403)
        if headers.get("content-type", "").split(";")[0].strip().lower() != FORM_TYPE:
            return PlainTextResponse(f"415 unsupported: the console takes only {FORM_TYPE} forms\n", 415)
        length = headers.get("content-length", "")
        if "transfer-encoding" in headers or not length.isascii() or not length.isdigit():
            return PlainTextResponse("411 length required: a form with its Content-Length\n", 411)
        if int(length) > MAX_FORM_BYTES:
            return PlainTextResponse(f"413 too large: a form is at most {MAX_FORM_BYTES} bytes, not {length}\n", 413)
        return None


class SecurityHeaders:
    """ASGI middleware: every response forbids inline scripts, framing and content sniffing."""

    HEADERS = [
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
    ]

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


def _back(run: str, notice: str) -> RedirectResponse:
    """After an action, back to the run's page with its result (POST, redirect, GET)."""
    return RedirectResponse("/?" + urlencode({"run": run, "notice": notice}), status_code=303)


def _postmortem_file(sources: Sources, run: str | None) -> Path | None:
    if sources.state_dir is None or not run:
        return None
    name = f"postmortem-{run}.md"  # the whole name, not the last part of a path: no "/" can escape
    path = sources.state_dir / name
    return path if POSTMORTEM_FILE.fullmatch(name) and _own_file(path) else None
