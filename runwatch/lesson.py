"""`runwatch lesson`: the lab guide's lessons, each step checked against the live lab.

The lessons are the lab guide's exercises (docs/lab-guide.md). Each ends in a block of checks,
written in the guide itself as YAML, so the learner reads what a check asks beside the exercise
and there is no second copy to drift. A check reads the lab's real state and never decides
whether an alert should fire; it asks one of three things:

- `promql: EXPR`: the lab's Prometheus returns at least one series for EXPR now (Prometheus's
  own `ALERTS`, the first-fire record, the trainer's series);
- `pager: paged` or `pager: acknowledged` (with `alert:` and `run:`, a glob, if given): the
  pager holds such an incident, by its `/api/incidents`;
- `file: PATH` (or a list of paths, any one will do), with `contains: TEXT` if given: what a
  command of the exercise wrote;
- `promtool: DIR`: promtool's verdict, `promtool check rules` passes on every DIR/*.yml (a
  learner's edited copy of the rules).

`$RUN` in a check is the lab's run (its lab.json), `$STATE` its state directory, `$TMP` the folder
the guide's commands write to (/tmp; `--tmp-dir`). Progress is kept in the state directory
(lessons.json): a step once done stays done, across restarts. `check N --open` runs only the
steps not yet done (the console's Lessons page polls so, and a step completes itself).

    $ runwatch lesson check 2
    lesson 2 of 7: Exercise 2: match each incident to its signature
      OK  1. a corrupt shard's run paged TrainingLossJump and GradientNormJump
      NO  2. you acknowledged the corrupt shard's TrainingLossJump incident
            checks: the pager has an incident TrainingLossJump of a run corrupt_shard-*, acknowledged
            found:  TrainingLossJump of run corrupt_shard-0-101500 is not acknowledged
            hint:   Ack it in the console with a comment, or `runwatch ack TrainingLossJump --comment "..."`
    1 of 4 steps done

Not for grading a drill: `runwatch diagnose` does that, once.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from runwatch.core.addresses import lab_url
from runwatch.core.command import Command, UsageError, add_state_dir, read_json
from runwatch.core.files import write_atomic
from runwatch.core.paths import Layout
from runwatch.prom.server import PromQLError, instant
from runwatch.prom.tools import binary, run_tool

GUIDE = Path("docs") / "lab-guide.md"  # under the configuration's root: a clone's
KINDS = ("promql", "pager", "file", "promtool")
PAGER_STATES = ("paged", "acknowledged")
STEP_KEYS = {"step", "hint", "alert", "run", "contains", *KINDS}
TIMEOUT_S = 10  # one check's query: the lab answers in milliseconds, a stalled one is reported
FENCE = re.compile(r"^```yaml\n(.*?)^```", re.M | re.S)
HEADING = re.compile(r"^## +(.+)$", re.M)


@dataclass(frozen=True)
class Step:
    """One objective of a lesson, and the check that says whether it is done."""

    text: str
    kind: str  # one of KINDS
    target: str | tuple[str, ...]  # the PromQL, the pager state, or the file(s)
    hint: str
    alert: str = ""
    run: str = "$RUN"
    contains: str = ""


@dataclass(frozen=True)
class Lesson:
    number: int
    title: str  # the guide's heading above its checks
    steps: tuple[Step, ...]


# --- reading the lessons from the guide ---


def guide_path(root: Path | None = None) -> Path:
    path = Layout(root).root / GUIDE
    if not path.is_file():
        raise UsageError(f"{path}: no lab guide here; the lessons are in docs/lab-guide.md of a clone of runwatch")
    return path


def read_lessons(path: Path) -> list[Lesson]:
    """Every lesson of the guide, in order: each ```yaml block with a `lesson:` key, under the
    `## ` heading it follows. A malformed block is a UsageError naming the file and the step."""
    text = path.read_text()
    lessons: list[Lesson] = []
    for block in FENCE.finditer(text):
        try:
            spec = yaml.safe_load(block[1])
        except yaml.YAMLError as err:
            raise UsageError(f"{path}: a yaml block does not parse: {str(err).splitlines()[0]}") from None
        if not isinstance(spec, dict) or "lesson" not in spec:
            continue  # an example, not a lesson's checks
        headings = HEADING.findall(text, 0, block.start())
        title = headings[-1] if headings else "?"
        if spec["lesson"] != len(lessons) + 1:
            expected = len(lessons) + 1
            raise UsageError(f"{path}: lesson {spec['lesson']!r} ({title}) is out of order: expected {expected}")
        steps = spec.get("steps")
        if not isinstance(steps, list) or not steps:
            raise UsageError(f"{path}: lesson {spec['lesson']} has no steps: a list under `steps:`")
        lessons.append(Lesson(spec["lesson"], title, tuple(read_step(path, spec["lesson"], s) for s in steps)))
    if not lessons:
        raise UsageError(f"{path}: no lesson's checks in it (```yaml blocks with `lesson:`)")
    return lessons


def read_step(path: Path, lesson: int, spec: object) -> Step:
    where = f"{path}: lesson {lesson}"
    if not isinstance(spec, dict) or not isinstance(spec.get("step"), str):
        raise UsageError(f"{where}: each step needs `step:`, the objective in words")
    where += f", step {spec['step']!r}"
    unknown = sorted(set(spec) - STEP_KEYS)
    kinds = [k for k in KINDS if k in spec]
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (a step takes {', '.join(sorted(STEP_KEYS))})")
    if len(kinds) != 1:
        raise UsageError(f"{where}: needs exactly one check, one of {', '.join(KINDS)}; has {kinds or 'none'}")
    if not isinstance(spec.get("hint"), str):
        raise UsageError(f"{where}: needs `hint:`, what to do when it is not done")
    target = spec[kinds[0]]
    if kinds[0] == "file" and isinstance(target, list) and target and all(isinstance(t, str) for t in target):
        target = tuple(target)
    elif not isinstance(target, str):
        raise UsageError(f"{where}: `{kinds[0]}:` must be text")
    if kinds[0] == "pager" and target not in PAGER_STATES:
        raise UsageError(f"{where}: `pager:` must be {' or '.join(PAGER_STATES)}, got {target!r}")
    extra = {k: str(spec[k]) for k in ("alert", "run", "contains") if k in spec}
    return Step(spec["step"], kinds[0], target, spec["hint"], **extra)


# --- checking a step against the lab ---


@dataclass(frozen=True)
class Lab:
    """Where a lesson's checks look: the lab's state directory and what `$...` stands for."""

    state: Path
    run: str  # the lab's run, "" with no lab
    tmp: Path
    prometheus: str = ""  # default: the lab's, from its state directory
    pager: str = ""

    def url(self, component: str) -> str:
        given = {"prometheus": self.prometheus, "pager": self.pager}[component]
        return (given or lab_url(self.state, component)).rstrip("/")

    def expand(self, text: str) -> str:
        return text.replace("$RUN", self.run).replace("$STATE", str(self.state)).replace("$TMP", str(self.tmp))


def describe(step: Step, lab: Lab) -> str:
    """What the check asks, in words a learner can read and run themselves."""
    if step.kind == "promql":
        return f"`runwatch query '{lab.expand(step.target)}'` returns a series"
    if step.kind == "promtool":
        return f"`promtool check rules {lab.expand(step.target)}/*.yml` passes"
    if step.kind == "pager":
        alert = f" {step.alert}" if step.alert else ""
        return f"the pager has an incident{alert} of a run {lab.expand(step.run)}, {step.target}"
    paths = [lab.expand(p) for p in ((step.target,) if isinstance(step.target, str) else step.target)]
    contains = f" containing {lab.expand(step.contains)!r}" if step.contains else ""
    return f"{' or '.join(paths)} exists{contains}"


def check(step: Step, lab: Lab) -> tuple[bool, str]:
    """(done, what was found) for one step, from the lab's state."""
    if step.kind == "promql":
        return check_promql(lab.expand(step.target), lab)
    if step.kind == "pager":
        return check_pager(step, lab)
    if step.kind == "promtool":
        return check_promtool(Path(lab.expand(step.target)))
    return check_file(step, lab)


def check_promql(expr: str, lab: Lab) -> tuple[bool, str]:
    prometheus = lab.url("prometheus")
    try:
        found = instant(prometheus, expr, timeout=TIMEOUT_S)
    except PromQLError as err:
        return False, f"Prometheus refused the query: {err}"
    except (requests.RequestException, ValueError):
        return False, f"Prometheus at {prometheus} did not answer: is the lab up? (`runwatch status`)"
    return (True, f"{len(found)} series") if found else (False, "no series yet")


def check_pager(step: Step, lab: Lab) -> tuple[bool, str]:
    pager, run = lab.url("pager"), lab.expand(step.run)
    try:
        resp = requests.get(f"{pager}/api/incidents", timeout=TIMEOUT_S)
        resp.raise_for_status()
        incidents = resp.json()["incidents"]
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return False, f"the pager at {pager} did not answer: is the lab up? (`runwatch status`)"
    alert = step.alert or "any alert"
    mine = [i for i in incidents if fnmatch.fnmatchcase(str(i.get("run_id")), run or "-")]
    mine = [i for i in mine if not step.alert or i.get("alert") == step.alert]
    if not mine:
        return False, f"no incident of {alert} for a run {run or '(no lab running)'} yet"
    if step.target == "acknowledged":
        acked = [i for i in mine if i.get("acked_at")]
        if not acked:
            return False, f"{mine[0].get('alert')} of run {mine[0].get('run_id')} is not acknowledged"
        mine = acked
    return True, f"{mine[0].get('alert')} of run {mine[0].get('run_id')}"


def check_promtool(folder: Path) -> tuple[bool, str]:
    files = sorted(folder.glob("*.yml"))
    if not files:
        return False, f"no rule files (*.yml) in {folder}"
    try:
        res = run_tool([binary("promtool"), "check", "rules", *map(str, files)])
    except UsageError as err:  # no promtool, or one that hung
        return False, str(err)
    if res.returncode == 0:
        return True, f"promtool: SUCCESS for {len(files)} files"
    said = [line.strip() for line in (res.stderr + res.stdout).splitlines() if line.strip() and "SUCCESS" not in line]
    return False, "promtool: " + " | ".join(said[:3])


def check_file(step: Step, lab: Lab) -> tuple[bool, str]:
    paths = [Path(lab.expand(p)) for p in ((step.target,) if isinstance(step.target, str) else step.target)]
    text, missing = lab.expand(step.contains), []
    for path in paths:
        try:
            if text in path.read_text(errors="replace"):
                return True, str(path)
            missing.append(f"{path} does not contain {text!r}")
        except OSError:
            missing.append(f"no {path}")
    return False, "; ".join(missing)


# --- progress, kept in the state directory ---


def progress_path(state: Path) -> Path:
    return state / "lessons.json"


def read_progress(state: Path) -> dict[str, list[int]]:
    """{lesson number: the steps ever done}; a damaged file is one line naming it."""
    path = progress_path(state)
    if not path.exists():
        return {}
    done = read_json(path, "the lessons' progress").get("done", {})
    if not isinstance(done, dict) or not all(isinstance(v, list) for v in done.values()):
        raise UsageError(f"{path}: the lessons' progress is damaged; delete it to start afresh")
    return {str(k): sorted({int(s) for s in v if isinstance(s, int)}) for k, v in done.items()}


def record_progress(state: Path, lesson: int, steps: list[int]) -> list[int]:
    """Add the steps done now to those done before (progress only goes up); the union."""
    done = read_progress(state)
    done[str(lesson)] = sorted(set(done.get(str(lesson), [])) | set(steps))
    if state.is_dir():  # no lab ever started here: nothing to keep progress in
        write_atomic(progress_path(state), json.dumps({"done": done}, indent=1) + "\n")
    return done[str(lesson)]


# --- the command ---


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("action", nargs="?", choices=("list", "check"), default="list",
                   help="list: the lessons and your progress (default); check N: run lesson N's checks")  # fmt: skip
    p.add_argument("number", nargs="?", type=int, default=None, help="the lesson to check")
    add_state_dir(p)
    p.add_argument("--tmp-dir", type=Path, default=Path("/tmp"), help="where the guide's commands write ($TMP: /tmp)")
    p.add_argument("--root", type=Path, default=None, help="the checkout whose docs/lab-guide.md to read")
    p.add_argument("--prometheus", default="", metavar="URL", help="the lab's Prometheus (default: from its state dir)")
    p.add_argument("--pager", default="", metavar="URL", help="the lab's pager (default: from its state dir)")
    p.add_argument("--open", action="store_true",
                   help="check: run only the steps not yet done (those done before stay done, unchecked); "
                        "the console's Lessons page polls this way")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON (the console's Lessons page reads it)")
    return run


def run(args: argparse.Namespace) -> int:
    lessons = read_lessons(guide_path(args.root))
    meta = args.state_dir / "lab.json"
    run_id = str(read_json(meta, "the lab's record").get("run_id") or "") if meta.exists() else ""
    lab = Lab(args.state_dir.absolute(), run_id, args.tmp_dir, args.prometheus, args.pager)
    if args.action == "list":
        if args.number is not None:
            raise UsageError(f"lesson list takes no number (to check one: runwatch lesson check {args.number})")
        if args.open:
            raise UsageError("lesson list takes no --open (it checks nothing: runwatch lesson check N --open)")
        return list_lessons(lessons, lab, args.json)
    if args.number is None:
        raise UsageError(f"lesson check: which lesson? a number from 1 to {len(lessons)}")
    if not 1 <= args.number <= len(lessons):
        raise UsageError(f"lesson check: no lesson {args.number}; the lab guide has lessons 1 to {len(lessons)}")
    return check_lesson(lessons[args.number - 1], lessons, lab, args.json, args.open)


def results(lesson: Lesson, lab: Lab, skip: frozenset[int] = frozenset()) -> list[dict]:
    """Each step of the lesson checked now: its objective, OK or not, what it asks, what it found.
    A step in `skip` (done before) is not checked again: it stays OK, found "done before"."""
    out = []
    for i, step in enumerate(lesson.steps, 1):
        ok, found = (True, "done before") if i in skip else check(step, lab)
        out.append({"step": i, "text": step.text, "ok": ok, "checks": describe(step, lab), "found": found,
                    "hint": step.hint})  # fmt: skip
    return out


def check_lesson(
    lesson: Lesson, lessons: list[Lesson], lab: Lab, as_json: bool = False, only_open: bool = False
) -> int:
    """Check the lesson's steps (only those not yet done, with `only_open`), keep what passed in
    the progress, and print it; 0 once every step passes (or passed before, with `only_open`)."""
    total = len(lessons)
    before = frozenset(read_progress(lab.state).get(str(lesson.number), [])) if only_open else frozenset()
    steps = results(lesson, lab, before)
    done = [s["step"] for s in steps if s["ok"]]
    ever = record_progress(lab.state, lesson.number, done)
    if as_json:
        print(json.dumps({"lesson": lesson.number, "of": total, "title": lesson.title, "steps": steps,
                          "done_ever": ever, "next": progress(lessons, lab)["next"]}), flush=True)  # fmt: skip
        return 0 if len(done) == len(steps) else 1
    print(f"lesson {lesson.number} of {total}: {lesson.title}")
    for s in steps:
        print(f"  {'OK' if s['ok'] else 'NO'}  {s['step']}. {s['text']}")
        if not s["ok"]:
            print(f"        checks: {s['checks']}\n        found:  {s['found']}\n        hint:   {s['hint']}")
    before = f" ({len(ever)} done at some time, kept in {progress_path(lab.state)})" if len(ever) > len(done) else ""
    print(f"{len(done)} of {len(steps)} steps done{before}", flush=True)
    return 0 if len(done) == len(steps) else 1


def progress(lessons: list[Lesson], lab: Lab) -> dict:
    """Every lesson with the steps ever done, each step's check and hint, and the next step to
    do (None once all are)."""
    done = read_progress(lab.state)
    rows = [{"lesson": x.number, "title": x.title, "steps": [s.text for s in x.steps],
             "checks": [describe(s, lab) for s in x.steps], "hints": [s.hint for s in x.steps],
             "done": done.get(str(x.number), [])} for x in lessons]  # fmt: skip
    todo = [(r, i) for r in rows for i in range(1, len(r["steps"]) + 1) if i not in r["done"]]
    upnext = {"lesson": todo[0][0]["lesson"], "step": todo[0][1], "text": todo[0][0]["steps"][todo[0][1] - 1]}
    return {"lessons": rows, "next": upnext if todo else None}


def list_lessons(lessons: list[Lesson], lab: Lab, as_json: bool = False) -> int:
    found = progress(lessons, lab)
    if as_json:
        print(json.dumps(found), flush=True)
        return 0
    for r in found["lessons"]:
        print(f"lesson {r['lesson']} of {len(lessons)}  {len(r['done'])}/{len(r['steps'])} steps  {r['title']}")
    upnext = found["next"]
    if upnext is None:
        print("every lesson done", flush=True)
    else:
        print(f"next: lesson {upnext['lesson']}, step {upnext['step']}: {upnext['text']} "
              f"(runwatch lesson check {upnext['lesson']})", flush=True)  # fmt: skip
    return 0
