"""The runwatch image's rebuild after a one-line code edit, against another commit's Dockerfile.

    python benchmarks/bench_image.py [--baseline COMMIT] [--engine podman|docker]

For this checkout and for the baseline commit (a temporary git worktree), in turn: build the
image once (warming the engine's layer cache), make a one-line edit to runwatch/__init__.py
(a comment appended, as a learner's edit of the code would be), and time the rebuild. A
Dockerfile that installs the dependencies before it copies the source rebuilds only the layers
after the edit; one that copies the source first reinstalls numpy, matplotlib and MPICH.

It builds with the engine the compose test uses (Podman where there is no Docker engine;
compose/podman/build-images.sh makes the base image first there). Figures are wall-clock
seconds of `ENGINE build`, one run each: the difference is a minute, not a few per cent.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EDITED = "runwatch/__init__.py"


def build(engine: str, tree: Path, tag: str, env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([engine, "build", "-q", "-t", tag, str(tree)], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{engine} build of {tree} failed: {proc.stderr.strip()[-600:]}")
    return seconds


def rebuild_after_an_edit(engine: str, tree: Path, tag: str, env: dict) -> tuple[float, float]:
    """(the first build's seconds, the rebuild's after a one-line edit)."""
    first = build(engine, tree, tag, env)
    with open(tree / EDITED, "a") as f:
        f.write(f"# an edit, {time.time()}\n")
    return first, build(engine, tree, tag, env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="HEAD~1", help="the commit whose Dockerfile to compare with")
    p.add_argument("--engine", default="docker" if shutil.which("docker") else "podman")
    args = p.parse_args()
    env = dict(os.environ)
    if args.engine == "podman":
        env.setdefault("CONTAINERS_CONF", str(REPO / "compose" / "podman" / "containers.conf"))
        subprocess.run(["bash", str(REPO / "compose" / "podman" / "build-images.sh")], check=True, env=env)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for name, ref in (("baseline", args.baseline), ("this checkout", None)):
            tree = Path(tmp) / name.replace(" ", "-")
            if ref is None:  # this checkout as it is, uncommitted edits included
                ignore = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".runwatch")
                shutil.copytree(REPO, tree, ignore=ignore)
            else:
                archive = ["git", "-C", str(REPO), "archive", "--format=tar", "-o", f"{tree}.tar", ref]
                subprocess.run(archive, check=True)
                tree.mkdir()
                subprocess.run(["tar", "-xf", f"{tree}.tar", "-C", str(tree)], check=True)
            trees[name] = tree
        for name, tree in trees.items():
            first, again = rebuild_after_an_edit(args.engine, tree, f"runwatch-bench:{tree.name}", env)
            label = f"{name}{f' ({args.baseline})' if name == 'baseline' else ''}"
            print(f"{label:28s} first build {first:6.1f} s; after a one-line edit of {EDITED}: {again:6.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
