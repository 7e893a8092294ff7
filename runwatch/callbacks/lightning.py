"""runwatch for Lightning: a `Callback` that publishes every training batch through runwatch.watch.

The loss is the training step's returned loss, the learning rate the first optimizer's, the
gradient norm Lightning's `grad_norm` of the whole module (taken before the optimizer steps,
unscaled), the held-out loss the `heldout_key` of `trainer.callback_metrics` after each
validation (default "val_loss", what `self.log("val_loss", ...)` sets). Tokens: `tokens(batch)`,
by default 0. Rank and world come from the Trainer. Under DDP a rank's compute time includes its
gradient exchange (Lightning's strategy owns the all-reduce): StragglerRank still compares ranks.

    >>> trainer = L.Trainer(callbacks=[RunwatchCallback(port=8000, tokens=lambda b: b[0].numel())])

`port=None` serves nothing: serve `callback.watch.registry` yourself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lightning.pytorch import Callback
from lightning.pytorch.utilities import grad_norm

from runwatch.watch import DEFAULT_PORT, Watch


class RunwatchCallback(Callback):
    """Publishes each training batch of a Lightning Trainer through runwatch.watch."""

    def __init__(self, run_id: str | None = None, port: int | None = DEFAULT_PORT, heldout_key: str = "val_loss",
                 tokens: Callable[[object], int] = lambda batch: 0, **watch_args):  # fmt: skip
        self.run_id, self.port, self.heldout_key, self.tokens = run_id, port, heldout_key, tokens
        self.watch_args = watch_args
        self.watch: Watch | None = None
        self._grad_norm: float | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.watch is None and stage == "fit":
            self.watch = Watch(self.run_id, rank=trainer.global_rank, world_size=trainer.world_size,
                               local_rank=trainer.local_rank, **self.watch_args)  # fmt: skip
            if self.port is not None:
                self.watch.serve(self.port)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.watch.begin()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        norms = grad_norm(pl_module, norm_type=2)
        self._grad_norm = norms.get("grad_2.0_norm_total", math.nan)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:  # a step that returned no loss (manual optimisation skipped it)
            return
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        self.watch.step(trainer.global_step, float(loss), tokens=int(self.tokens(batch)),
                        gradient_norm=self._grad_norm, learning_rate=lr)  # fmt: skip

    def on_validation_end(self, trainer, pl_module) -> None:
        value = trainer.callback_metrics.get(self.heldout_key)
        if value is not None and self.watch is not None and not trainer.sanity_checking:
            self.watch.heldout(float(value))

    def on_train_end(self, trainer, pl_module) -> None:
        self.watch.finish()
