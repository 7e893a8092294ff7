"""Softmax regression and its data, as small pure functions. Gradients are derived by hand.

Not a general ML library: float64 numpy, one linear layer, mean cross-entropy.

    >>> means = class_means(TrainConfig())
    >>> x, y = sample(np.random.default_rng(0), means, 64, noise=1.0)
    >>> loss, g_w, g_b = loss_and_grad(np.zeros((20, 10)), np.zeros(10), x, y)
"""

from __future__ import annotations

import numpy as np

from runwatch.trainer.config import TrainConfig


def class_means(cfg: TrainConfig) -> np.ndarray:
    """The fixed distribution: one mean per class, shape (classes, features)."""
    rng = np.random.default_rng(cfg.data_seed)
    return rng.normal(0.0, cfg.class_separation, size=(cfg.classes, cfg.features))


def sample(rng: np.random.Generator, means: np.ndarray, n: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Draw n labelled examples: a uniform class, then its mean plus Gaussian noise."""
    y = rng.integers(0, means.shape[0], size=n)
    x = means[y] + rng.normal(0.0, noise, size=(n, means.shape[1]))
    return x, y


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis (a batch's rows, or every batch of a stack), shifted by
    the row maximum; in the logits' own dtype."""
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def loss(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy in nats."""
    logp = log_softmax(x @ w + b)
    return float(-logp[np.arange(len(y)), y].mean())


def loss_and_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean cross-entropy and its gradient: dL/dlogits = (softmax - onehot) / n."""
    value, g_w, g_b, _ = forward_backward(w, b, x, y)
    return value, g_w, g_b


def forward_backward(
    w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """loss_and_grad in float64, plus the logits (the final layer's activations)."""
    logits = x @ w + b
    logp = log_softmax(logits)
    n = len(y)
    rows = np.arange(n)
    value = float(-logp[rows, y].mean())
    delta = np.exp(logp)
    delta[rows, y] -= 1.0
    delta /= n
    return value, x.T @ delta, delta.sum(axis=0), logits


def forward_backward_fp16(
    w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, scale: float
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Mixed precision: forward and backward in float16 on float16 copies of the float32 master
    weights, with the loss multiplied by `scale` before the backward pass.

    Returns the loss, the *unscaled* float32 gradients (inf or NaN where float16 overflowed:
    the caller's loss scaler decides) and the logits as float32.
    """
    h = np.float16
    x16, w16, b16 = x.astype(h), w.astype(h), b.astype(h)
    logits = x16 @ w16 + b16
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=1, keepdims=True)
    n = len(y)
    rows = np.arange(n)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        value = float(-(z[rows, y] - np.log(total[:, 0])).astype(np.float32).mean())
        delta = e / total
        delta[rows, y] -= h(1.0)
        delta = delta * h(scale / n)  # d(scale * loss)/dlogits, in float16: this is what overflows
        g_w = (x16.T @ delta).astype(np.float32) / np.float32(scale)
        g_b = delta.sum(axis=0).astype(np.float32) / np.float32(scale)
    return value, g_w, g_b, logits.astype(np.float32)


def loss_fp16(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy computed in float16 (the held-out evaluation of a mixed-precision run)."""
    h = np.float16
    logits = x.astype(h) @ w.astype(h) + b.astype(h)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        logp = log_softmax(logits)
    return float(-logp[np.arange(len(y)), y].astype(np.float32).mean())


def fit_power_law(t: np.ndarray, loss: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit of loss = a * t^(-b) + c; returns (a, b, c).

    For a fixed exponent b the model is linear in a and c, with a closed-form least-squares
    solution; every b of a grid is solved at once and the best wins, then the grid is refined
    around it (four rounds of 30 points: b to about 1e-4).
    """
    t, loss = np.asarray(t, float), np.asarray(loss, float)

    def solve(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u = t[:, None] ** -b[None, :]  # one column per exponent
        du, dy = u - u.mean(axis=0), loss - loss.mean()
        a = (du * dy[:, None]).sum(axis=0) / (du * du).sum(axis=0)
        c = loss.mean() - a * u.mean(axis=0)
        sse = ((u * a + c - loss[:, None]) ** 2).sum(axis=0)
        return sse, a, c

    lo, hi = 0.01, 4.0
    for _ in range(4):
        grid = np.linspace(lo, hi, 30)
        sse, a, c = solve(grid)
        i = int(np.argmin(sse))
        span = (hi - lo) / 29
        lo, hi = max(0.001, grid[i] - span), grid[i] + span
    return float(a[i]), float(grid[i]), float(c[i])
