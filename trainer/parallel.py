"""Data parallelism: the global batch split among N ranks, and their gradients averaged in rank order.

Rank r computes the mean loss and gradient of rows [r*B/N, (r+1)*B/N) of the global batch of B;
the ranks exchange their parts and every one of them sums the parts in rank order and divides
by N, then all take the same SGD step. The order is fixed, so N ranks simulated in one process
(`Trainer` with `ranks=N`) and N ranks over MPI (`trainer.rank`) compute the same numbers, bit
for bit; with one rank the step is exactly the one-process step.

Not a model of communication cost: the clock of the ranks is `trainer.run.compute_seconds`.

    >>> parts = [share_gradient(w, b, x, y, cfg, r) for r in range(cfg.ranks)]
    >>> loss, g_w, g_b, logits = combine(parts)
"""

from __future__ import annotations

import numpy as np

from runwatch.trainer import model
from runwatch.trainer.config import TrainConfig

Part = tuple[float, np.ndarray, np.ndarray, np.ndarray]  # (loss, g_w, g_b, logits) of one share


def share(cfg: TrainConfig, rank: int) -> slice:
    """The rows of the global batch that rank computes."""
    n = cfg.batch_size // cfg.ranks
    return slice(rank * n, (rank + 1) * n)


def share_gradient(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, cfg: TrainConfig, rank: int) -> Part:
    """One rank's part: model.forward_backward on its share of the batch."""
    rows = share(cfg, rank)
    return model.forward_backward(w, b, x[rows], y[rows])


def combine(parts: list[Part]) -> Part:
    """The ranks' parts averaged in rank order: ((p0 + p1) + p2 ...) / N; logits stacked."""
    loss, g_w, g_b = parts[0][0], parts[0][1].copy(), parts[0][2].copy()
    for other in parts[1:]:
        loss += other[0]
        g_w += other[1]
        g_b += other[2]
    n = len(parts)
    return loss / n, g_w / n, g_b / n, np.concatenate([p[3] for p in parts])


def pack(part: Part) -> np.ndarray:
    """A part as one float64 vector, for the wire: [loss, g_w..., g_b..., logits...]."""
    loss, g_w, g_b, logits = part
    return np.concatenate([[loss], g_w.ravel(), g_b.ravel(), logits.ravel()])


def unpack(vector: np.ndarray, cfg: TrainConfig) -> Part:
    """pack's inverse, for a part of this config's shapes."""
    f, c = cfg.features, cfg.classes
    n = cfg.batch_size // cfg.ranks
    g_w = vector[1 : 1 + f * c].reshape(f, c)
    g_b = vector[1 + f * c : 1 + f * c + c]
    logits = vector[1 + f * c + c :].reshape(n, c)
    return float(vector[0]), g_w, g_b, logits
