"""The plate's readouts and signatures: what Plate XV.6 says each incident does to the alerts.

This is the spec, written once. The backtest reports against it, and the promtool incident
tests are generated from it. It says what should happen; whether an alert fired is decided
only by Prometheus evaluating the rule files.
"""

from __future__ import annotations

from dataclasses import dataclass

from runwatch.core.names import CLUSTER_ALERTS, PLATE_ALERTS, STRAGGLER_ALERTS
from runwatch.trainer.config import CLUSTER_INCIDENTS as CLUSTER_INCIDENTS  # re-exported, as INCIDENTS
from runwatch.trainer.config import FAULTS as FAULTS
from runwatch.trainer.config import INCIDENTS as INCIDENTS  # re-exported: the plate's incidents are the trainer's

ALERTS = PLATE_ALERTS

# The plate's readouts: the step at which each alert first fired, as printed ("-": the plate
# gives no readout for that pair).
PLATE_READOUTS: dict[str, dict[str, int | None]] = {
    "none": {},
    "lr_spike": {"TrainingLossJump": 302},
    "corrupt_shard": {"TrainingLossJump": 300, "GradientNormJump": 300},
    "repeated_batch": {"HeldOutGap": 339, "TrainingLossJump": 362},
    "slow_node": {"ThroughputDrop": 297},
}


@dataclass(frozen=True)
class Expect:
    """What one alert should do in one incident's run.

    fires=(lo, hi): first fires at a step in [lo, hi]. fires=None: never fires, unless
    `after` is set, in which case it must stay silent before step `after` and may fire after.
    """

    fires: tuple[int, int] | None = None
    after: int | None = None

    def met(self, first_fire: int | None) -> bool:
        if self.fires is not None:
            return first_fire is not None and self.fires[0] <= first_fire <= self.fires[1]
        if self.after is not None:
            return first_fire is None or first_fire >= self.after
        return first_fire is None

    def describe(self) -> str:
        if self.fires is not None:
            lo, hi = self.fires
            return f"fires at {lo}" if lo == hi else f"fires in {lo}-{hi}"
        return f"silent before {self.after}" if self.after is not None else "silent"


SILENT = Expect()

# Issue 3's targets, from the plate: which alerts fire, when, and which stay silent. A slow
# node "cannot fire before the onset", so its window starts at 300 (the plate prints 297).
SIGNATURES: dict[str, dict[str, Expect]] = {
    "none": {a: SILENT for a in ALERTS},
    "corrupt_shard": {
        "TrainingLossJump": Expect(fires=(300, 300)),
        "GradientNormJump": Expect(fires=(300, 300)),
        "HeldOutGap": SILENT,
        "ThroughputDrop": SILENT,
    },
    "lr_spike": {
        "TrainingLossJump": Expect(fires=(300, 302)),
        "HeldOutGap": SILENT,
        "ThroughputDrop": SILENT,
    },
    "repeated_batch": {
        "HeldOutGap": Expect(fires=(300, 339)),
        "TrainingLossJump": Expect(fires=(360, 365)),
        "GradientNormJump": Expect(after=360),
        "ThroughputDrop": SILENT,
    },
    "slow_node": {
        "ThroughputDrop": Expect(fires=(300, 302)),
        "TrainingLossJump": SILENT,
        "GradientNormJump": SILENT,
        "HeldOutGap": SILENT,
    },
}


# The cluster's targets (issue 15): within 30 lab seconds of a straggler's onset, StragglerRank
# names its rank and GPUThermalThrottle its GPU; a step lasts about 1.43 s then, so 30 s is 21
# steps. The job slows as on a slow node, so ThroughputDrop fires too. In every other run, of
# one rank or many, the cluster alerts stay silent (slow_node included: no rank stands out).
CLUSTER_SIGNATURES: dict[str, dict[str, Expect]] = {
    "straggler": {
        "StragglerRank": Expect(fires=(300, 321)),
        "GPUThermalThrottle": Expect(fires=(300, 321)),
        "ThroughputDrop": Expect(fires=(300, 302)),
        "TrainingLossJump": SILENT,
        "GradientNormJump": SILENT,
        "HeldOutGap": SILENT,
    },
}


# The faults' targets (issue 15), in lab seconds from the fault (runwatch.backtest reads them
# so): no step ends while a job stalls or restarts. A hang stalls from the end of the last step;
# TrainingStalled fires within T + 5 = 15 s. The ranks' watchdog (60 s after they enter the
# exchange, about 61 s) tears the job down: JobRestarted at once, RankDown and TrainerDown 10 s
# later. A crash's GPU reports XID 79 as its step begins and the rank exits 3 s later: RankDown,
# JobRestarted and GPUXidError within 15 s. An ECC error pages at once; the job is drained at the
# next checkpoint, at most 49 steps (about 50 s) on. Plate alerts and the straggler's stay silent,
# but for HeldOutGap in a hang: a stalled trainer serves one step's values on, and its window of
# 20 s comes to read them alone (6 of 100 hangs; Alertmanager holds it back under TrainingStalled).
_QUIET = (*STRAGGLER_ALERTS, *PLATE_ALERTS)
FAULT_SIGNATURES: dict[str, dict[str, Expect]] = {
    "hang": {
        "TrainingStalled": Expect(fires=(10, 15)),
        "JobRestarted": Expect(fires=(60, 65)),
        "RankDown": Expect(fires=(70, 75)),
        "TrainerDown": Expect(fires=(70, 75)),
        "GPUXidError": SILENT,
        **{a: SILENT for a in _QUIET if a != "HeldOutGap"},
    },
    "rank_crash": {
        "GPUXidError": Expect(fires=(0, 15)),
        "JobRestarted": Expect(fires=(0, 15)),
        "RankDown": Expect(fires=(0, 15)),
        "TrainerDown": Expect(fires=(0, 15)),
        "TrainingStalled": SILENT,
        **{a: SILENT for a in _QUIET},
    },
    "ecc": {
        "GPUXidError": Expect(fires=(0, 2)),
        "JobRestarted": Expect(fires=(0, 55)),
        "RankDown": Expect(fires=(10, 65)),
        "TrainerDown": Expect(fires=(10, 65)),
        "TrainingStalled": SILENT,
        **{a: SILENT for a in _QUIET},
    },
}


def signature(incident: str) -> dict[str, Expect]:
    """Every expectation of one incident's runs: the plate's, or the cluster's for a cluster
    incident (a fault's in seconds from it); the cluster alerts silent in every run of the
    plate's incidents."""
    if incident in FAULT_SIGNATURES:
        return FAULT_SIGNATURES[incident]
    if incident in CLUSTER_SIGNATURES:
        return {**{a: SILENT for a in CLUSTER_ALERTS}, **CLUSTER_SIGNATURES[incident]}
    plates = {a: SILENT for a in ALERTS} if incident == "none" else SIGNATURES[incident]
    return {**plates, **{a: SILENT for a in CLUSTER_ALERTS}}


def expectation(incident: str, alert: str) -> Expect | None:
    """What the spec expects of one alert in one incident's runs: SILENT for any alert in a
    healthy run, None if it says nothing."""
    if incident == "none":
        return SILENT
    return signature(incident).get(alert)
