"""On-call practice: `runwatch drill | ack | diagnose | postmortem`, one learner at a keyboard.

A drill is Google's "Wheel of Misfortune" with the game master replaced by a sealed file:

    runwatch drill --fast-forward 200      # a native lab whose trainer runs a hidden incident (or none)
    runwatch pager --follow                # pages arrive; each names its runbook
    runwatch ack HeldOutGap --comment "looking: train loss far below held-out"
    runwatch diagnose repeated_batch --step 300
    runwatch postmortem                    # .runwatch/postmortem-<run>.md, with the timeline and the plate

The incident and its onset (random in 240-360) are sealed in the run's directory; nothing on
/metrics, the dashboards or the pages names them. An ack is what on-call tools built on
Alertmanager do: a silence scoped to that alert and run, with an expiry and the comment.
Everything the drill records lives in the lab's state directory: drill.json for this drill,
scoreboard.jsonl across drills.
"""

from __future__ import annotations

import argparse
import shlex

from runwatch.core.command import Command, UsageError, add_state_dir, number, read_json, state_flag
from runwatch.drill.record import Drill, now
from runwatch.lab.start import add_ports, up
from runwatch.trainer.config import DIFFICULTIES, MAX_RANKS, SEED, STEP, onset_range


def drill(args: argparse.Namespace) -> int:
    d = Drill(args.state_dir)
    if d.path.exists() and read_json(d.path, "the drill's record").get("diagnosis") is None:
        running = [n for n, r in d.lab.records().items() if d.lab.alive(r)]
        if running:
            raise UsageError(f"a drill is already running in {d.lab.state}: `runwatch diagnose` it, or `runwatch down`")
    first, last = onset_range(args.difficulty)
    if args.fast_forward >= first:
        raise UsageError(
            f"--fast-forward: must be below {first}, the earliest onset of a {args.difficulty} drill, "
            f"got {args.fast_forward}"
        )
    up_args = argparse.Namespace(
        state_dir=args.state_dir, incident="random", seed=args.seed if args.seed is not None else 0, onset=None,
        fast_forward=args.fast_forward, control=False, detach=True, drill_seed=args.seed, root=None, precision="fp64",
        ranks=args.ranks, ports=args.ports, no_wait_for_prometheus=False,  # a drill's incident must be seen
        difficulty=args.difficulty,
    )  # fmt: skip
    up(up_args)
    run_id = read_json(d.lab.state / "lab.json", "the lab's record")["run_id"]  # bounded (issue 40)
    d.save({"run_id": run_id, "started_at": now(), "acks": [], "diagnosis": None, "ranks": args.ranks,
            "difficulty": args.difficulty})  # fmt: skip
    healthy = "" if args.difficulty == "easy" else ", or nothing at all"
    print(f"drill {run_id} started ({args.difficulty}): something may go wrong between steps {first} and "
          f"{last}{healthy}.")  # fmt: skip
    at = state_flag(args.state_dir)  # every command as printed works, in any state directory
    print(f"watch `runwatch pager --follow --log {shlex.quote(str(d.lab.page_log))}`; then "
          f"`runwatch ack{at} ALERT --comment \"what you know so far\"`, `runwatch diagnose{at} INCIDENT`")  # fmt: skip
    return 0


def add_drill(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("--seed", type=SEED, default=None, help="make the drill reproducible in this state dir")
    p.add_argument("--fast-forward", type=STEP, default=0, metavar="STEP", help="skip ahead (below the earliest onset)")
    p.add_argument(
        "--ranks", type=number(int, 1, MAX_RANKS), default=1,
        help="train over N ranks: half the drills then hide a cluster incident, drawn by Llama 3's shares",
    )  # fmt: skip
    p.add_argument(
        "--difficulty", choices=DIFFICULTIES, default="normal",
        help="easy: never a healthy run; normal: a healthy run one drill in ten; "
        "hard: weaker incidents (strength 0.3-1), an onset anywhere in 150-450",
    )  # fmt: skip
    add_ports(p)
    return drill
