"""The plate's workshop in PyTorch, watched by runwatch.watch: the lab's trainer, redone in torch.

The same softmax regression (20 features, 10 classes, SGD at 0.1, float64), the same data and
the same incidents from the onset (lr_spike, corrupt_shard, repeated_batch, slow_node; over two
ranks, straggler): every batch, held-out set and step time comes from the lab's own trainer
(runwatch.trainer.run), only the model, its gradients and their exchange are torch's. Paced like
the lab, one step a lab second, so that the lab's rules mean what they mean for its own run.

    python examples/torch_workshop.py --incident corrupt_shard --fast-forward 270 --port 8000 &
    runwatch up --watch 127.0.0.1:8000

Over two ranks (DistributedDataParallel over gloo), rank r serving on --port + r:

    python examples/torch_workshop.py --ranks 2 --incident straggler --fast-forward 270 --port 8000 &
    runwatch up --watch 127.0.0.1:8000,127.0.0.1:8001

or under torchrun (`torchrun --standalone --nproc-per-node 2 examples/torch_workshop.py ...`),
which sets RANK, WORLD_SIZE and the rendezvous itself. `--fast-forward N` trains the first N
steps unpaced and unpublished, as `runwatch up --fast-forward` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import time
from datetime import UTC, datetime

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)

from runwatch.trainer import model
from runwatch.trainer.config import INCIDENTS, ConfigError, TrainConfig
from runwatch.trainer.run import compute_seconds, get_batch, heldout_set, learning_rate
from runwatch.watch import Watch, ddp_comm_hook

SCRAPE_PHASE = 0.5  # steps end half a scrape interval after a scrape, as the lab's (trainer.live)
PHASE_SCRAPES = 3  # scrapes seen before the first live step: Prometheus is there, baselines fill
SCRAPE_WAIT_S = 60.0  # a Prometheus that has not scraped within a minute is not coming


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--incident", default="none", choices=(*INCIDENTS, "straggler"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--onset", type=int, default=300)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--fast-forward", type=int, default=0, metavar="STEP")
    p.add_argument("--ranks", type=int, default=None, help="spawn this many gloo ranks (default: torchrun's, or 1)")
    p.add_argument("--port", type=int, default=8000, help="rank r serves /metrics on PORT + r")
    p.add_argument("--run-id", default=None, help="default: torch-<incident>-<seed>-<HHMMSS>")
    p.add_argument("--step-seconds", type=float, default=1.0, help="nominal step: 1 lab second")
    return p.parse_args(argv)


def config(args: argparse.Namespace, ranks: int) -> TrainConfig:
    run_id = args.run_id or f"torch-{args.incident}-{args.seed}-{datetime.now(UTC):%H%M%S}"
    cfg = TrainConfig(incident=args.incident, seed=args.seed, onset=args.onset, steps=args.steps, ranks=ranks,
                      step_seconds=args.step_seconds, run_id=run_id)  # fmt: skip
    try:
        cfg.validate()
    except ConfigError as err:
        sys.exit(f"torch_workshop: --{err.field.replace('_', '-')}: {err.problem}")
    if not 0 <= args.fast_forward < cfg.steps:
        sys.exit(f"torch_workshop: --fast-forward: must be in [0, {cfg.steps}), got {args.fast_forward}")
    return cfg


def wait_for_scrapes(watch: Watch) -> float:
    """When (perf_counter) the lab clock starts: SCRAPE_PHASE after a scrape, once Prometheus has
    scraped PHASE_SCRAPES times (steps it never saw would be missing from every baseline)."""
    seen, deadline = watch.scrapes, time.perf_counter() + SCRAPE_WAIT_S
    while watch.scrapes < seen + PHASE_SCRAPES:
        if time.perf_counter() > deadline:
            who = f"nothing scraped {watch.run_id} in {SCRAPE_WAIT_S:g} s"
            sys.exit(f"torch_workshop: {who}: is `runwatch up --watch` on?")
        time.sleep(0.005)
    return watch.last_scrape + SCRAPE_PHASE


def train(rank: int, args: argparse.Namespace, cfg: TrainConfig) -> None:
    """One rank's run (rank 0 of 1 in one process)."""
    torch.set_num_threads(1)
    distributed = cfg.ranks > 1
    node = f"node{rank // cfg.ranks_per_node}"
    watch = Watch(cfg.label, rank=rank, world_size=cfg.ranks, local_rank=rank, node=node)
    port = watch.serve(args.port)  # PORT + local rank
    print(f"rank {rank}: serving http://127.0.0.1:{port}/metrics for run {cfg.label}", flush=True)
    # --- the model: the lab's softmax regression, zero-initialised, in float64 ---
    net = torch.nn.Linear(cfg.features, cfg.classes, dtype=torch.float64)
    torch.nn.init.zeros_(net.weight)
    torch.nn.init.zeros_(net.bias)
    trained = net
    if distributed:
        trained = torch.nn.parallel.DistributedDataParallel(net)
        trained.register_comm_hook(*ddp_comm_hook(watch))
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr)
    means = model.class_means(cfg)
    hx, hy = (torch.from_numpy(a) for a in heldout_set(cfg, means))
    compute = compute_seconds(cfg)[rank]  # this rank's device time, step by step (slow node, straggler)
    share = slice(rank * cfg.batch_size // cfg.ranks, (rank + 1) * cfg.batch_size // cfg.ranks)
    tokens = cfg.batch_size * cfg.tokens_per_example

    def one_step(s: int, paced_from: float | None) -> tuple[float, float]:
        # --- batch: the lab's, incident included; this rank's share of it ---
        x, y = (torch.from_numpy(a) for a in get_batch(cfg, means, s))
        for group in opt.param_groups:
            group["lr"] = learning_rate(cfg, s)
        # --- held-out evaluation, on the weights this step's loss is computed on ---
        if rank == 0 and s % cfg.heldout_every == 0:
            with torch.no_grad():
                watch.heldout(F.cross_entropy(net(hx), hy).item())
        # --- forward, the device's time, backward (DDP's exchange), update ---
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(trained(x[share]), y[share])
        if paced_from is not None:
            _sleep_until(paced_from + float(compute[s]))
        loss.backward()
        grad_norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in net.parameters())).item()
        if rank == 0 and distributed:  # the batch's loss, as one process has it (every rank drew the batch)
            with torch.no_grad():
                batch_loss = F.cross_entropy(net(x), y).item()
        else:
            batch_loss = loss.item()
        opt.step()
        return batch_loss, grad_norm

    # --- fast-forward: unpaced, unpublished ---
    for s in range(args.fast_forward):
        one_step(s, None)
    # --- live: one step a lab second ---
    start = wait_for_scrapes(watch)
    if distributed:
        dist.barrier()
    deadline = max(start, time.perf_counter())
    for s in range(args.fast_forward, cfg.steps):
        watch.begin()
        begun = time.perf_counter()
        if distributed:  # the exchange paces the ranks: each computes its own time, then waits for the others
            batch_loss, grad_norm = one_step(s, begun)
        else:  # one process keeps the lab clock by deadlines: no drift from the bookkeeping between steps
            deadline += float(compute[s])
            batch_loss, grad_norm = one_step(s, None)
            _sleep_until(deadline)
        watch.step(s, batch_loss, tokens=tokens, gradient_norm=grad_norm, learning_rate=learning_rate(cfg, s))
        if rank == 0 and s % 10 == 0:
            print(f"step {s:4d} | loss {batch_loss:8.4f} | grad_norm {grad_norm:8.4f}", flush=True)
    watch.finish()
    time.sleep(2 * 1.0)  # two scrapes see the end, so alerts resolve and the step is read


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


def _rank(rank: int, args: argparse.Namespace, cfg: TrainConfig, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=cfg.ranks)
    try:
        train(rank, args, cfg)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: it has started the ranks
        cfg = config(args, int(os.environ["WORLD_SIZE"]))
        if cfg.ranks > 1 and not args.run_id and not os.environ.get("RUNWATCH_RUN_ID"):
            cfg = dataclasses.replace(cfg, run_id=f"torch-{args.incident}-{os.environ['TORCHELASTIC_RUN_ID'][:8]}")
        _rank(int(os.environ["RANK"]), args, cfg, "env://") if cfg.ranks > 1 else train(0, args, cfg)
        return
    cfg = config(args, args.ranks or 1)
    if cfg.ranks == 1:
        train(0, args, cfg)
        return
    with socket.socket() as s:  # a free port for the rendezvous on loopback
        s.bind(("127.0.0.1", 0))
        init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    mp.spawn(_rank, args=(args, cfg, init), nprocs=cfg.ranks, join=True)


if __name__ == "__main__":
    main()
