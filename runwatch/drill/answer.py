"""A drill's answer: what its run really injects, sealed in the run's directory until the learner
has diagnosed it. Built here and nowhere else: `runwatch up --incident random` and `runwatch drill`
seal it before the trainer starts, `runwatch train --incident random` (one process or a cluster's
launcher) seals what it drew, and `runwatch diagnose` grades against it.

    >>> seal_answer(run_dir, TrainConfig(incident="slow_node", onset=287, run_id="drill-0-101500"))
    >>> unseal(answer_path(run_dir))["onset"]
    287
"""

from __future__ import annotations

from pathlib import Path

from runwatch.trainer.config import CLUSTER_INCIDENTS, TrainConfig
from runwatch.trainer.sealed import seal

ANSWER_FILE = "answer.sealed"  # in the run's directory, beside run.json


def answer_path(run_dir: Path) -> Path:
    """Where a run's sealed answer lives."""
    return Path(run_dir) / ANSWER_FILE


def drill_answer(cfg: TrainConfig) -> dict:
    """What a drill's sealed answer holds: the incident, its onset, the run, its training seed (kept
    secret: a known seed replays the healthy run offline), and for a cluster
    incident the rank it strikes (`runwatch diagnose --rank` is graded against it)."""
    # imported here: the lab's commands that only read a lab (status, ack, down) import this
    # module for answer_path, and struck_rank brings numpy, a third of their start-up
    from runwatch.trainer.run import struck_rank

    answer = {"incident": cfg.incident, "onset": cfg.onset, "run_id": cfg.label, "seed": cfg.seed}
    answer |= {"strength": cfg.strength} if cfg.strength != 1 else {}  # a hard drill's weaker incident
    return answer | ({"rank": struck_rank(cfg)} if cfg.incident in CLUSTER_INCIDENTS else {})


def seal_answer(path: Path, cfg: TrainConfig) -> None:
    """Seal cfg's answer at path (a run's `answer_path`, or the file --sealed-answer names)."""
    seal(path, drill_answer(cfg))
