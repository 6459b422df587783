"""What handing a record's host half to the monitor's thread costs, and what it saves, by batch size.

A watched call does its device half on the training thread and hands the rest of the
record (groups, exemplars, summaries, the record, its JSONL line) to the monitor's own
thread (``advmon/host_half.py``). The two threads share the GIL: while the host half
runs, every op of the training thread that releases the GIL (each torch op does) hands
it over, and takes it back later. Here a loop of GRPO-shaped calls (binary rewards in
groups of 8, a ``[B, T]`` mask, the estimator itself free) runs with the hand-over (the
default) and with ``finish_on_caller=True``, where the record is made on the calling thread, the
two interleaved; per record, medians of ``--repeat`` rounds:

* ``process CPU``: the whole process's CPU time (both threads);
* ``training thread CPU``: the calling thread's own;
* ``wall``: the loop's time per record, until ``monitor.wait()`` returns.

A loop that does nothing between calls is the hand-over's worst case: a trainer whose
steps wait on a GPU, or on Ray, leaves the host half the GIL for free.

Usage: python benchmarks/bench_handover.py [--records N] [--repeat K]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import advmon

SIZES = ((128, 16), (1024, 256), (4096, 1024))
GROUP = 8


class Discard:
    """A synchronous sink that keeps nothing (the JSONL line's cost is not what is measured)."""

    name = "discard"
    synchronous = True

    def write(self, record) -> None:  # noqa: D102
        pass


def inputs(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    prompts = torch.arange(rows) // GROUP
    rewards = (torch.rand(rows, generator=generator) < 0.5).float()
    lengths = torch.randint(2, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    advantages = torch.randn(rows, width, generator=generator) * mask
    return prompts, rewards, mask, advantages


def per_record(rows: int, width: int, records: int, on_caller: bool) -> tuple[float, float, float]:
    prompts, rewards, mask, advantages = inputs(rows, width)
    monitor = advmon.Monitor(f"handover-{rows}x{width}", sinks=[Discard()], finish_on_caller=on_caller)

    @monitor.watch
    def compute_advantage(prompt_ids, rewards, mask):
        return advantages

    for step in range(5):  # warm: the host half's thread, the first record's one-time work
        with monitor.step(step):
            compute_advantage(prompts, rewards, mask)
    monitor.wait()
    process, thread, wall = time.process_time(), time.thread_time(), time.perf_counter()
    for step in range(5, 5 + records):
        with monitor.step(step):
            compute_advantage(prompts, rewards, mask)
    monitor.wait()
    figures = ((time.process_time() - process) / records, (time.thread_time() - thread) / records,
               (time.perf_counter() - wall) / records)
    monitor.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400, help="records per round at the smallest size")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'size':>11} {'path':>12} {'process CPU':>12} {'training thread CPU':>20} {'wall':>10}  (per record)")
    for rows, width in SIZES:
        records = max(20, args.records * 2048 // (rows * width))
        rounds = {False: [], True: []}
        for _ in range(args.repeat):
            for on_caller in (False, True):
                rounds[on_caller].append(per_record(rows, width, records, on_caller))
        for on_caller in (False, True):
            medians = [statistics.median(r[i] for r in rounds[on_caller]) * 1e3 for i in range(3)]
            path = "on caller" if on_caller else "hand-over"
            print(f"{rows:>6}x{width:<4} {path:>12} {medians[0]:>9.2f} ms {medians[1]:>17.2f} ms {medians[2]:>7.2f} ms")


if __name__ == "__main__":
    main()
