"""A cluster run's Prometheus targets, as file_sd groups: every rank labelled with its run, rank
and node, so that `up` names the rank that stops answering (RankDown). The native lab writes them
into its state directory; in compose the launcher writes them into a volume Prometheus reads.
"""

from __future__ import annotations

from runwatch.core.names import LOOPBACK
from runwatch.trainer.config import TrainConfig


def rank_targets(run_id: str, ranks: int, rank_port_base: int, host: str = LOOPBACK) -> list[dict]:
    """Prometheus's file_sd groups for the ranks: one target each, labelled run_id, rank and node,
    so that `up` names the rank that stops answering (RankDown)."""
    from runwatch.trainer.gpu import node_of  # numpy, which only a cluster run's start needs

    cfg = TrainConfig(ranks=ranks)
    return [
        {
            "targets": [f"{host}:{rank_port_base + r}"],
            "labels": {"run_id": run_id, "rank": str(r), "node": node_of(cfg, r)},
        }
        for r in range(ranks)
    ]
