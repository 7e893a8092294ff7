"""Write every alert's runbook link and step lookup from one pattern, in place, keeping every comment.

    python prometheus/make_annotations.py                 # rewrite prometheus/rules/*.yml
    python prometheus/make_annotations.py --check         # exit 1, naming each line that drifted
    python prometheus/make_annotations.py --base-url http://pager.runwatch.svc:9095/runbooks --out DIR

kubernetes-mixin's add-runbook-links.libsonnet applies one `runbookURLPattern` to every alert;
this is that, for YAML rule files a learner edits by hand. Only three kinds of line are written:
`runbook_url:` (added under `annotations:` when an alert has none), `step:`, and the step
lookup inside a description ("At step {{ ... }}"). Prometheus expands each annotation on its
own, so a description cannot refer to the `step` annotation: the lookup is written into both,
from step_of(). Line by line, not through a YAML round trip, which would drop the comments that say
why each number is what it is. Idempotent: a second run changes nothing.

A lookup is written over lines of at most WIDTH characters, broken where YAML folds a line break
back into the one space it replaced (a `>-` description's lines, a single-quoted `step:`'s):
the annotation Prometheus reads is one line, as if written on one.

Do not use it to change what an alert does: it never touches an expression.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

RULES = Path(__file__).with_name("rules")
# The pager serves the runbooks (runwatch/core/names.py's RUNBOOK_BASE); a Kubernetes chart renders
# the rules with the pager's in-cluster address instead (--base-url).
BASE_URL = "http://127.0.0.1:9095/runbooks"
RUNBOOK_URL_PATTERN = "{base}/{alertname}.md"


def step_lookup(*selectors: str, alert: str = "") -> str:
    """The template that asks Prometheus for a run's step as a whole number: the first of the
    selectors that has a value, each formatted with the alert's run_id (and, where it takes a
    second %q, with the alert's name)."""
    args = " ".join("$labels.run_id" + (f' "{alert}"' if s.count("%q") == 2 else "") for s in selectors)
    query = f'{{{{ with printf "{" or on() ".join(selectors)}" {args} | query }}}}'
    return query + '{{ . | first | value | printf "%.0f" }}{{ end }}'


# The step an alert's firing episode began at: its episode record (alerts.yml's for the model
# alerts, cluster.yml's for the cluster's), carried while the alert fires and gone once it
# resolves, so that a repeat page or a later episode quotes its own step, never the first
# episode's. The record is written last in its group, so at the evaluation an episode begins
# it does not hold it yet: then the run's step now, which is what the record reads at that same
# evaluation. A stalled cluster run serves no training step while its ranks wait, so the ranks'
# furthest step comes next. (A template's $labels holds no alertname: the alert's name is
# written into its lookup.)
EPISODE_FIRED = (
    "run_alert:runwatch_train_step:episode_fired{run_id=%q,alertname=%q}",
    "run_alert:runwatch_rank_step:episode_fired{run_id=%q,alertname=%q}",
)
# The cluster's run-wide alerts read the ranks' furthest step from its per-run record
# (cluster.yml's run:runwatch_rank_step:max), not from every rank's series: Prometheus expands a
# pending alert's annotations at each evaluation, and with many ranks down at once that read of
# every rank for every alert stalled the group (issue 41). StragglerRank and the GPU alerts keep
# the raw read: the record is a scrape late for them at a 5 s scrape (cluster_5s.test.yml).
RUN_MAX = "run:runwatch_rank_step:max{run_id=%q}"
NOW = {"": ("max(runwatch_train_step{run_id=%q})", "max(runwatch_rank_step{run_id=%q})"),
       "TrainingStalled": (RUN_MAX,),
       "RankDown": ("max(runwatch_train_step{run_id=%q})", RUN_MAX),
       "JobRestarted": ("max(runwatch_train_step{run_id=%q})", RUN_MAX)}  # fmt: skip


def step_of(alert: str) -> str:
    """The step lookup of one alert: its episode record, else the run's step now."""
    return step_lookup(*EPISODE_FIRED, *NOW.get(alert, NOW[""]), alert=alert)


_ALERT = re.compile(r"^\s*- alert:\s*(?P<name>\S+)\s*$")
_OTHER_RULE = re.compile(r"^\s*- (?:record|name):")
_ANNOTATIONS = re.compile(r"^(?P<indent>\s*)annotations:\s*$")
_RUNBOOK = re.compile(r"^(?P<indent>\s*)runbook_url:.*$")
_STEP = re.compile(r"^(?P<indent>\s*)step:.*$")
# "At step " and the lookup after it, up to the first {{ end }}: a description's step
_DESCRIBED_STEP = re.compile(r"(?P<lead>At step )\{\{-?\s*with\b.*?\{\{-?\s*end\s*-?\}\}")
_LOOKUP_START = re.compile(r"At step \{\{-?\s*with\b")
_END = re.compile(r"\{\{-?\s*end\s*-?\}\}")
WIDTH = 120  # a rule file's lines, as a learner reads them (issue 39)
# Where a written lookup may break: before each `or on()`, each argument and the `| query`, and
# after the lookup's `{{ end }}`; nowhere else, so that each piece reads whole.
_BREAK = re.compile(r"(?<=\S) (?=or on\(\) |\$labels\.run_id|\| query }})|(?<=\{\{ end }}) (?=\S)")


def _wrapped(line: str, indent: str) -> str:
    """line over lines of at most WIDTH characters where it can break (_BREAK), the later ones
    at `indent` (which YAML folds away); a piece longer than that stays whole."""
    pieces = _BREAK.split(line)
    out = [pieces[0]]
    for piece in pieces[1:]:
        if len(out[-1]) + 1 + len(piece) <= WIDTH:
            out[-1] += " " + piece
        else:
            out.append(indent + piece)
    return "\n".join(out)


def _unfolded(lines: list[str]) -> list[str]:
    """The lines with each written lookup joined back into one (as _wrapped broke it), so that
    a rule file is read the same however its lookups were wrapped."""
    out: list[str] = []
    joining = None  # what ends the lookup being joined: a step's closing quote, or `{{ end }}`
    for line in lines:
        body = line.rstrip("\n")
        if joining is not None:
            out[-1] = out[-1].rstrip("\n") + " " + body.strip() + line[len(body) :]
            if joining(body):
                joining = None
            continue
        out.append(line)
        if _STEP.match(body) and body.count("'") == 1:
            joining = lambda b: b.rstrip().endswith("'")  # noqa: E731
        elif (m := _LOOKUP_START.search(body)) and not _END.search(body, m.end()):
            joining = lambda b: _END.search(b) is not None  # noqa: E731
    return out


class AnnotationError(ValueError):
    """A rule file this cannot rewrite; the message names the file, line and alert."""


def render(text: str, base_url: str = BASE_URL, where: str = "rules") -> str:
    """text with every alert's runbook_url, step and described step written from the patterns."""
    lines = _unfolded(text.splitlines(keepends=True))
    out: list[str] = []
    alert: str | None = None
    has_runbook: dict[str, bool] = {}
    annotations_at: dict[str, tuple[int, str]] = {}  # alert -> (index in out, indent of its annotations)
    for number, line in enumerate(lines, 1):
        body = line.rstrip("\n")
        newline = line[len(body) :]
        if m := _ALERT.match(body):
            alert = m["name"]
            if alert in has_runbook:
                raise AnnotationError(f"{where}: line {number}: alert {alert} is defined twice in one file")
            has_runbook[alert] = False
        elif _OTHER_RULE.match(body):
            alert = None
        elif alert is not None:
            step = step_of(alert)
            if m := _ANNOTATIONS.match(body):
                annotations_at[alert] = (len(out), m["indent"])
            elif m := _RUNBOOK.match(body):
                has_runbook[alert] = True
                body = f"{m['indent']}runbook_url: {RUNBOOK_URL_PATTERN.format(base=base_url, alertname=alert)}"
            elif m := _STEP.match(body):
                body = _wrapped(f"{m['indent']}step: '{step}'", m["indent"] + "  ")
            elif _DESCRIBED_STEP.search(body):
                indent = body[: len(body) - len(body.lstrip())]
                body = _wrapped(_DESCRIBED_STEP.sub(lambda d, s=step: d["lead"] + s, body), indent)
        out.append(body + newline)
    # an alert without a link gets one, first under its annotations (the inserts go from the end,
    # so the earlier indices stay right)
    missing = [a for a, found in has_runbook.items() if not found]
    for name in sorted(missing, key=lambda a: -annotations_at.get(a, (0, ""))[0]):
        if name not in annotations_at:
            raise AnnotationError(f"{where}: alert {name} has no `annotations:` to put its runbook_url under")
        at, indent = annotations_at[name]
        out.insert(at + 1, f"{indent}  runbook_url: {RUNBOOK_URL_PATTERN.format(base=base_url, alertname=name)}\n")
    return "".join(out)


def drift(before: str, after: str, where: str) -> list[str]:
    """One line per stretch of lines that render() would change: the file, the first line's
    number and what it says (or where a line it would add, a runbook_url, is missing)."""
    a, b = before.splitlines(), after.splitlines()
    found = []
    for tag, i1, _, j1, _ in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "insert":
            found.append(f"{where}: line {i1 + 1}: a line is missing before it: {b[j1].strip()[:60]}")
        elif tag != "equal":
            found.append(f"{where}: line {i1 + 1}: {a[i1].strip()[:80]}")
    return found


def rule_files(rules: Path) -> list[Path]:
    files = sorted(rules.glob("*.yml"))
    if not files:
        raise AnnotationError(f"--rules: no .yml rule files in {rules}")
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make_annotations.py", description=__doc__.splitlines()[0])
    p.add_argument("--rules", type=Path, default=RULES, help="the rule files' directory (default prometheus/rules)")
    p.add_argument("--base-url", default=BASE_URL, help=f"where the runbooks are served (default {BASE_URL})")
    p.add_argument("--out", type=Path, default=None, help="write the rendered files here (default: in place)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file differs from the pattern")
    args = p.parse_args(argv)
    if not re.fullmatch(r"https?://\S+", args.base_url):
        print(f"make_annotations.py: --base-url: expected http(s)://host/path, got {args.base_url!r}", file=sys.stderr)
        return 2
    base_url = args.base_url.rstrip("/")
    try:
        files = rule_files(args.rules)
        rendered = {f: render(f.read_text(), base_url, str(f)) for f in files}
    except (AnnotationError, OSError, UnicodeDecodeError) as err:
        print(f"make_annotations.py: {err}", file=sys.stderr)
        return 2
    if args.check:
        found = [d for f, text in rendered.items() for d in drift(f.read_text(), text, str(f))]
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("make_annotations.py: run `python prometheus/make_annotations.py` to write them", file=sys.stderr)
        return 1 if found else 0
    out = args.out or args.rules
    out.mkdir(parents=True, exist_ok=True)
    for f, text in rendered.items():
        target = out / f.name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
