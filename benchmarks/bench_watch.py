"""The cost of runwatch.watch per training step, against a 1 ms CPU step of real torch.

    python benchmarks/bench_watch.py [--pairs 20000]

The step: forward, backward and SGD update of a small MLP on one thread, its width chosen so that
a step takes about 1 ms here. Steps run side by side, bare and watched in turn (so a loaded
machine slows both alike); watched adds what a user adds: `w.begin()`, the loss's `.item()` and
`w.step(...)` with tokens, gradient norm and learning rate, while another thread scrapes the
registry once a second as Prometheus would. The figure is the difference of the two arms'
median step times over the bare median. It also times the client's calls alone, per step.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
from prometheus_client import CollectorRegistry, generate_latest

from runwatch.watch import Watch


def model_of(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    return net, torch.optim.SGD(net.parameters(), lr=0.01), torch.randn(64, 64), torch.randint(0, 10, (64,))


def step(net, opt, x, y) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    return loss


def calibrate(target_s: float = 0.001) -> int:
    """The MLP width whose step takes about target_s here."""
    for width in (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048):
        net, opt, x, y = model_of(width)
        for _ in range(20):
            step(net, opt, x, y)
        times = []
        for _ in range(100):
            t0 = time.perf_counter()
            step(net, opt, x, y)
            times.append(time.perf_counter() - t0)
        if statistics.median(times) >= target_s:
            return width
    return width


def paired(net, opt, x, y, pairs: int, watch: Watch) -> tuple[list[float], list[float]]:
    """Each step's duration, bare and watched in turn (the order alternating), so that both
    arms see the same machine: the medians are robust to what else runs on it."""
    bare, watched, clock = [], [], time.perf_counter
    for s in range(pairs):
        for arm in (0, 1) if s % 2 else (1, 0):
            t0 = clock()
            if arm:
                watch.begin()
                loss = step(net, opt, x, y)
                watch.step(s, loss.item(), tokens=4096, gradient_norm=1.0, learning_rate=0.01)
                watched.append(clock() - t0)
            else:
                step(net, opt, x, y)
                bare.append(clock() - t0)
    return bare, watched


def scraper(registry: CollectorRegistry, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        generate_latest(registry)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=20_000)
    p.add_argument("--width", type=int, default=None, help="the MLP's width (default: a 1 ms step here)")
    args = p.parse_args()
    torch.set_num_threads(1)
    width = args.width or calibrate()
    net, opt, x, y = model_of(width)
    w = Watch("bench", rank=0, world_size=2, registry=CollectorRegistry(), env={})  # rank series too
    stop = threading.Event()
    threading.Thread(target=scraper, args=(w.registry, stop), daemon=True).start()
    paired(net, opt, x, y, 500, w)  # warm-up
    bare, watched = paired(net, opt, x, y, args.pairs, w)
    stop.set()
    # the client's calls alone, on a finished loss tensor
    loss = step(net, opt, x, y)
    n = 200_000
    t0 = time.perf_counter()
    for s in range(n):
        w.begin()
        w.step(s, loss.item(), tokens=4096, gradient_norm=1.0, learning_rate=0.01)
    calls = (time.perf_counter() - t0) / n
    step_s, watched_s = statistics.median(bare), statistics.median(watched)
    print(f"step: MLP 64-{width}-10, batch 64, 1 thread, torch {torch.__version__}: {step_s * 1e3:.3f} ms median")
    print(f"{args.pairs} steps bare and {args.pairs} watched, in alternation, scraped every second:")
    print(f"  watched {watched_s * 1e3:.4f} ms, bare {step_s * 1e3:.4f} ms median: "
          f"{(watched_s - step_s) / step_s * 100:+.2f}% per step")  # fmt: skip
    print(f"the client's calls alone (begin, loss.item(), step), {n} times: {calls * 1e6:.2f} us per step, "
          f"{calls / step_s * 100:.2f}% of the step")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
