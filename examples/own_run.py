"""A training loop of your own, watched by runwatch.watch: the recipe of docs/watch.md.

A small torch MLP on random data, paced to about `--step-ms` a step, publishing one report a
second (`begin()` every step, `step(..., steps=k)` every k steps: the mean loss, all the tokens,
the k gradient norms) and `finish()` at its end. Under `--ranks N` it is N gloo ranks of
DistributedDataParallel with a BatchNorm layer (a buffer: DDP's default broadcast_buffers=True
broadcasts it at each forward), timed by `watch_ddp`. The flags that make it misbehave are the
tests' (tests/test_watch_own_run_torch.py), each something a real job does:

    python examples/own_run.py --port 8000 --seconds 120                 # a clean run, then finish()
    python examples/own_run.py --port 8000 --spike-at 40,80              # two gradient spikes
    python examples/own_run.py --port 8000 --swings --slow-at 120        # a shared host, then a slow one
    python examples/own_run.py --port 8000 --ranks 2 --straggler 1       # rank 1 late to every step
    runwatch up --watch 127.0.0.1:8000                                    # (8000,8001 for two ranks)
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)

from runwatch.watch import Watch, watch_ddp

FEATURES, HIDDEN, BATCH = 64, 256, 128  # tokens per step: BATCH x FEATURES


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True, help="rank r serves on PORT + r")
    p.add_argument("--run-id", default=None, help="the run's id (default: the script's name and start)")
    p.add_argument("--seconds", type=float, default=120.0, help="train this long, then finish()")
    p.add_argument("--step-ms", type=float, default=50.0, help="pace each step to about this long")
    p.add_argument("--spike-at", default="", help="seconds (comma-separated) at which one step's gradient is x1000")
    p.add_argument("--swings", action="store_true", help="steps 3x slower for 2-4 s every 8-12 s, as a shared host")
    p.add_argument("--slow-at", type=float, default=None, help="from this second on, every step takes twice as long")
    p.add_argument("--ranks", type=int, default=1, help="train over this many gloo ranks (DDP)")
    p.add_argument("--straggler", type=int, default=None, help="this rank sleeps --straggler-ms before each forward")
    p.add_argument("--straggler-ms", type=float, default=35.0)
    return p.parse_args(argv)


def pace(args: argparse.Namespace, t: float, swings: list[tuple[float, float]]) -> float:
    """How long the step starting t seconds into the run should last."""
    seconds = args.step_ms / 1000
    if any(a <= t < b for a, b in swings):
        seconds *= 3
    if args.slow_at is not None and t >= args.slow_at:
        seconds *= 2
    return seconds


def swing_times(args: argparse.Namespace) -> list[tuple[float, float]]:
    """The seconds a busy neighbour slows the job: 2-4 s every 8-12 s, the same each run."""
    rng, found, t = random.Random(0), [], 5.0
    while args.swings and t < args.seconds:
        length = rng.uniform(2, 4)
        found.append((t, t + length))
        t += length + rng.uniform(6, 8)
    return found


def train(rank: int, args: argparse.Namespace) -> None:
    torch.manual_seed(rank)
    distributed = args.ranks > 1
    w = Watch(args.run_id, rank=rank, world_size=args.ranks, local_rank=rank)
    w.serve(args.port)
    layers = [torch.nn.Linear(FEATURES, HIDDEN), torch.nn.BatchNorm1d(HIDDEN), torch.nn.ReLU(),
              torch.nn.Linear(HIDDEN, 1)]  # fmt: skip
    net = model = torch.nn.Sequential(*layers)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(net)  # broadcast_buffers=True, DDP's default
        watch_ddp(w, model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    k = max(1, round(1000 / args.step_ms))  # steps per report: about one a second
    spikes = sorted(float(s) for s in args.spike_at.split(",") if s)
    swings, start = swing_times(args), time.perf_counter()
    losses, norms, step = [], [], 0
    while (t := time.perf_counter() - start) < args.seconds:
        # --- the step: begin, this rank's data, forward, backward (DDP's exchange), update ---
        w.begin()
        device_s = pace(args, t, swings)  # the accelerator's time, slept (a CPU has none to spare)
        deadline = time.perf_counter() + device_s
        if rank == args.straggler:
            time.sleep(args.straggler_ms / 1000)  # late to every step: a slow loader, a slow host
        x = torch.randn(BATCH, FEATURES)
        loss = F.mse_loss(model(x).squeeze(-1), x.sum(dim=1) / 8)
        if spikes and t >= spikes[0]:  # one step whose gradient explodes
            spikes.pop(0)
            loss = loss * 1000
        opt.zero_grad(set_to_none=True)
        if distributed:  # each rank's own device time, before the exchange that paces them all
            time.sleep(device_s)
        loss.backward()
        norms.append(torch.sqrt(sum((p.grad * p.grad).sum() for p in net.parameters())).item())
        opt.step()
        losses.append(loss.item())
        step += 1
        if not distributed:  # the ranks are paced by the slowest of them
            time.sleep(max(0.0, deadline - time.perf_counter()))
        # --- a report every k steps ---
        if step % k == 0:
            w.step(step, sum(losses) / len(losses), tokens=k * BATCH * FEATURES, gradient_norm=norms, steps=k)
            losses, norms = [], []
    w.finish()  # waits for the scrape that sees the end: exiting now pages nothing


def _rank(rank: int, args: argparse.Namespace, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks)
    try:
        train(rank, args)
    finally:
        dist.destroy_process_group()  # without it gloo's threads can abort the exit


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)
    if args.ranks == 1:
        train(0, args)
        return
    if not args.run_id:
        args.run_id = os.environ.get("RUNWATCH_RUN_ID") or f"own-run-{time.strftime('%H%M%S')}"
    with socket.socket() as s:  # a free port for the rendezvous on loopback
        s.bind(("127.0.0.1", 0))
        init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    mp.spawn(_rank, args=(args, init), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
