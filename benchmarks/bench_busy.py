"""advmon on a busy machine: its added time per watched call, and the trainer's own ops.

A trainer rarely has the machine to itself: data loaders, reward workers and other
jobs keep the cores busy. Here neighbour processes do that, in five settings:

* ``quiet``: nothing else runs;
* ``1 spin`` / ``2 spin``: one or two processes spinning in Python (a core each);
* ``1 torch`` / ``2 torch``: one or two processes running their own 2-thread torch
  work (a data loader or a reward model), so OpenMP teams compete for the cores.

In each, interleaved in one run: a dense per-token estimator (B=512, T=1024) called
bare and watched (advmon's statistics, no sink), and a trainer op of its own (a
matmul and a few elementwise ops) timed between calls, once beside bare calls and
once beside watched calls. Reported: advmon's added time per call and
its ratio to the quiet figure (goal <= 3x), and the trainer op's time beside advmon
over beside the bare estimator (goal <= 1.10), as a ratio of medians and as the
median of back-to-back pairs (steadier when neighbours make every time swing).
The added time is likewise the median of back-to-back differences (a watched call
minus the bare call just before it): beside two torch neighbours the bare
estimator's own median swings several-fold between runs, and a difference of
medians can then even come out negative.

The five settings run twice: with advmon's statistics on one intra-op thread (its
default, see ``advmon.stats.statistics_threads``) and, for comparison, on the
caller's thread count. The watched calls of 200-330 ms once seen come from the
second beside torch neighbours, where every parallel region waits for a
descheduled thread. Then more OpenMP threads than cores
(``torch.set_num_threads(4)`` on 2 cores with two 2-thread neighbours): the row
``advmon`` shows what a user sees there, ``(multi-threaded stats)`` what it would
be otherwise.

Last, why the trainer's own op can be slower right after a watched call when two
spinning neighbours hold both cores: the same op timed after 2-thread torch work,
after the same work on one thread (what advmon's statistics do), and after 10 ms
of doing nothing.

Usage: python benchmarks/bench_busy.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

import torch

import advmon
import advmon.stats as stats

B, T = 512, 1024
SPIN = "while True: pass"
TORCH_WORK = (
    "import torch\n"
    "torch.set_num_threads(2)\n"
    "a = torch.randn(384, 384)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a * 0.01)\n"
)


@contextmanager
def neighbours(kind: str, count: int):
    code = SPIN if kind == "spin" else TORCH_WORK
    processes = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    time.sleep(1.5 if processes else 0)  # let them start (torch import) and settle
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()


def estimator(prompt_ids, rewards, mask):
    """Reinforce++-like: a dense per-token advantage with a KL-ish term."""
    return rewards[:, None] * mask - 0.01 * torch.cumsum(mask, dim=1) / T


def trainer_op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w).mul_(0.5).add_(x[:, : w.shape[1]])


def measure(calls: int, monitor: advmon.Monitor) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    mask = (torch.arange(T) < torch.randint(1, T + 1, (B, 1), generator=g)).float()
    ids = torch.arange(B) // 8
    x, w = torch.randn(512, 1024, generator=g), torch.randn(1024, 512, generator=g)
    watched = monitor.watch(estimator)
    times: dict[str, list[float]] = {"bare": [], "watched": [], "op_bare": [], "op_watched": []}
    for fn in (estimator, watched):
        fn(ids, rewards, mask)
    for _ in range(calls):
        for name, fn in (("bare", estimator), ("watched", watched)):
            start = time.perf_counter()
            fn(ids, rewards, mask)
            times[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            trainer_op(x, w)
            times[f"op_{name}"].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    # The trainer op after a watched call over the same op after the bare call just
    # before it: pairs see the same machine, so their median is steadier than a
    # ratio of medians when neighbours make every time swing.
    medians["op_paired"] = statistics.median(w / b for b, w in zip(times["op_bare"], times["op_watched"]))
    medians["added"] = statistics.median(w - b for b, w in zip(times["bare"], times["watched"]))
    return medians


def share_floor(kind: str, count: int) -> float:
    """The least slowdown fair scheduling allows one CPU-bound thread beside the neighbours.

    Busy threads: the caller's (advmon's statistics run on it, one intra-op thread)
    and each neighbour's (one spinning, or two torch threads). With more of them
    than cores, each gets ``cores / busy`` of a core.
    """
    busy = 1 + count * (1 if kind == "spin" else 2)
    return max(1.0, busy / (os.cpu_count() or 1))


def pause_probe(repeats: int) -> list[str]:
    """The trainer op after three kinds of pause, with two spinning neighbours."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(512, 1024, generator=g), torch.randn(1024, 512, generator=g)
    m = torch.rand(512, 1024, generator=g)
    threads = torch.get_num_threads()

    def work() -> None:
        for _ in range(60):
            (m * 2).sum()

    def one_thread_work() -> None:
        torch.set_num_threads(1)
        work()
        torch.set_num_threads(threads)

    pauses = {"2-thread work": work, "1-thread work": one_thread_work, "10 ms idle": lambda: time.sleep(0.01)}
    times: dict[str, list[float]] = {name: [] for name in pauses}
    with neighbours("spin", 2):
        for _ in range(repeats):
            for name, pause in pauses.items():
                pause()
                start = time.perf_counter()
                trainer_op(x, w)
                times[name].append(time.perf_counter() - start)
    return ["trainer op right after a pause, two spinning neighbours (medians):",
            *[f"  after {name:14} {statistics.median(values) * 1e3:7.2f} ms" for name, values in times.items()]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(f"bench_busy: torch {torch.__version__}, {os.cpu_count()} cores, {threads} intra-op threads, "
          f"B={B} T={T}, medians of {args.calls} interleaved calls")
    monitor = advmon.Monitor("bench-busy", sinks=[advmon.JsonlSink(os.devnull)])
    for policy, title in ((1, "advmon (statistics on 1 intra-op thread)"),
                          (None, "for comparison: statistics on the caller's thread count")):
        stats.STATISTICS_THREADS = policy
        print(title)
        print(f"  {'setting':10} {'bare':>9} {'watched':>9} {'added':>9} {'vs quiet':>9} {'share floor':>12} "
              f"{'trainer op':>11} {'beside advmon':>14} {'paired':>7}")
        quiet_added = None
        for label, kind, count in (("quiet", "spin", 0), ("1 spin", "spin", 1), ("2 spin", "spin", 2),
                                   ("1 torch", "torch", 1), ("2 torch", "torch", 2)):
            with neighbours(kind, count):
                m = measure(args.calls, monitor)
            added = m["added"]
            quiet_added = added if quiet_added is None else quiet_added
            print(f"  {label:10} {m['bare'] * 1e3:7.2f}ms {m['watched'] * 1e3:7.2f}ms {added * 1e3:7.2f}ms "
                  f"{added / quiet_added:8.2f}x {share_floor(kind, count):11.2f}x "
                  f"{m['op_bare'] * 1e3:9.2f}ms {m['op_watched'] / m['op_bare']:13.2f}x {m['op_paired']:6.2f}x")
    stats.STATISTICS_THREADS = 1
    print("  goals: added <= 3x quiet; trainer op beside advmon <= 1.10x")
    print("  share floor: the slowdown of one busy thread under fair scheduling, (busy threads) / cores")
    print(f"oversubscribed: torch.set_num_threads({2 * (os.cpu_count() or 2)}) with two 2-thread torch neighbours")
    torch.set_num_threads(2 * (os.cpu_count() or 2))
    with neighbours("torch", 2):
        single = measure(args.calls // 2, monitor)
        stats.STATISTICS_THREADS = None  # the caller's own thread count
        try:
            multi = measure(args.calls // 2, monitor)
        finally:
            stats.STATISTICS_THREADS = 1
    torch.set_num_threads(threads)
    for label, m in (("advmon", single), ("(multi-threaded stats)", multi)):
        print(f"  {label:24} added {m['added'] * 1e3:8.2f} ms per call "
              f"(bare estimator {m['bare'] * 1e3:.2f} ms)")
    monitor.close()
    print("\n".join(pause_probe(2 * args.calls)))


if __name__ == "__main__":
    main()
