"""The workshop's configuration: one typed dataclass, saved with every run as run.json.

The defaults are the plate's workshop (Plate XV.6, "Watching a Run"): softmax regression on
20 features and 10 classes, batches of 64 drawn fresh each step, SGD at 0.1 for 600 steps,
held-out loss on 400 fixed examples every 10 steps, one incident from step 300.

Do not mutate a config after a run starts; build a new one with ``dataclasses.replace``.

    >>> cfg = TrainConfig(incident="lr_spike", seed=7)
    >>> cfg.validate()

An incident has a strength (`lr_spike:0.1` on the command line): 1 is the plate's, and the
scale below (TrainConfig.strength) says what a smaller one means for each incident.

    >>> TrainConfig(incident="repeated_batch", strength=0.5).repeats
    30
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass

from runwatch.core.command import number

INCIDENTS = ("none", "lr_spike", "corrupt_shard", "repeated_batch", "slow_node")
# Incidents of a cluster: one rank among several goes wrong (trainer.rank, trainer.faults).
CLUSTER_INCIDENTS = ("straggler", "hang", "rank_crash", "ecc")
# Of those, the faults that strike at one step and make the job restart (trainer.faults).
FAULTS = ("hang", "rank_crash", "ecc")
MAX_RANKS = 16  # 2 cores here: 8 ranks already share each core four ways
# Incidents that come in sizes (TrainConfig.strength); a fault strikes or it does not.
SCALED_INCIDENTS = ("lr_spike", "corrupt_shard", "repeated_batch", "slow_node", "straggler")


# What a run may ask for: enough for any exercise, never enough to fill a disk or memory. A
# 10,000-step run is 2.8 lab hours live and about 17 MB of OpenMetrics offline; numpy seeds are
# 32-bit; a learning rate above 10 makes this model's loss overflow within a few steps.
MAX_STEPS = 10_000
MAX_SEED = 2**32 - 1
# The flags that take a seed or a step, as every command parses them (argparse types).
SEED = number(int, 0, MAX_SEED)
STEP = number(int, 0, MAX_STEPS)
MAX_LR = 10.0

# A drill's onset is drawn from this range, so "it's always step 300" is no shortcut.
DRILL_ONSET_RANGE = (240, 360)
# A healthy drill is minutes of waiting with nothing to do (issue 38: three of a learner's first
# four drills were healthy, the draw being uniform over five). It stays a possible answer, so
# that "none" is never ruled out, but half of its draws are drawn again among the incidents:
# one drill in ten is healthy.
HEALTHY_REDRAWN = 0.5
# A drill's difficulty (`runwatch drill --difficulty`): easy never hides a healthy run; hard hides
# weaker incidents, at strengths the backtest's workbench measures (`--strengths`), from an onset
# in a wider range (still 25 steps after the earliest fast-forward, for the baselines, and far
# enough from the end for a repeated batch to end and be seen).
DIFFICULTIES = ("easy", "normal", "hard")
HARD_ONSET_RANGE = (150, 450)
HARD_STRENGTHS = (0.3, 1.0)


# Llama 3's unexpected interruptions over 54 days on 16,384 GPUs (Table 5, the shares as printed),
# by the cluster incident each stands for: a faulty GPU falls off the bus (30.1%); HBM3 and SRAM
# memory errors are ECC errors (17.2% + 4.5%); NCCL watchdog timeouts, and network switches and
# cables, hang a collective (1.7% + 8.4%); a GPU's thermal interface or sensor throttles it (1.4%).
LLAMA3_SHARES = {"rank_crash": 30.1, "ecc": 21.7, "hang": 10.1, "straggler": 1.4}


def draw_drill(rng: random.Random, cluster: bool = False, difficulty: str = "normal") -> dict:
    """A drill's hidden incident (or none), its onset step and its training seed, drawn from rng.
    With `cluster` (a run over several ranks), half the drills hide a cluster incident, drawn by
    Llama 3's shares.

    The seed is drawn too, and sealed with the answer: runs are reproducible bit for bit, so a
    known seed would let a learner replay the healthy run offline and find the onset without
    diagnosing anything (issue 28). It is drawn last, so a seeded draw keeps its incident and onset.
    A difficulty other than normal draws differently (DIFFICULTIES); normal draws as it always did.
    """
    if cluster and rng.random() < 0.5:
        incident = rng.choices(list(LLAMA3_SHARES), weights=list(LLAMA3_SHARES.values()))[0]
    else:
        incident = rng.choice(INCIDENTS)
        if incident == "none" and (
            difficulty == "easy" or rng.random() < HEALTHY_REDRAWN
        ):  # an incident's draw takes no coin
            incident = rng.choice(INCIDENTS[1:])
    onset = rng.randint(*(HARD_ONSET_RANGE if difficulty == "hard" else DRILL_ONSET_RANGE))
    drawn = {"incident": incident, "onset": onset, "seed": rng.randint(0, MAX_SEED)}
    if difficulty == "hard" and incident in SCALED_INCIDENTS:
        drawn["strength"] = round(rng.uniform(*HARD_STRENGTHS), 3)  # to the thousandth, as the backtest draws
    return drawn


def onset_range(difficulty: str = "normal") -> tuple[int, int]:
    """Where a drill of this difficulty may put its onset."""
    return HARD_ONSET_RANGE if difficulty == "hard" else DRILL_ONSET_RANGE


def parse_incident(text: str) -> tuple[str, float]:
    """'lr_spike' -> ('lr_spike', 1.0); 'lr_spike:0.1' -> ('lr_spike', 0.1). The strength is
    checked by TrainConfig.validate; here only its form.

    >>> parse_incident("corrupt_shard:0.2")
    ('corrupt_shard', 0.2)
    """
    name, sep, strength = text.partition(":")
    if not sep:
        return name, 1.0
    try:
        value = float(strength)
    except ValueError:
        raise ConfigError("strength", f"expected INCIDENT:STRENGTH such as lr_spike:0.1, got {text!r}") from None
    return name, value


class ConfigError(ValueError):
    """A configuration value a run cannot start with: `field` names it, `problem` says why.

    >>> ConfigError("lr", "must be positive, got 0").field
    'lr'
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class TrainConfig:
    # --- the model and its data (the plate's workshop) ---
    features: int = 20  # input dimension
    classes: int = 10  # softmax outputs
    batch_size: int = 64  # examples per step, drawn fresh every step
    lr: float = 0.1  # plain SGD learning rate
    steps: int = 600  # steps in a run
    heldout_size: int = 400  # fixed held-out examples, never trained on
    heldout_every: int = 10  # held-out loss is evaluated on steps divisible by this
    # Class means are N(0, class_separation^2) per feature, drawn once from data_seed, so every
    # run and seed samples the same distribution. The ratio 3/4 makes the classes well separated
    # (healthy loss near 0.25), so shuffled labels raise the gradient norm to ~5-10x its running
    # mean. The feature scale (noise 4) makes one SGD step at 0.1 large enough that a repeated
    # batch is memorised within ~30 steps, opening a held-out/training gap of 2x and more.
    # benchmarks/ and tests/test_signatures.py show both across seeds.
    class_separation: float = 3.0
    noise: float = 4.0  # per-feature standard deviation around the class mean
    data_seed: int = 20  # fixes the distribution; `seed` varies the draws from it

    # --- the incident ---
    incident: str = "none"  # one of INCIDENTS
    onset: int = 300  # first step of the incident
    lr_spike_factor: float = 150.0  # lr_spike: learning rate multiplied by this ...
    lr_spike_steps: int = 5  # ... for this many steps
    corrupt_steps: int = 30  # corrupt_shard: labels shuffled for this many steps
    repeat_steps: int = 60  # repeated_batch: the onset's batch fed this many times
    slow_factor: float = 0.7  # slow_node: throughput multiplied by this, onset to the end
    # The incident's size, in (0, 1]: 1 is the plate's (the fields above), and a smaller one
    # scales each incident on its own measure: lr_spike multiplies the learning rate by
    # lr_spike_factor**strength (geometric: 0.1 is x1.65, 0.22 is x3; an lr spike's harm grows
    # with the log of its factor, so a linear scale would put every strength above 0.05 past
    # x8); corrupt_shard shuffles that share of each batch's labels; repeated_batch feeds the
    # batch round(repeat_steps * strength) times (at least once); slow_node and straggler take
    # that share of their slowdown (0.27 of 30% is a node 8% slower). Real incidents come in all
    # sizes, and a rule's trade-off only shows on the small ones (`runwatch backtest --strengths`).
    strength: float = 1.0

    # --- the machine and the lab clock ---
    seed: int = 0  # batches, held-out set, jitter and shuffles all follow from it
    run_id: str = ""  # label on every series; empty means derived from incident and seed
    tokens_per_example: int = 1024  # one example stands for a sequence of this many tokens
    step_seconds: float = 1.0  # nominal device time of one step: one step is one lab second
    jitter_sigma: float = 0.02  # lognormal sigma of each step's device time (2%)
    drill: bool = False  # hide the incident from every exported series

    # --- Lesson 20: mixed precision, the expected curve, checkpoints ---
    precision: str = "fp64"  # "fp64" (the plate) or "fp16": float16 compute, float32 master weights
    # The dynamic loss scaler follows PyTorch's GradScaler: on inf/NaN gradients skip the step
    # and halve the scale; after `loss_scale_growth_interval` clean steps, double it.
    loss_scale_init: float = 65536.0  # 2**16, GradScaler's default; this model's first step overflows it once
    # 50, not GradScaler's 2000: a long run's scaler has probed upward thousands of times and
    # sits at the edge of float16's range. Growing every 50 steps gets this 600-step run there
    # by step ~150 (one skipped step per probe), so a jump in gradients at step 300 overflows,
    # as it would in a long run. With 2000 the scale never grows here and a spike rarely shows.
    loss_scale_growth_interval: int = 50
    fit_start: int = 10  # the expected loss curve is fitted to the training loss of steps
    fit_end: int = 150  # [fit_start, fit_end), then extrapolated: a*t^-b + c
    checkpoint_every: int = 50  # K: save a checkpoint after every K steps (live runs)
    checkpoint_keep: int = 3  # M: keep the last M checkpoints

    # --- the cluster: data-parallel ranks (trainer.cluster) ---
    ranks: int = 1  # each computes the gradient of its share of the batch; they average them
    ranks_per_node: int = 2  # ranks grouped into simulated nodes (host names node0, node1, ...)
    # Lab seconds the gradient exchange itself takes once the last rank arrives. 10 ms: an
    # allreduce of a large model's gradients over a fast fabric is a few percent of a step.
    collective_seconds: float = 0.01
    # straggler: the rank's GPU overheats and throttles its SM clock to this fraction of nominal,
    # so the rank computes 1/0.7 slower from the onset and every rank waits for it.
    straggler_clock: float = 0.7
    # hang: each rank's watchdog aborts the job after this long in one gradient exchange.
    # PyTorch's NCCL default is 10 minutes, a few hundred steps of a large model; here a step is
    # one lab second, and 60 s leaves TrainingStalled (10 s) time to page and the learner time to
    # run the flight recorder before the teardown, while no healthy step (1.43 s at most, a
    # straggler's) comes near it.
    watchdog_seconds: float = 60.0
    # After a teardown the launcher waits this long before it restarts every rank from the last
    # checkpoint: a spare node to replace the failed one, and the job's start-up. Meta measures
    # 5 to 20 minutes for a large job; 30 lab seconds is long enough that RankDown (10 s) pages.
    restart_seconds: float = 30.0

    def validate(self) -> None:
        """Raise ConfigError naming the first field a run cannot use."""
        if self.incident not in INCIDENTS + CLUSTER_INCIDENTS:
            known = ", ".join(INCIDENTS + CLUSTER_INCIDENTS)
            raise ConfigError("incident", f"unknown incident {self.incident!r}; choose one of {known}")
        if not 1 <= self.ranks <= MAX_RANKS or self.batch_size % self.ranks:
            raise ConfigError(
                "ranks", f"must be in [1, {MAX_RANKS}] and divide the batch of {self.batch_size}, got {self.ranks}"
            )
        if self.incident in CLUSTER_INCIDENTS and self.ranks < 2:
            raise ConfigError("incident", f"{self.incident} is a cluster incident: it needs 2 ranks or more")
        if self.ranks > 1 and self.precision != "fp64":
            raise ConfigError("precision", "a run over several ranks trains in fp64 only")
        if self.ranks_per_node <= 0:
            raise ConfigError("ranks_per_node", f"must be positive, got {self.ranks_per_node}")
        if self.collective_seconds < 0:
            raise ConfigError("collective_seconds", f"must not be negative, got {self.collective_seconds}")
        for name in ("watchdog_seconds", "restart_seconds"):
            if not 0 < getattr(self, name) <= 3600:
                raise ConfigError(name, f"must be in (0, 3600] seconds, got {getattr(self, name)}")
        if not 0 < self.straggler_clock <= 1:
            raise ConfigError("straggler_clock", f"must be in (0, 1], got {self.straggler_clock}")
        if not 0 < self.lr <= MAX_LR:  # NaN and inf fail too
            raise ConfigError("lr", f"the learning rate must be in (0, {MAX_LR:g}], got {self.lr}")
        if not 0 < self.steps <= MAX_STEPS:
            raise ConfigError("steps", f"must be in [1, {MAX_STEPS}], got {self.steps}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("seed", f"must be in [0, {MAX_SEED}], got {self.seed}")
        if not 0 <= self.onset < self.steps:
            raise ConfigError("onset", f"must be in [0, steps), got onset={self.onset} with steps={self.steps}")
        for name in ("features", "classes", "batch_size", "heldout_size", "heldout_every", "tokens_per_example"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be positive, got {getattr(self, name)}")
        if self.step_seconds <= 0:
            raise ConfigError("step_seconds", f"must be positive, got {self.step_seconds}")
        if self.precision not in ("fp64", "fp16"):
            raise ConfigError("precision", f"must be fp64 or fp16, got {self.precision!r}")
        if not 0 <= self.fit_start < self.fit_end:
            raise ConfigError("fit_end", f"the fit window [{self.fit_start}, {self.fit_end}) is empty")
        if self.checkpoint_every <= 0 or self.checkpoint_keep <= 0:
            raise ConfigError("checkpoint_every", "it and checkpoint_keep must be positive")
        if not 0 < self.slow_factor <= 1:
            raise ConfigError("slow_factor", f"must be in (0, 1], got {self.slow_factor}")
        if not 0 < self.strength <= 1:  # NaN fails too
            raise ConfigError("strength", f"an incident's strength must be in (0, 1], got {self.strength}")
        if self.strength != 1 and self.incident not in SCALED_INCIDENTS:
            raise ConfigError(
                "strength", f"{self.incident} has no strength; only {', '.join(SCALED_INCIDENTS)} come in sizes"
            )

    # --- the incident at its strength (see `strength`) ---
    @property
    def spike_factor(self) -> float:
        """lr_spike: what the learning rate is multiplied by."""
        return self.lr_spike_factor if self.strength == 1 else self.lr_spike_factor**self.strength

    @property
    def repeats(self) -> int:
        """repeated_batch: how many steps feed the onset's batch."""
        return self.repeat_steps if self.strength == 1 else max(1, round(self.repeat_steps * self.strength))

    @property
    def throughput_factor(self) -> float:
        """slow_node: what the throughput is multiplied by."""
        return self.slow_factor if self.strength == 1 else 1 - self.strength * (1 - self.slow_factor)

    @property
    def clock_factor(self) -> float:
        """straggler: the fraction of its nominal SM clock the struck rank runs at."""
        return self.straggler_clock if self.strength == 1 else 1 - self.strength * (1 - self.straggler_clock)

    @property
    def label(self) -> str:
        """The run's id: run_id if set, else '<incident>-<seed>', '<incident>:<strength>-<seed>'
        below full strength (never the incident or the seed in a drill: a known seed replays)."""
        if self.run_id:
            return self.run_id
        if self.drill:
            return "drill"
        return f"{self.incident_spec}-{self.seed}"

    @property
    def incident_spec(self) -> str:
        """The incident as `--incident` takes it: 'lr_spike', or 'lr_spike:0.1' below full strength."""
        return self.incident if self.strength == 1 else f"{self.incident}:{self.strength:g}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "run.json") -> TrainConfig:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(source, f"unknown field {unknown[0]!r}")
        return cls(**data)
