"""runwatch for Lightning: a `Callback` that publishes the training batches through runwatch.watch.

A report covers the whole time of its batches, the loader's wait for them included: it runs from
the end of the previous report (or the start of the epoch, or the end of a validation) to the
end of its last batch. Batches are gathered into one report until `pace_s` seconds of them have
passed (default 1: about one report a second, the pacing the lab's rules count in; 0: a report
every batch), as `step(..., steps=k)`: their mean loss, all their tokens, the largest of their
gradient norms. The loss is the training step's returned loss, the learning rate the first
optimizer's, the gradient norm Lightning's `grad_norm` of the whole module (taken before the
optimizer steps, unscaled), the held-out loss the `heldout_key` of `trainer.callback_metrics`
after each validation (default "val_loss", what `self.log("val_loss", ...)` sets). Tokens:
`tokens(batch)`, by default 0. Rank and world come from the Trainer. Under DDP a rank's compute
time includes its gradient exchange (Lightning's strategy owns the all-reduce): StragglerRank
still compares ranks, but `runwatch.watch.watch_ddp` cannot be attached from here.

    >>> trainer = L.Trainer(callbacks=[RunwatchCallback(port=8000, tokens=lambda b: b[0].numel())])

`port=None` serves nothing: serve `callback.watch.registry` yourself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from lightning.pytorch import Callback
from lightning.pytorch.utilities import grad_norm

from runwatch.watch import DEFAULT_PORT, Watch


class RunwatchCallback(Callback):
    """Publishes a Lightning Trainer's training batches through runwatch.watch, about one report
    every `pace_s` seconds."""

    def __init__(self, run_id: str | None = None, port: int | None = DEFAULT_PORT, heldout_key: str = "val_loss",
                 tokens: Callable[[object], int] = lambda batch: 0, pace_s: float = 1.0,
                 **watch_args):  # fmt: skip
        if not pace_s >= 0:
            raise ValueError(f"pace_s: must be 0 or more seconds, got {pace_s!r}")
        self.run_id, self.port, self.heldout_key, self.tokens = run_id, port, heldout_key, tokens
        self.pace_s, self.watch_args = pace_s, watch_args
        self.watch: Watch | None = None
        self._grad_norm: float | None = None
        self._pending: dict | None = None  # the batches of the report being gathered
        self._since = time.perf_counter()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.watch is None and stage == "fit":
            self.watch = Watch(self.run_id, rank=trainer.global_rank, world_size=trainer.world_size,
                               local_rank=trainer.local_rank, **self.watch_args)  # fmt: skip
            if self.port is not None:
                self.watch.serve(self.port)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.watch.begin()  # the report starts here, the first batch's loading included
        self._since = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._report(trainer)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        norms = grad_norm(pl_module, norm_type=2)
        self._grad_norm = norms.get("grad_2.0_norm_total", math.nan)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:  # a step that returned no loss (manual optimisation skipped it)
            return
        pending = self._pending or {"losses": [], "norms": [], "tokens": 0}
        pending["losses"].append(float(loss))
        pending["tokens"] += int(self.tokens(batch))
        if self._grad_norm is not None:
            pending["norms"].append(self._grad_norm)
        self._pending, self._grad_norm = pending, None
        if time.perf_counter() - self._since >= self.pace_s:
            self._report(trainer)

    def _report(self, trainer) -> None:
        pending, self._pending = self._pending, None
        if not pending:
            return
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        losses = pending["losses"]
        self.watch.step(trainer.global_step, sum(losses) / len(losses), tokens=pending["tokens"],
                        gradient_norm=pending["norms"] or None, learning_rate=lr, steps=len(losses))  # fmt: skip
        self._since = time.perf_counter()

    def on_validation_start(self, trainer, pl_module) -> None:
        if self.watch is not None and not trainer.sanity_checking:
            self._report(trainer)  # the batches before it, over their own time

    def on_validation_end(self, trainer, pl_module) -> None:
        value = trainer.callback_metrics.get(self.heldout_key)
        if value is not None and self.watch is not None and not trainer.sanity_checking:
            self.watch.heldout(float(value))
        if self.watch is not None and not trainer.sanity_checking:
            self.watch.begin()  # the validation's time is not the next batches'
            self._since = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self._report(trainer)
        self.watch.finish()
