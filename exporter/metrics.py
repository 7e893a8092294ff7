"""The trainer's Prometheus metrics, in their own registry, and the names every other part uses.

Every series carries a `run_id` label, so several runs can share one Prometheus and the
dashboards can choose between them. Not for the offline file: `trainer.offline` writes the
same names with timestamps, without a registry.

    >>> m = TrainerMetrics(run_id="none-0", seed=0, incident="none")
    >>> m.observe(record, tokens_per_second=65536.0)
    >>> m.registry.get_sample_value("runwatch_train_step", {"run_id": "none-0"})
    0.0
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from runwatch.trainer.record import StepRecord

# One place for the names: the offline writer, the rules and the dashboards use these strings.
STEP = "runwatch_train_step"
LOSS = "runwatch_train_loss"
HELDOUT_LOSS = "runwatch_train_heldout_loss"
GRADIENT_NORM = "runwatch_train_gradient_norm"
LEARNING_RATE = "runwatch_train_learning_rate"
TOKENS = "runwatch_train_tokens"  # a counter: exposed as runwatch_train_tokens_total
TOKENS_PER_SECOND = "runwatch_train_tokens_per_second"
STEP_DURATION = "runwatch_train_step_duration_seconds"
RUN_INFO = "runwatch_train_run_info"
RUN_START = "runwatch_train_run_start_time_seconds"
RUN_END = "runwatch_train_run_end_time_seconds"
INCIDENT_ACTIVE = "runwatch_train_incident_active"
# Lesson 20's early-warning signals
LOGIT_NORM_MEAN = "runwatch_train_logit_norm_mean"
LOGIT_NORM_MAX = "runwatch_train_logit_norm_max"
WEIGHT_NORM = "runwatch_train_weight_norm"
EXPECTED_LOSS = "runwatch_train_expected_loss"
LOSS_SCALE = "runwatch_train_loss_scale"
SKIPPED_STEPS = "runwatch_train_skipped_steps"  # a counter: runwatch_train_skipped_steps_total
CHECKPOINT_STEP = "runwatch_train_checkpoint_step"
# The lab's clock held while Prometheus was away (trainer.live): a counter, so that the
# console and a learner can see the run waited, and for how long.
WATCHER_WAIT = "runwatch_train_watcher_wait_seconds"  # a counter: runwatch_train_watcher_wait_seconds_total

HELP = {
    STEP: "The last training step completed by this run.",
    LOSS: "Mean cross-entropy of the last step's training batch, in nats, before its update.",
    HELDOUT_LOSS: "Mean cross-entropy on the fixed held-out set, in nats, refreshed every 10 steps.",
    GRADIENT_NORM: "L2 norm of the last step's full gradient (weights and bias).",
    LEARNING_RATE: "Learning rate applied at the last step.",
    TOKENS: "Tokens processed by this run, counting every completed step.",
    TOKENS_PER_SECOND: "Tokens per second of the last step, on the simulated device's clock (not the host's).",
    STEP_DURATION: "Wall-clock duration of each training step on the host, in seconds, waits for Prometheus excluded.",
    RUN_INFO: "Constant 1, labelled with the run's id, seed and incident (hidden in a drill).",
    RUN_START: "Unix time at which this run started (the dashboards list the newest run first).",
    RUN_END: "Unix time at which this run finished its last step; absent while it runs.",
    INCIDENT_ACTIVE: "1 while the injected incident acts on the current step, else 0.",
    LOGIT_NORM_MEAN: "Mean L2 norm of the last batch's logits, the final layer's activations.",
    LOGIT_NORM_MAX: "Largest L2 norm of one example's logits in the last batch.",
    WEIGHT_NORM: "L2 norm of all the model's weights and biases after the last step.",
    EXPECTED_LOSS: "Training loss expected at this step from a power law fitted to the run's early steps.",
    LOSS_SCALE: "Dynamic loss scale of mixed precision used at the last step.",
    SKIPPED_STEPS: "Steps whose update the loss scaler skipped because float16 gradients overflowed.",
    CHECKPOINT_STEP: "Step of the newest checkpoint saved by this run.",
    WATCHER_WAIT: "Seconds the run held its next step because Prometheus had not scraped it recently.",
}

# Around the one-second lab step: a 2% jitter stays in the 0.95-1.05 buckets, a slow node
# (1/0.7 = 1.43 s) lands in 1.5.
STEP_DURATION_BUCKETS = (0.5, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 5.0)

HIDDEN = "hidden"


class TrainerMetrics(Collector):
    """The trainer's series for one run, registered in `registry` (a fresh one by default).

    A collector, not a set of Gauge objects: `observe` only stores the step under a lock, and a
    scrape renders every series from that one step. So a scrape never pairs step s's loss with
    step s-1's step number, and the training loop pays about a microsecond per step.

    In a drill the incident and the seed are withheld: run_info says "hidden", and neither the
    incident-active flag nor the learning rate (which would name an lr_spike at once) is exported.
    """

    def __init__(
        self,
        run_id: str,
        seed: int,
        incident: str,
        drill: bool = False,
        registry: CollectorRegistry | None = None,
        precision: str = "fp64",
        clock: Callable[[], float] = time.time,
    ):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.run_id, self.seed, self.drill, self.precision = run_id, seed, drill, precision
        self.incident = HIDDEN if drill else incident
        self._lock = threading.Lock()
        self._last: StepRecord | None = None
        self._tokens_per_second = 0.0
        self._tokens = 0
        self._buckets = [0] * (len(STEP_DURATION_BUCKETS) + 1)  # the last one is +Inf
        self._duration_sum = 0.0
        self._finished = False
        self._skipped = 0
        self._checkpoint_step: int | None = None
        self._waited = 0.0
        self._clock = clock
        self._started_at, self._ended_at = clock(), None
        self.registry.register(self)

    def observe(self, rec: StepRecord, tokens_per_second: float, wall_seconds: float | None = None) -> None:
        """Publish one completed step. wall_seconds defaults to the simulated duration."""
        seconds = rec.duration_seconds if wall_seconds is None else wall_seconds
        with self._lock:
            self._last = rec
            self._tokens_per_second = tokens_per_second
            self._tokens += rec.tokens
            self._buckets[bisect.bisect_left(STEP_DURATION_BUCKETS, seconds)] += 1
            self._duration_sum += seconds
            self._skipped += rec.skipped

    def checkpoint(self, step: int) -> None:
        """A checkpoint of the state after `step` was saved."""
        with self._lock:
            self._checkpoint_step = step

    def finish(self) -> None:
        """The run is over: stop publishing per-step values, so Prometheus marks them stale.

        Alerts on a finished run then resolve instead of judging its last values forever.
        The step stays (the last one is a fact, and a scrape may not have seen it before the
        run ended), with run_info, the start and end times, the token counter and the
        step-duration histogram.
        """
        with self._lock:
            self._finished = True
            self._ended_at = self._clock()

    def waited(self, seconds: float) -> None:
        """The run held its clock this long for Prometheus (trainer.live's watch)."""
        with self._lock:
            self._waited += seconds

    def add_tokens(self, tokens: int) -> None:
        """Count tokens processed without publishing a step (the fast-forwarded prefix)."""
        with self._lock:
            self._tokens += tokens

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rec, tps, tokens = self._last, self._tokens_per_second, self._tokens
            buckets, duration_sum = list(self._buckets), self._duration_sum
            finished, skipped, checkpoint = self._finished, self._skipped, self._checkpoint_step
            started_at, ended_at, waited = self._started_at, self._ended_at, self._waited
        run = [self.run_id]

        def gauge(name: str, value: float) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, HELP[name], labels=["run_id"])
            fam.add_metric(run, value)
            return fam

        info = GaugeMetricFamily(RUN_INFO, HELP[RUN_INFO], labels=["run_id", "seed", "incident"])
        info.add_metric([self.run_id, HIDDEN if self.drill else str(self.seed), self.incident], 1)
        yield info
        yield gauge(RUN_START, started_at)
        if ended_at is not None:
            yield gauge(RUN_END, ended_at)
        counter = CounterMetricFamily(TOKENS, HELP[TOKENS], labels=["run_id"])
        counter.add_metric(run, tokens)
        yield counter
        wait = CounterMetricFamily(WATCHER_WAIT, HELP[WATCHER_WAIT], labels=["run_id"])
        wait.add_metric(run, waited)
        yield wait
        hist = HistogramMetricFamily(STEP_DURATION, HELP[STEP_DURATION], labels=["run_id"])
        cumulative = list(itertools.accumulate(buckets))
        bounds = [str(b) for b in STEP_DURATION_BUCKETS] + ["+Inf"]
        hist.add_metric(run, list(zip(bounds, cumulative, strict=True)), duration_sum)
        yield hist
        if self.precision == "fp16":
            skipped_family = CounterMetricFamily(SKIPPED_STEPS, HELP[SKIPPED_STEPS], labels=["run_id"])
            skipped_family.add_metric(run, skipped)
            yield skipped_family
        if checkpoint is not None:
            yield gauge(CHECKPOINT_STEP, checkpoint)
        if rec is None:  # nothing trained yet
            return
        yield gauge(STEP, rec.step)
        if finished:  # the run is over: no value left for an alert to judge
            return
        yield gauge(LOSS, rec.loss)
        yield gauge(HELDOUT_LOSS, rec.heldout_loss)
        yield gauge(GRADIENT_NORM, rec.gradient_norm)
        yield gauge(TOKENS_PER_SECOND, tps)
        if not self.drill:
            yield gauge(LEARNING_RATE, rec.lr)
            yield gauge(INCIDENT_ACTIVE, 1 if rec.incident_active else 0)
        for name, value in [
            (LOGIT_NORM_MEAN, rec.logit_norm_mean),
            (LOGIT_NORM_MAX, rec.logit_norm_max),
            (WEIGHT_NORM, rec.weight_norm),
            (EXPECTED_LOSS, rec.expected_loss),  # NaN until the fit window has passed
            (LOSS_SCALE, rec.loss_scale),  # NaN in a float64 run
        ]:
            if value == value:
                yield gauge(name, value)
