"""The simulated GPU under each rank: what NVIDIA's DCGM exporter would report for it.

Every rank has one GPU, `gpu` (its index on its node) on host `node<rank // ranks_per_node>`.
A healthy GPU runs at its boost clock, warm; a straggler's overheats and throttles its SM clock
to `straggler_clock` of nominal from the onset, which is why its rank computes slower
(trainer.run.compute_seconds). Readings carry a little noise, drawn from (seed, rank, step), so a
run repeats exactly.

    >>> gpu_state(TrainConfig(ranks=4, incident="straggler"), rank=1, step=320).sm_clock_mhz
    1386.0
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import struck_rank

# An H100 SXM: 1980 MHz boost clock, 80 GB of memory, 700 W board power.
NOMINAL_SM_MHZ = 1980.0
HEALTHY_TEMP_C, THROTTLED_TEMP_C = 62.0, 88.0  # throttling starts in the high 80s
LOAD_POWER_W = 560.0  # at the nominal clock
FB_USED_MIB = 61_440.0  # weights, activations and optimizer state: 60 GiB of 80
_STREAM = 5  # trainer.run's random streams are 0-4


@dataclass(frozen=True)
class GpuState:
    temp_c: float
    sm_clock_mhz: float
    power_w: float
    fb_used_mib: float
    xid: int  # the last XID error; 0 for none


def node_of(cfg: TrainConfig, rank: int) -> str:
    return f"node{rank // cfg.ranks_per_node}"


def gpu_index(cfg: TrainConfig, rank: int) -> int:
    return rank % cfg.ranks_per_node


def gpu_uuid(cfg: TrainConfig, rank: int) -> str:
    """A stable UUID for the rank's GPU, in nvidia-smi's form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node_of(cfg, rank)}.gpu{gpu_index(cfg, rank)}.runwatch')}"


def throttled(cfg: TrainConfig, rank: int, step: int) -> bool:
    return cfg.incident == "straggler" and rank == struck_rank(cfg) and step >= cfg.onset


def gpu_state(cfg: TrainConfig, rank: int, step: int, xid: int = 0) -> GpuState:
    """The rank's GPU as it finishes this step, with the last XID it reported (trainer.faults)."""
    noise = np.random.default_rng([cfg.seed, _STREAM, rank, step]).normal(size=2)
    hot = throttled(cfg, rank, step)
    clock = NOMINAL_SM_MHZ * (cfg.clock_factor if hot else 1.0)
    temp = (THROTTLED_TEMP_C if hot else HEALTHY_TEMP_C) + float(noise[0])
    power = LOAD_POWER_W * clock / NOMINAL_SM_MHZ + 5.0 * float(noise[1])
    return GpuState(round(temp, 1), clock, round(power, 1), FB_USED_MIB, xid)
