"""The cost of runwatch.watch per training step, against a 1 ms CPU step of real torch.

    python benchmarks/bench_watch.py [--pairs 1000] [--block 10] [--width N]

The step: forward, backward and SGD update of a small MLP on one thread, its width chosen so that
a step takes about 1 ms of CPU here. Every time is the thread's CPU time (time.thread_time), not
the wall clock: what other processes take of a shared machine is left out, what the client costs
the training thread is not. Steps run side by side, bare and watched in turn (so a loaded
machine slows both alike); watched adds what a user adds: `w.begin()`, the loss's `.item()` and
`w.step(...)` with tokens, gradient norm and learning rate, while another thread scrapes the
registry once a second as Prometheus would; bare makes the same calls to a client that does
nothing (`Bare`). The figure is the median over pairs of blocks of (watched - bare) / bare,
beside the same median of bare against itself (what the machine's noise gives). It also times
the client's calls alone, per step, and a scrape.
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
    """The MLP width whose step takes closest to target_s of CPU here."""
    medians = {}
    for width in (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048):
        net, opt, x, y = model_of(width)
        for _ in range(20):
            step(net, opt, x, y)
        medians[width] = bare_step(net, opt, x, y, 200)
        if medians[width] >= 2 * target_s:
            break
    return min(medians, key=lambda w: abs(medians[w] - target_s))


def bare_step(net, opt, x, y, n: int = 2000) -> float:
    """The median CPU time of one bare step."""
    times = []
    for _ in range(n):
        t0 = time.thread_time()
        step(net, opt, x, y)
        times.append(time.thread_time() - t0)
    return statistics.median(times)


class Bare:
    """The control arm's client: the same calls, doing nothing. Both arms then run one loop, call
    for call (a bare loop of another shape measured 1.9% slower than itself here, run against
    this no-op client: the loop's shape, not the client)."""

    def begin(self) -> None:
        pass

    def step(self, *args: object, **kwargs: object) -> None:
        pass


def paired(net, opt, x, y, pairs: int, block: int, watch: Watch) -> list[float]:
    """(watched - bare) / bare of each pair of blocks of `block` steps, bare and watched in turn
    (the order alternating): a pair's two blocks run within milliseconds of each other, so what
    else runs on the machine slows both alike, and the median over pairs is robust to it."""
    ratios, clock, bare = [], time.thread_time, Bare()
    for p in range(pairs):
        took = [0.0, 0.0]
        for arm in (0, 1) if p % 2 else (1, 0):
            client = watch if arm else bare
            t0 = clock()
            for s in range(block):
                client.begin()
                loss = step(net, opt, x, y)
                client.step(s, loss.item(), tokens=4096, gradient_norm=1.0, learning_rate=0.01)
            took[arm] = clock() - t0
        ratios.append((took[1] - took[0]) / took[0])
    return ratios


def scraper(registry: CollectorRegistry, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        generate_latest(registry)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument("--block", type=int, default=10, help="steps in each block of a pair")
    p.add_argument("--width", type=int, default=None, help="the MLP's width (default: a 1 ms step here)")
    args = p.parse_args()
    torch.set_num_threads(1)
    width = args.width or calibrate()
    net, opt, x, y = model_of(width)
    w = Watch("bench", rank=0, world_size=2, registry=CollectorRegistry(), env={})  # rank series too
    stop = threading.Event()
    threading.Thread(target=scraper, args=(w.registry, stop), daemon=True).start()
    paired(net, opt, x, y, 20, args.block, w)  # warm-up
    ratios = paired(net, opt, x, y, args.pairs, args.block, w)
    floor = paired(net, opt, x, y, args.pairs, args.block, Bare())  # A/A: bare against itself, the noise
    stop.set()
    # the client's calls alone, on a finished loss tensor
    loss = step(net, opt, x, y)
    n = 200_000
    t0 = time.thread_time()
    for s in range(n):
        w.begin()
        w.step(s, loss.item(), tokens=4096, gradient_norm=1.0, learning_rate=0.01)
    calls = (time.thread_time() - t0) / n
    t0 = time.thread_time()
    for _ in range(1000):
        generate_latest(w.registry)
    scrape = (time.thread_time() - t0) / 1000
    step_s = bare_step(net, opt, x, y)
    q = statistics.quantiles(ratios, n=4)
    print(f"step: MLP 64-{width}-10, batch 64, 1 thread, torch {torch.__version__}: {step_s * 1e3:.3f} ms median")
    print(f"{args.pairs} pairs of {args.block}-step blocks, bare and watched in turn, scraped every second:")
    print(f"  watched over bare: {statistics.median(ratios) * 100:+.2f}% per step, median "
          f"(quartiles {q[0] * 100:+.2f}%, {q[2] * 100:+.2f}%)")  # fmt: skip
    print(f"  bare over bare, the same way (the noise floor): {statistics.median(floor) * 100:+.2f}%")
    print(f"the client's calls alone (begin, loss.item(), step), {n} times: {calls * 1e6:.2f} us per step, "
          f"{calls / step_s * 100:.2f}% of the step")  # fmt: skip
    print(f"a scrape (once a second, on the server's thread): {scrape * 1e6:.0f} us, "
          f"{scrape * 100:.3f}% of each second")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
