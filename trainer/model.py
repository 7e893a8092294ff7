"""Softmax regression and its data, as small pure functions. Gradients are derived by hand.

Not a general ML library: float64 numpy, one linear layer, mean cross-entropy.

    >>> means = class_means(TrainConfig())
    >>> x, y = sample(np.random.default_rng(0), means, 64, noise=1.0)
    >>> loss, g_w, g_b = loss_and_grad(np.zeros((20, 10)), np.zeros(10), x, y)
"""

from __future__ import annotations

import numpy as np

from trainer.config import TrainConfig


def class_means(cfg: TrainConfig) -> np.ndarray:
    """The fixed distribution: one mean per class, shape (classes, features)."""
    rng = np.random.default_rng(cfg.data_seed)
    return rng.normal(0.0, cfg.class_separation, size=(cfg.classes, cfg.features))


def sample(rng: np.random.Generator, means: np.ndarray, n: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Draw n labelled examples: a uniform class, then its mean plus Gaussian noise."""
    y = rng.integers(0, means.shape[0], size=n)
    x = means[y] + rng.normal(0.0, noise, size=(n, means.shape[1]))
    return x, y


def _log_softmax(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def loss(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy in nats."""
    logp = _log_softmax(x, w, b)
    return float(-logp[np.arange(len(y)), y].mean())


def loss_and_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean cross-entropy and its gradient: dL/dlogits = (softmax - onehot) / n."""
    logp = _log_softmax(x, w, b)
    n = len(y)
    rows = np.arange(n)
    value = float(-logp[rows, y].mean())
    delta = np.exp(logp)
    delta[rows, y] -= 1.0
    delta /= n
    return value, x.T @ delta, delta.sum(axis=0)
