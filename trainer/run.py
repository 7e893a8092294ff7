"""One training run of the workshop, a step at a time, with the incident injected.

Every random draw comes from a generator seeded by (seed, stream, step), so a step's batch,
shuffle and jitter do not depend on what ran before it: the same seed gives the same series
bit for bit, and an incident run shares its healthy prefix with the `none` run of its seed.

This module does no sleeping and no exporting; `trainer.live` and `trainer.offline` do.

    >>> t = Trainer(TrainConfig(incident="corrupt_shard"))
    >>> rec = t.step()          # step 0
    >>> rec.step, rec.loss > 0
    (0, True)
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np

from trainer import model
from trainer.config import TrainConfig

# Independent random streams; their numbers are part of the data's definition.
_BATCH, _HELDOUT, _JITTER, _SHUFFLE = 0, 1, 2, 3


@dataclass(frozen=True)
class StepRecord:
    """What one step produced: the numbers the exporter publishes."""

    step: int
    loss: float  # the batch's mean cross-entropy, before this step's update
    heldout_loss: float  # latest held-out evaluation (refreshed every heldout_every steps)
    gradient_norm: float  # L2 norm of the full gradient (weights and bias)
    lr: float  # learning rate applied at this step
    duration_seconds: float  # simulated device time of this step
    tokens: int  # tokens processed by this step
    incident_active: bool  # whether the incident acts on this step
    lab_time: float  # lab seconds from the run's start to the end of this step

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.duration_seconds


def _rng(cfg: TrainConfig, stream: int, step: int = 0) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, stream, step])


def incident_active(cfg: TrainConfig, step: int) -> bool:
    """Whether the configured incident acts on this step."""
    length = {
        "none": 0,
        "lr_spike": cfg.lr_spike_steps,
        "corrupt_shard": cfg.corrupt_steps,
        "repeated_batch": cfg.repeat_steps,
        "slow_node": cfg.steps,  # from the onset to the end
    }[cfg.incident]
    return cfg.onset <= step < cfg.onset + length


def learning_rate(cfg: TrainConfig, step: int) -> float:
    if cfg.incident == "lr_spike" and incident_active(cfg, step):
        return cfg.lr * cfg.lr_spike_factor
    return cfg.lr


def step_durations(cfg: TrainConfig) -> np.ndarray:
    """Device seconds for every step: nominal, times lognormal jitter, slower on a slow node.

    Drawn in one go from the run's jitter stream, so the jitter does not depend on the incident.
    """
    seconds = cfg.step_seconds * _rng(cfg, _JITTER).lognormal(0.0, cfg.jitter_sigma, size=cfg.steps)
    if cfg.incident == "slow_node":
        seconds[cfg.onset :] /= cfg.slow_factor
    return seconds


def get_batch(cfg: TrainConfig, means: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch trained on at this step, with the incident's corruption applied."""
    source = step
    if cfg.incident == "repeated_batch" and incident_active(cfg, step):
        source = cfg.onset  # the onset's batch, fed again and again
    x, y = model.sample(_rng(cfg, _BATCH, source), means, cfg.batch_size, cfg.noise)
    if cfg.incident == "corrupt_shard" and incident_active(cfg, step):
        y = _rng(cfg, _SHUFFLE, step).permutation(y)
    return x, y


class Trainer:
    """Holds the weights and the clock; `step()` advances one step.

    Use `trainer.live` to run it paced and exported, `trainer.offline` to write a whole run.
    """

    def __init__(self, cfg: TrainConfig):
        cfg.validate()
        self.cfg = cfg
        self.means = model.class_means(cfg)
        self.heldout = model.sample(_rng(cfg, _HELDOUT), self.means, cfg.heldout_size, cfg.noise)
        self.durations = step_durations(cfg)
        self.w = np.zeros((cfg.features, cfg.classes))
        self.b = np.zeros(cfg.classes)
        self.next_step = 0
        self.lab_time = 0.0
        self.heldout_loss = float("nan")

    @property
    def done(self) -> bool:
        return self.next_step >= self.cfg.steps

    def step(self) -> StepRecord:
        cfg, s = self.cfg, self.next_step
        # --- batch, forward, backward ---
        x, y = get_batch(cfg, self.means, s)
        loss, g_w, g_b = model.loss_and_grad(self.w, self.b, x, y)
        grad_norm = float(np.sqrt(np.sum(g_w * g_w) + np.sum(g_b * g_b)))
        # --- held-out evaluation, on the same weights as this step's training loss ---
        if s % cfg.heldout_every == 0:
            self.heldout_loss = model.loss(self.w, self.b, *self.heldout)
        # --- update ---
        lr = learning_rate(cfg, s)
        self.w -= lr * g_w
        self.b -= lr * g_b
        # --- the clock ---
        duration = float(self.durations[s])
        self.lab_time += duration
        self.next_step += 1
        return StepRecord(
            step=s,
            loss=loss,
            heldout_loss=self.heldout_loss,
            gradient_norm=grad_norm,
            lr=lr,
            duration_seconds=duration,
            tokens=cfg.batch_size * cfg.tokens_per_example,
            incident_active=incident_active(cfg, s),
            lab_time=self.lab_time,
        )

    def fork(self, cfg: TrainConfig) -> Trainer:
        """A copy of this trainer that goes on under cfg, which may differ only in its incident.

        Before the onset every incident trains exactly as the healthy run does, so a backtest
        trains the shared prefix once per seed and forks it for each incident.
        """
        cfg.validate()
        if dataclasses.replace(cfg, incident=self.cfg.incident) != self.cfg:
            raise ValueError("fork: the configs may differ only in their incident")
        if self.next_step > cfg.onset:
            raise ValueError(f"fork: step {self.next_step} is past the onset {cfg.onset}")
        other = copy.deepcopy(self)
        other.cfg = cfg
        other.durations = step_durations(cfg)
        return other

    def run(self) -> list[StepRecord]:
        """Every remaining step, unpaced."""
        out = []
        while not self.done:
            out.append(self.step())
        return out
