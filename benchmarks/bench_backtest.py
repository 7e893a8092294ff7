"""The backtest against another commit's, side by side: cold, after a rule edit, and readouts.

    python benchmarks/bench_backtest.py [--baseline COMMIT] [--repeats 3] [--seeds 100-199]

Checks the baseline commit out into a temporary git worktree and runs `runwatch backtest` there
and in this checkout, alternately, `--repeats` times each, on the same machine and seeds:

- cold: the full backtest as a learner first runs it, with an empty data cache;
- after a rule edit: HeldOutGap's threshold moved (2 -> 1.9) in a copy of the rules, run once
  the cold run is done, as in the edit-and-see loop (with what the cold run cached: the runs'
  blocks, and the results of the alerts the edit leaves alone);
- every alert evaluated (this checkout only): that edit again, with the cached blocks but no
  kept alert result, as after an edit that every alert reads;
- readouts: every run's first-fire steps from both implementations, compared bit for bit,
  in every repeat, under the shipped rules and under the edited ones.

Each repeat gives each implementation a cache folder of its own (RUNWATCH_CACHE; an
implementation without a cache ignores it), so no cold run finds a warm cache.

Each implementation runs from its own tree (`python -m runwatch` with that tree as the working
directory, so its own modules and its own rule files) with this environment's packages. The
figures are wall-clock seconds of the whole command, best and median of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def backtest(tree: Path, seeds: str, out: Path, cache: Path, rules: Path | None = None) -> float:
    """Wall seconds of one `runwatch backtest` run from tree, caching in `cache`; its JSON goes to out."""
    argv = [sys.executable, "-m", "runwatch", "backtest", "--seeds", seeds, "--json", str(out)]
    if rules is not None:
        argv += ["--rules", str(rules)]
    env = {**os.environ, "RUNWATCH_CACHE": str(cache)}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=tree, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_backtest: backtest in {tree} failed: {proc.stderr.strip()[-500:]}")
    return seconds


def edited_rules(tree: Path, into: Path) -> Path:
    """A copy of tree's rules with HeldOutGap's threshold moved: a learner's edit."""
    rules = into / "rules"
    shutil.copytree(tree / "prometheus" / "rules", rules)
    alerts = rules / "alerts.yml"
    text = alerts.read_text()
    old = "alertname: HeldOutGap\n        expr: vector(2)\n"
    if old not in text:
        raise SystemExit(f"bench_backtest: {alerts} no longer holds HeldOutGap's threshold {old.split()[-1]!r}")
    alerts.write_text(text.replace(old, old.replace("vector(2)", "vector(1.9)")))
    return rules


def forget_results(cache: Path) -> None:
    """Keep the cached runs' blocks; drop the alert results kept beside them."""
    for folder in cache.glob("*/results"):
        shutil.rmtree(folder)


def first_fires(path: Path, alerts: set[str] | None = None) -> list[tuple]:
    """Every run's first-fire steps, of `alerts` only if given (the alerts both trees have)."""
    runs = json.loads(path.read_text())["runs"]
    return sorted(
        (r["incident"], r["seed"], sorted((a, s) for a, s in r["first_fire"].items() if alerts is None or a in alerts))
        for r in runs
    )


def same_readouts(a: Path, b: Path) -> bool:
    """Bit for bit, over the alerts both implementations' rules hold (a newer tree may have more)."""
    alerts_of = [set(json.loads(p.read_text())["runs"][0]["first_fire"]) for p in (a, b)]
    common = alerts_of[0] & alerts_of[1]
    return first_fires(a, common) == first_fires(b, common)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="HEAD", help="the commit to compare with (default HEAD)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each implementation (default 3)")
    p.add_argument("--seeds", default="100-199", help="seeds to backtest (default 100-199)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-backtest-") as tmp_name:
        tmp = Path(tmp_name)
        base = tmp / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True)  # fmt: skip
        try:
            trees = {f"baseline {args.baseline}": base, "this checkout": REPO}
            cold: dict[str, list[float]] = {name: [] for name in trees}
            warm: dict[str, list[float]] = {name: [] for name in trees}
            every: dict[str, list[float]] = {name: [] for name in trees}
            for i in range(args.repeats):
                for name, tree in trees.items():
                    stem = tmp / f"{name.split()[0]}-{i}"
                    cache = tmp / f"{stem.name}-cache"
                    cold[name].append(backtest(tree, args.seeds, stem.with_suffix(".json"), cache))
                    rules = edited_rules(tree, stem)
                    warm[name].append(backtest(tree, args.seeds, tmp / f"{stem.name}-edit.json", cache, rules))
                    said = f"cold {cold[name][-1]:.1f} s, after a rule edit {warm[name][-1]:.1f} s"
                    if tree == REPO:  # the baseline keeps no alert result
                        forget_results(cache)
                        every[name].append(backtest(tree, args.seeds, tmp / f"{stem.name}-every.json", cache, rules))
                        said += f", every alert evaluated {every[name][-1]:.1f} s"
                    print(f"repeat {i + 1}: {name}: {said}", file=sys.stderr)
            repeats = range(args.repeats)
            same = all(same_readouts(tmp / f"baseline-{i}.json", tmp / f"this-{i}.json") for i in repeats)
            same_edited = all(
                same_readouts(tmp / f"baseline-{i}-edit.json", tmp / f"this-{i}-edit.json")
                and same_readouts(tmp / f"this-{i}-edit.json", tmp / f"this-{i}-every.json")
                for i in repeats
            )
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    print(f"runwatch backtest --seeds {args.seeds}, {args.repeats} runs each, wall seconds (best / median)")
    print(f"{'implementation':28s} {'cold':>14s} {'after a rule edit':>20s} {'every alert evaluated':>24s}")
    for name in cold:
        c, w, e = cold[name], warm[name], every[name]
        evaluated = f"{min(e):15.1f} / {statistics.median(e):5.1f}" if e else f"{'-':>23s}"
        print(f"{name:28s} {min(c):6.1f} / {statistics.median(c):5.1f} {min(w):11.1f} / {statistics.median(w):5.1f} "
              f"{evaluated}")  # fmt: skip
    base_cold = statistics.median(cold[f"baseline {args.baseline}"])
    print(f"cold, median: {statistics.median(cold['this checkout']) / base_cold:.0%} of the baseline's")
    print(
        f"after a rule edit, median: {statistics.median(warm['this checkout']) / base_cold:.0%} of the baseline's cold"
    )
    print(f"every alert evaluated, median: {statistics.median(every['this checkout']) / base_cold:.0%} of it")
    print(f"readouts bit for bit the same: {same} (shipped rules), {same_edited} (edited rules, both warm runs)")
    return 0 if same and same_edited else 1


if __name__ == "__main__":
    sys.exit(main())
