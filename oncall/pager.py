"""Print the page log one line per page, like ``tail -f``, and the two command lines of the pager.

Do not parse this output in tools; read the log with ``runwatch.oncall.page_log.read_pages`` instead.

    >>> follow(Path(".runwatch/pages.jsonl"), follow=False)
    12:00:05  FIRING    TrainingLossJump      run=corrupt_shard-3  step=300  Loss jumped  runbook: http://127.0...
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlencode, urlsplit
from urllib.request import urlopen

from runwatch.core.command import Parser, UsageError, read_json
from runwatch.core.names import RUNBOOK_BASE, url
from runwatch.oncall.incidents import time_to_ack
from runwatch.oncall.page_log import DEFAULT_LOG, read_incidents, read_pages
from runwatch.oncall.records import is_page, received_time, rfc3339_ms

PROMETHEUS = url("prometheus")  # the lab's, natively and through compose's published port
# Alertmanager's group_wait (up to 5 s) and a few retries: a page later than this is lost, or late.
UNPAGED_AFTER_S = 60.0
UNPAGED_EVERY_S = 10.0


def runbook_path(page: dict[str, Any]) -> str:
    """Return the runbook link to print for a page, as a URL that opens: its runbook_url when that
    is http(s), else the pager's copy of the runbook it names, else of the alert's own."""
    url = page.get("runbook_url") or ""
    if urlsplit(url).scheme in ("http", "https"):
        return url
    name = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    return f"{RUNBOOK_BASE}/{name if name.endswith('.md') else (page.get('alert') or 'unknown') + '.md'}"


def printable(value: object) -> str:
    """The text with every character a terminal would act on escaped, as Python writes it:
    control characters (ESC, BEL, CR, newline), format characters (bidi overrides) and lone
    surrogates. Anything local can post a page, so a page's text must not move the cursor,
    retitle the terminal, forge a second line, or fail to encode.

    >>> printable("run\\x1b[2J\\nFIRING")
    'run\\\\x1b[2J\\\\nFIRING'
    """
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(value))


def format_page(page: dict[str, Any]) -> str:
    """Render one page as one fixed-format line (time is UTC, from received_at); empty fields show as "-".

    Do not parse the line back; the page log is the record.

    >>> format_page({"received_at": "2024-05-01T12:00:05.000Z", "status": "firing", "alert": "TrainingLossJump",
    ...              "run_id": "corrupt_shard-3", "step": "300", "summary": "Loss jumped"})[:71]
    '12:00:05  FIRING    TrainingLossJump      run=corrupt_shard-3  step=300'
    """
    clock = printable(str(page.get("received_at", ""))[11:19]) or "--:--:--"
    if not is_page(page):  # an ack: who took the incident, and what they said
        return "  ".join([
            clock, "ACKED".ljust(8), printable(page.get("alert", "")).ljust(20),
            f"run={printable(page.get('run_id') or '-')}",
            f"by {printable(page.get('by') or '-')}: {printable(' '.join(str(page.get('comment', '')).split()))}",
        ])  # fmt: skip
    summary = printable(" ".join(str(page.get("summary", "")).split()))  # one line, whatever the template made
    fields = [
        clock,
        printable(page.get("status", "")).upper().ljust(8),
        printable(page.get("alert", "")).ljust(20),
        f"run={printable(page.get('run_id') or '-')}",
        f"step={printable(page.get('step') or '-')}",
        *([summary] if summary else []),
        *(
            [f"measured {value:.3g} at resolution"]
            if isinstance(value := page.get("value_at_resolution"), float)
            else []
        ),
        f"runbook: {printable(runbook_path(page))}",
        *([f"rule: {printable(rule)}"] if (rule := rule_text(page)) else []),
    ]
    return "  ".join(fields)


def format_incident(incident: dict[str, Any]) -> str:
    """One incident as one line: its state, alert, run, first page, pages, and its ack.

    >>> format_incident({"state": "triggered", "alert": "HeldOutGap", "run_id": "r", "first_page":
    ...                  "2024-05-01T12:00:05.000Z", "pages": [{}], "firing": False, "acked_at": ""})
    'TRIGGERED     HeldOutGap            run=r  first page 12:00:05  1 page(s), its alert resolved  unacknowledged'
    """
    ack = "unacknowledged"
    if incident.get("acked_at"):
        ack = (
            f"acked {incident['acked_at'][11:19]} by {incident.get('acked_by') or '-'} "
            f"({time_to_ack(incident)} s after the first page): {' '.join(str(incident.get('comment')).split())}"
        )
    now = "its alert fires" if incident.get("firing") else "its alert resolved"
    return printable("  ".join([
        str(incident.get("state", "")).upper().ljust(12), str(incident.get("alert", "")).ljust(20),
        f"run={incident.get('run_id') or '-'}", f"first page {str(incident.get('first_page', ''))[11:19]}",
        f"{len(incident.get('pages', []))} page(s), {now}", ack,
    ]))  # fmt: skip


def rule_text(page: dict[str, Any]) -> str:
    """The rule in force when the page came, as the pager stored it: "EXPR for 10s", then each
    threshold rule it reads, "; NAME{LABELS} = EXPRESSION" ("" if unknown).

    >>> rule_text({"rule": {"expr": "x > 2", "for": "10s"}}), rule_text({"rule": {"expr": "x > 3", "for": "0s"}})
    ('x > 2 for 10s', 'x > 3')
    >>> rule_text({"rule": {"expr": "x > scalar(t)", "for": "0s", "thresholds": {'t{alertname="A"}': "vector(4)"}}})
    'x > scalar(t); t{alertname="A"} = vector(4)'
    """
    rule = page.get("rule")
    if not isinstance(rule, dict) or not rule.get("expr"):
        return ""
    expr, hold = " ".join(str(rule["expr"]).split()), str(rule.get("for", ""))
    text = expr if hold in ("", "0s") else f"{expr} for {hold}"
    thresholds = rule.get("thresholds")
    if isinstance(thresholds, dict):
        text += "".join(f"; {name} = {' '.join(str(e).split())}" for name, e in thresholds.items())
    return text


def _page(line: bytes) -> dict[str, Any] | None:
    try:
        page = json.loads(line)
    except (ValueError, RecursionError):  # nested 200k deep: one line skipped, not a traceback (issue 40, P1)
        return None  # a torn line left by a crash; the pager skips it too
    return page if isinstance(page, dict) else None


def _received(page: dict[str, Any]) -> float:
    received = received_time(page)
    return float("inf") if received is None else received  # an unreadable time is shown, never hidden


def _lab_record(log_path: Path) -> dict:
    """The lab.json beside this log (the lab's state directory holds both), or {}."""
    try:  # bounded: a FIFO or a nested lab.json is no record (issue 40)
        return read_json(Path(log_path).parent / "lab.json", "the lab's record")
    except UsageError:
        return {}


def lab_started(log_path: Path) -> float | None:
    """When the lab whose state directory holds this log was started (its lab.json), if known."""
    started = _lab_record(log_path).get("started_at")
    return float(started) if isinstance(started, int | float) else None


def lab_prometheus(log_path: Path) -> str:
    """The Prometheus of the lab whose state directory holds this log (its lab.json records where
    `runwatch up` started it), else the documented one."""
    urls = _lab_record(log_path).get("urls")
    found = urls.get("prometheus") if isinstance(urls, dict) else None
    return found if isinstance(found, str) else PROMETHEUS


class Unpaged:
    """Alerts Prometheus fired that never became a page: the trace of a page lost while the
    pager was down (Alertmanager gives up on a notification, and an alert that resolved in the
    meantime is never sent again).

    Prometheus's ALERTS series is its own record of what fired; this compares it with the page
    log, it does not decide what should fire. Only an (alert, run) with no firing page at all
    counts, and only UNPAGED_AFTER_S after it first fired, so a page still on its way (group_wait,
    retries) or a re-fire held back by an ack's silence is not reported.

    One of the two alerts decided outside PromQL, on purpose (the other is the pager's
    WatchdogSilent, oncall/watchdog.py): it compares what Prometheus fired with what reached
    the pager, which no rule can see, because a lost page is lost after Prometheus.
    """

    QUERY = 'min_over_time(timestamp(ALERTS{alertstate="firing",severity=~"page|critical|warning"})[1h:1s])'

    def __init__(self, log_path: Path, prometheus: str, clock: Callable[[], float] = time.time) -> None:
        self.log_path, self.prometheus, self.clock = log_path, prometheus.rstrip("/"), clock
        self.reported: set[tuple[str, str]] = set()
        self.unreachable_said = False

    def fired(self) -> list[tuple[str, str, float]] | None:
        """(alert, run_id, first fired) for each alert that fired in the last hour; None if
        Prometheus cannot be asked."""
        url = f"{self.prometheus}/api/v1/query?" + urlencode({"query": self.QUERY, "time": self.clock()})
        try:
            with urlopen(url, timeout=5) as resp:  # noqa: S310 (the lab's own Prometheus URL)
                result = json.load(resp)["data"]["result"]
        except (OSError, ValueError, KeyError):
            return None
        return [(r["metric"].get("alertname", ""), r["metric"].get("run_id", ""), float(r["value"][1])) for r in result]

    def check(self, out: TextIO, err: TextIO) -> None:
        """Print a line for each alert newly found unpaged (or, once, that Prometheus cannot be asked)."""
        fired = self.fired()
        if fired is None:
            if not self.unreachable_said:
                why = "pages lost while the pager was down would not show here (--prometheus)"
                print(f"runwatch pager: cannot ask Prometheus at {self.prometheus} which alerts fired; {why}", file=err)
                self.unreachable_said = True
            return
        paged = {
            (str(p.get("alert", "")), str(p.get("run_id", "")))
            for p in read_pages(self.log_path)
            if p.get("status") == "firing"
        }
        now = self.clock()
        for alert, run_id, first in sorted(fired, key=lambda f: f[2]):
            key = (alert, run_id)
            if key in paged or key in self.reported or now - first < UNPAGED_AFTER_S:
                continue
            self.reported.add(key)
            at = rfc3339_ms(first)[11:19]
            print(f"{rfc3339_ms(now)[11:19]}  UNPAGED   {printable(alert).ljust(20)}  run={printable(run_id or '-')}  "
                  f"fired in Prometheus at {at} but no page reached the pager: lost while it was down, "
                  "or held back by a silence or an inhibition", file=out, flush=True)  # fmt: skip


def follow(
    log_path: Path,
    out: TextIO | None = None,
    follow: bool = True,
    poll: float = 0.2,
    stop: threading.Event | None = None,
    unpaged: Unpaged | None = None,
    since: float | None = None,
) -> None:
    """Print every page in the log, then (if ``follow``) each page appended later, until ``stop`` is set.

    A log that does not exist yet is waited for. A last line without its newline is still being
    written, so it is printed only once the newline arrives. ``out`` defaults to sys.stdout.
    With ``unpaged``, alerts that fired but never paged are printed too, checked every 10 s.
    With ``since`` (a Unix time), pages received before it are hidden, and counted once.
    Do not use this to count pages; use read_pages().
    """
    out = sys.stdout if out is None else out
    stop = threading.Event() if stop is None else stop
    offset, pending, next_check, hidden = 0, b"", 0.0, 0
    while True:
        try:
            with open(log_path, "rb") as f:
                if f.seek(0, 2) < offset:  # the log was truncated or replaced: start over
                    offset, pending = 0, b""
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        *lines, pending = (pending + data).split(b"\n")
        for page in filter(None, map(_page, lines)):
            if since is not None and _received(page) < since:
                hidden += 1
                continue
            print(format_page(page), file=out, flush=True)
        if hidden and next_check == 0.0:  # said once, after the first reading
            print(f"runwatch pager: {hidden} earlier page(s), from before this lab started, are hidden (--all)",
                  file=sys.stderr, flush=True)  # fmt: skip
        if time.monotonic() >= next_check:
            if unpaged is not None:
                unpaged.check(out, sys.stderr)
            next_check = time.monotonic() + UNPAGED_EVERY_S
        if not follow or stop.wait(poll):
            return


def _incidents_since(log_path: Path, since: float | None) -> list[dict[str, Any]]:
    return [
        i for i in read_incidents(log_path)
        if since is None or (received_time({"received_at": i["first_page"]}) or float("inf")) >= since
    ]  # fmt: skip


def print_incidents(log_path: Path, since: float | None = None) -> None:
    """`runwatch pager --incidents`: one line per incident, open ones first, oldest first."""
    for incident in _incidents_since(log_path, since):
        print(format_incident(incident), flush=True)


def say_unacknowledged(log_path: Path, since: float | None = None) -> None:
    """After the pages, on stderr: the incidents still waiting for an ack, if any."""
    waiting = [i for i in _incidents_since(log_path, since) if i["state"] == "triggered"]
    if waiting:
        names = ", ".join(f"{i['alert']} (run {i['run_id'] or '-'})" for i in waiting)
        hint = "`runwatch ack ALERT --comment ...`, or see `runwatch pager --incidents`"
        print(printable(f"runwatch pager: {len(waiting)} incident(s) unacknowledged: {names}; {hint}"), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``runwatch pager [--log PATH] [--follow]``: print the page log, and keep printing with --follow."""
    parser = Parser(prog="runwatch pager", description="Print the on-call page log, one line per page.")
    parser.add_argument("--log", type=Path, default=DEFAULT_LOG, help=f"page log to read (default {DEFAULT_LOG})")
    parser.add_argument("--follow", action="store_true", help="keep printing pages as they arrive, like tail -f")
    parser.add_argument("--all", action="store_true", help="also the pages of earlier labs in this state directory")
    parser.add_argument("--incidents", action="store_true", help="print the incidents (open ones first), not the pages")
    parser.add_argument(
        "--prometheus", default=None, metavar="URL",
        help=f"ask it which alerts fired but never paged (default: the log's lab's, else {PROMETHEUS}; '' not to ask)",
    )  # fmt: skip
    args = parser.parse_or_status(argv)
    if isinstance(args, int):
        return args
    if args.log.is_dir():
        print(f"{parser.prog}: --log: {args.log} is a directory, not a page log", file=sys.stderr)
        return 2
    if not args.follow and not args.log.exists():
        if lab_started(args.log) is not None:  # a lab whose pager has not paged yet
            print(f"{parser.prog}: no page yet: the lab's pager writes {args.log} at its first page", file=sys.stderr)
            return 0
        print(f"{parser.prog}: no page log at {args.log}: start a lab with `runwatch up` (its log is "
              "STATE_DIR/pages.jsonl), or pass --log", file=sys.stderr)  # fmt: skip
        return 1
    since = None if args.all else lab_started(args.log)
    if args.follow:  # say it is listening, or a quiet terminal looks like a hung one
        print(f"{parser.prog}: following {args.log} from {rfc3339_ms(time.time())[11:19]} UTC; "
              "pages print as they arrive (Ctrl-C stops)", file=sys.stderr, flush=True)  # fmt: skip
    # A terminal that cannot show a character gets its escape, never a UnicodeEncodeError.
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how --follow ends
            prometheus = lab_prometheus(args.log) if args.prometheus is None else args.prometheus
            unpaged = Unpaged(args.log, prometheus) if prometheus else None
            if args.incidents:
                print_incidents(args.log, since)
                return 0
            follow(args.log, follow=args.follow, unpaged=unpaged, since=since)
            if not args.follow:
                say_unacknowledged(args.log, since)
    except OSError as e:
        print(f"{parser.prog}: --log: cannot read {args.log}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0
