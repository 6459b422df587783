"""What a GPU would launch per call, counted on any machine, and the host's own share of a call.

1. Ops per call on each device path (pure torch; Triton, whose kernels are counted
   as launches), run on CPU tensors: every dispatched torch op that is not a view
   or metadata is a kernel launch on a GPU (``tests/dispatch.py``). Counted after
   a first call (Triton compiles then; the row hash makes its column weights once
   per shape). Without a GPU, Triton runs in its interpreter (set here).
2. The host's share, which a GPU cannot take: the exact statistics of B=4096
   unweighted (rewards, pre_norm) and weighted (expand view) values in NumPy, one
   record's packing and assembly, and a whole observed call on 64 samples, where
   the tensors cost next to nothing: what it costs the training thread (the
   record is finished on the monitor's own thread) and what it costs with that
   host half. Medians, one intra-op thread.

Usage: python benchmarks/bench_device_ops.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

import advmon  # noqa: E402
import advmon.stats.triton_rows  # noqa: E402
import advmon.stats.triton_sketch  # noqa: E402
from advmon import assembly  # noqa: E402
from advmon.stats import summaries  # noqa: E402
from advmon.stats import statistics_path  # noqa: E402
from advmon.observation import observe_call, tensor_part  # noqa: E402
from tests.dispatch import Dispatched  # noqa: E402
from tests.test_device_paths import grpo_inputs  # noqa: E402

LAUNCHES = {"triton_part": 4, "triton_row_hashes": 1, "triton_row_counts": 1}
# The interpreter computes masked-out lanes too (inf - inf) with NumPy.
warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")


class TritonLaunches:
    """Counts the Triton kernels advmon launches, and hides the interpreter's own torch ops from the count."""

    def __init__(self) -> None:
        self.launched = 0
        for module in (advmon.stats.triton_sketch, advmon.stats.triton_rows):
            for name, kernels in LAUNCHES.items():
                if hasattr(module, name):
                    setattr(module, name, self._counted(getattr(module, name), kernels))

    def _counted(self, function, kernels: int):
        def run(*args, **kwargs):
            result = function(*args, **kwargs)
            self.launched += kernels if result is not None else 0
            return result

        def outside_the_count(*args, **kwargs):
            with _disable_current_modes():
                return run(*args, **kwargs)

        return outside_the_count


def ops_per_call() -> list[str]:
    launches = TritonLaunches()
    monitor = advmon.Monitor("device-ops", sinks=[])
    prompts, rewards, mask = grpo_inputs(512, 8, 1024)
    expand = rewards.unsqueeze(-1).expand(mask.shape)
    dense = expand + 0.01 * torch.randn(mask.shape)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("dense statistics, 4096 x 1024, prefix float mask", lambda: tensor_part(dense, mask)),
        ("expand-view statistics", lambda: tensor_part(expand, mask)),
        ("a whole observed GRPO call (rewards, groups from prompt rows, pre_norm, expand view)",
         lambda: monitor.observe(rewards=rewards, advantages=expand, mask=mask, groups=prompts)),
        ("the same with a dense post_norm",
         lambda: monitor.observe(rewards=rewards, advantages=dense, mask=mask, groups=prompts)),
    ]
    lines = ["ops per call (kernel launches on a GPU):", f"  {'call':88} {'pure torch':>10}   Triton"]
    for name, call in cases:
        counts = []
        for path in ("torch", "triton"):
            with statistics_path(path):
                call()
                launches.launched = 0
                with Dispatched() as seen:
                    call()
            counts.append((len(seen.kernels), launches.launched))
        (torch_ops, _), (triton_ops, kernels) = counts
        lines.append(f"  {name:88} {torch_ops:7d} ops   {triton_ops} ops + {kernels} kernels")
    monitor.close()
    lines.append("  (the record's packing and its one transfer add a cat, a conversion and the copy)")
    return lines


def median_us(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def host_share(repeats: int) -> list[str]:
    torch.set_num_threads(1)
    values = np.random.default_rng(0).standard_normal(4096)
    ones, counts = np.ones(4096), np.random.default_rng(1).integers(1, 2049, 4096).astype(float)
    prompts, rewards, mask = grpo_inputs(512, 8, 2048)
    expand = rewards.unsqueeze(-1).expand(mask.shape)
    parts = observe_call(estimator="bench", rewards=rewards, advantages=expand, mask=mask, groups=prompts,
                         group_size=None, taps={}, problems=[])
    step = assembly.collect([parts])
    small = grpo_inputs(8, 8, 4)
    monitor = advmon.Monitor("host-share", sinks=[])

    def record():
        collected = assembly.collect([parts])
        assembly.assemble(assembly.summaries_of(collected)[0], collected, None)

    lines = [
        "the host's share (NumPy and Python, the same on a GPU), 1 thread:",
        f"  exact statistics of 4096 unweighted values  {median_us(lambda: summaries._exact_summary(values, ones), repeats):7.0f} us",
        f"  exact statistics of 4096 weighted values    {median_us(lambda: summaries._exact_summary(values, counts), repeats):7.0f} us",
        f"  a GRPO record's three summaries (B=4096)     {median_us(lambda: assembly.summaries_of(step)[0], repeats):7.0f} us",
        f"  ... with its groups, packing and the record  {median_us(record, repeats):7.0f} us",
    ]
    def observe():
        monitor.observe(rewards=small[1], advantages=small[1].unsqueeze(-1).expand(small[2].shape), mask=small[2],
                        groups=small[0])

    for path in (None, "torch"):
        with statistics_path(path):
            training, whole = training_thread_us(observe, monitor, repeats)
        lines.append(f"  a whole observed call on 64 samples, {path or 'cpu'} path: training thread {training:6.0f} us,"
                     f" with the host half {whole:6.0f} us")
    monitor.close()
    return lines


def training_thread_us(observe: Callable[[], object], monitor: advmon.Monitor, repeats: int) -> tuple[float, float]:
    """Medians of what a call costs the training thread (the host half idle when it starts, as it is when it keeps
    up) and of the call and its host half together (until ``monitor.wait()`` returns)."""
    observe()
    monitor.wait()
    training, whole = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        observe()
        returned = time.perf_counter()
        monitor.wait()
        training.append(returned - start)
        whole.append(time.perf_counter() - start)
    return statistics.median(training) * 1e6, statistics.median(whole) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    print(f"bench_device_ops: torch {torch.__version__}, median of {args.repeats}")
    with torch.no_grad():
        for line in ops_per_call() + host_share(args.repeats):
            print(line)


if __name__ == "__main__":
    main()
