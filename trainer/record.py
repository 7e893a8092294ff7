"""What one training step produced: the record the trainer hands to the exporter and the offline writer.

A frozen dataclass: the exporter depends on this record, not on the trainer or its model.
Lesson 20's activation norms are computed from the batch's logits when first read, off the
training step: the live exporter reads them once per scrape, and the offline writer reads a
whole run's at once (`activation_norms`).

    >>> StepRecord(step=0, loss=2.3, heldout_loss=2.3, gradient_norm=1.0, lr=0.1, duration_seconds=1.0,
    ...            tokens=65536, incident_active=False, lab_time=1.0).tokens_per_second
    65536.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


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
    # Lesson 20's signals. NaN where a run has none: no loss scale in float64, no expected
    # loss before the fit window ends.
    weight_norm: float = float("nan")  # L2 norm of all weights and biases
    expected_loss: float = float("nan")  # the power law fitted to the early loss, at this step
    loss_scale: float = float("nan")  # the dynamic loss scale this step ran with (fp16)
    skipped: bool = False  # fp16: the gradient overflowed, so the update was skipped
    # The batch's logits, the final layer's activations (a numpy array, never written to after
    # the step), from which logit_norm_mean and logit_norm_max are computed on first read.
    logits: Any = field(default=None, repr=False, compare=False)

    @cached_property
    def _logit_norms(self) -> tuple[float, float]:
        if self.logits is None:
            return float("nan"), float("nan")
        mean, largest = activation_norms([self.logits])
        return mean[0], largest[0]

    @property
    def logit_norm_mean(self) -> float:
        """Mean L2 norm of the batch's logits, per example."""
        return self._logit_norms[0]

    @property
    def logit_norm_max(self) -> float:
        """Largest L2 norm of one example's logits in the batch."""
        return self._logit_norms[1]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.duration_seconds


def activation_norms(logits: list[Any]) -> tuple[list[float], list[float]]:
    """(mean, largest) per-example L2 norm of each batch's logits, for many batches in one
    vectorised pass. Row sums are a dot with float64 ones, the cheapest numpy form at this size
    (and, for fp16 runs' float32 logits, a sum in float64)."""
    import numpy as np  # here, so that importing the record does not load numpy

    stacked = np.asarray(logits)  # (batches, examples, classes)
    rows = stacked.reshape(-1, stacked.shape[-1])  # one matrix-vector product, as for one batch
    squares = np.dot(rows * rows, np.ones(rows.shape[-1])).reshape(stacked.shape[:-1])
    mean = np.add.reduce(np.sqrt(squares), axis=-1) / squares.shape[-1]
    largest = np.sqrt(np.maximum.reduce(squares, axis=-1))
    return mean.tolist(), largest.tolist()


@dataclass(frozen=True)
class Columns:
    """A whole run's records field by field: one list per field of StepRecord, an entry per step
    (logits: the batch's array at each step). The offline writer reads a run this way; the
    batched trainer builds it without making a record per step. Never written to once built.

    >>> cols = Columns.of(records)
    >>> cols.loss[300] == records[300].loss
    True
    """

    step: list[int]
    loss: list[float]
    heldout_loss: list[float]
    gradient_norm: list[float]
    lr: list[float]
    duration_seconds: list[float]
    tokens: list[int]
    incident_active: list[bool]
    lab_time: list[float]
    weight_norm: list[float]
    expected_loss: list[float]
    loss_scale: list[float]
    skipped: list[bool]
    logits: list[Any]

    @classmethod
    def of(cls, records: list[StepRecord]) -> Columns:
        return cls(**{f: [getattr(r, f) for r in records] for f in _FIELDS})

    def __len__(self) -> int:
        return len(self.step)

    def __add__(self, later: Columns) -> Columns:
        """This run's steps, then `later`'s (a prefix, then the steps forked from it)."""
        return Columns(**{f: getattr(self, f) + getattr(later, f) for f in _FIELDS})

    def records(self) -> list[StepRecord]:
        """The run as the trainer hands it over: a record per step."""
        return [StepRecord(**dict(zip(_FIELDS, values, strict=True))) for values in zip(*self._lists(), strict=True)]

    def _lists(self) -> list[list]:
        return [getattr(self, f) for f in _FIELDS]

    @cached_property
    def tokens_per_second(self) -> list[float]:
        return [t / d for t, d in zip(self.tokens, self.duration_seconds, strict=True)]  # as StepRecord's

    @cached_property
    def logit_norms(self) -> tuple[list[float], list[float]]:
        """(mean, largest) of each step, as StepRecord's, for the whole run in one pass."""
        if any(x is None for x in self.logits):
            return [float("nan")] * len(self), [float("nan")] * len(self)
        return activation_norms(self.logits)


_FIELDS = tuple(f for f in StepRecord.__dataclass_fields__)
