"""runwatch for transformers' `Trainer`: a `TrainerCallback` that publishes what `on_log` receives.

transformers hands a callback the training loss, gradient norm and learning rate at each log,
every `logging_steps` steps (default 500). The lab's rules count seconds and Prometheus scrapes
once a second, so set `logging_steps` to about the steps your job does in a second (1 for steps
of a second or more): each log is one report of `steps=logging_steps`, its loss the mean over
them (transformers' own), its gradient norm the last step's (transformers logs no other), its
time the whole of theirs, from the previous log's end, the data loader's waits and any
evaluation between included. Evaluation's `eval_loss` is the held-out loss. Tokens come from
`state.num_input_tokens_seen`, which the Trainer counts with
`include_num_input_tokens_seen=True` (else none are counted). The end of training calls
`finish()`: the run is over, and its process exiting pages nothing.

    >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[RunwatchCallback(port=8000)])

`port=None` serves nothing: serve `callback.watch.registry` yourself once training has begun.
"""

from __future__ import annotations

from transformers import TrainerCallback

from runwatch.watch import DEFAULT_PORT, Watch


class RunwatchCallback(TrainerCallback):
    """Publishes each log of a transformers Trainer through runwatch.watch (rank and world from its args)."""

    def __init__(self, run_id: str | None = None, port: int | None = DEFAULT_PORT, **watch_args):
        self.run_id, self.port, self.watch_args = run_id, port, watch_args
        self.watch: Watch | None = None
        self._tokens, self._step = 0, 0

    def on_train_begin(self, args, state, control, **kwargs):
        if self.watch is None:
            self.watch = Watch(self.run_id, rank=args.process_index, world_size=args.world_size,
                               local_rank=max(args.local_process_index, 0), **self.watch_args)  # fmt: skip
            if self.port is not None:
                self.watch.serve(self.port)
        self._step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "eval_loss" in logs:
            self.watch.heldout(logs["eval_loss"])
        if "loss" in logs:
            seen = int(state.num_input_tokens_seen or 0)
            steps = max(state.global_step - self._step, 1)
            self.watch.step(state.global_step, logs["loss"], tokens=seen - self._tokens, steps=steps,
                            gradient_norm=logs.get("grad_norm"), learning_rate=logs.get("learning_rate"))  # fmt: skip
            self._tokens, self._step = seen, state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        self.watch.finish()
