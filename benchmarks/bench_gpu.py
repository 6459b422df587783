"""advmon on a CUDA GPU: every figure issue 17 asks for, with kernel and sync counts, in one short run.

For the two sizes 4096 x 2048 and 16384 x 8192 (float32 advantages, a float
prefix mask with random response lengths) and for each device path (Triton, the
default where it imports, and pure torch):

* the post-normalization statistics of a dense tensor and of GRPO's expand view
  (``summarize([tensor_part(advantages, mask)])``, as a watched call computes
  them), medians in ms and as a ratio of one ``torch.sum`` pass;
* the CUDA kernels one call launches (``torch.profiler``) and the synchronizing
  calls it makes (``torch.cuda.set_sync_debug_mode("warn")``);
* the peak extra device memory, relative to the advantages tensor;
* a straightforward implementation (boolean indexing, ``torch.quantile``).

Then, at 4096 x 2048, what a whole watched call adds (JSONL sink) to a GRPO
estimator returning the expand view and to a dense one, with its syncs; and, if
``trl`` imports, a short real ``GRPOTrainer`` run (bf16, a tiny Llama) through
``MonitoredGRPOTrainer``, checking advmon's reward mean against TRL's log.

Each goal is printed beside its figure. About a minute on an H200.

``--smoke`` runs the same code on the CPU at small sizes (Triton in its
interpreter, no kernel or sync counts): a check that the script works before a
GPU's minutes are spent on it.

Usage: python benchmarks/bench_gpu.py [--repeats N] [--no-trl] [--smoke]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_stats import straightforward  # noqa: E402

import advmon  # noqa: E402
from advmon.stats import statistics_path  # noqa: E402
from advmon.observation import tensor_part  # noqa: E402
from advmon.stats import summarize  # noqa: E402

SIZES = ((4096, 2048), (16384, 8192))
#: Goals of issue 17, ms: (dense, expand view) per size and path.
GOALS = {
    ("triton", 4096): (0.5, 0.2), ("triton", 16384): (5.0, 1.0),
    ("torch", 4096): (3.0, None), ("torch", 16384): (40.0, None),
}
CUDA = torch.device("cuda")
DEVICE = CUDA  # --smoke: the CPU


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def seconds(fn: Callable[[], object]) -> float:
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], repeats: int, between: Callable[[], object] | None = None) -> float:
    """Median milliseconds of ``fn`` and the device work it queued; ``between`` runs outside the timing after
    each (a monitor's ``wait``: its host half, off the training thread, keeps up rather than piling up)."""
    fn()
    fn()  # Triton compiles on the first call of each specialisation
    taken = []
    for _ in range(repeats):
        if between is not None:
            between()
        taken.append(seconds(fn))
    return statistics.median(taken) * 1e3


def kernels_launched(fn: Callable[[], object]) -> int | str:
    if DEVICE.type != "cuda":
        return "n/a"
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn()
        torch.cuda.synchronize()
    return sum(1 for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def syncs(fn: Callable[[], object]) -> int | str:
    """Synchronizing CUDA calls ``fn`` makes (torch's sync debug mode, one warning each)."""
    if DEVICE.type != "cuda":
        return "n/a"
    fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # Only the mode's own warnings: the first set_sync_debug_mode also warns that the mode is a prototype.
    return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)


def peak_extra_mib(fn: Callable[[], object]) -> float:
    if DEVICE.type != "cuda":
        return float("nan")
    fn()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def inputs(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(rows)
    lengths = torch.randint(1, cols + 1, (rows, 1), generator=generator, device=DEVICE)
    mask = (torch.arange(cols, device=DEVICE) < lengths).float()
    dense = torch.randn(rows, cols, generator=generator, device=DEVICE)
    per_sequence = torch.randn(rows, 1, generator=generator, device=DEVICE)
    return dense, per_sequence.expand(rows, cols), mask


def mark(value: float, goal: float | None) -> str:
    if goal is None or DEVICE.type != "cuda":
        return ""
    return f"  goal <= {goal:g} ms: {'met' if value <= goal else 'NOT met'}"


def statistics_figures(repeats: int, sizes) -> Iterator[str]:
    """Each size's lines as soon as they are measured, so a later failure keeps them."""
    for rows, cols in sizes:
        yield from size_figures(repeats, rows, cols)  # its tensors are freed when it returns
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()


def size_figures(repeats: int, rows: int, cols: int) -> list[str]:
    dense, expanded, mask = inputs(rows, cols)
    tensor_mib = dense.numel() * dense.element_size() / 2**20
    floor = median_ms(lambda: dense.sum(), repeats)
    lines = [f"{rows} x {cols} float32 ({tensor_mib:.0f} MiB): torch.sum pass {floor:.3f} ms"]
    for path in ("triton", "torch"):
        goals = GOALS.get((path, rows), (None, None))
        for (name, advantages), goal in zip((("dense", dense), ("expand view", expanded)), goals):
            def call(a=advantages):
                return summarize([tensor_part(a, mask)])

            with statistics_path(path):
                ms = median_ms(call, repeats)
                launched, synced, peak = kernels_launched(call), syncs(call), peak_extra_mib(call)
            lines.append(
                f"  {path:6} {name:11} {ms:8.3f} ms = {ms / floor:6.1f}x the sum pass | {launched:>3} kernels, "
                f"{synced} sync(s) | peak extra {peak:7.1f} MiB = {peak / tensor_mib:4.2f}x{mark(ms, goal)}"
            )
    simple = median_ms(lambda: straightforward(dense, mask), max(3, repeats // 3))
    lines.append(f"  straightforward dense (bool index + quantile) {simple:.3f} ms")
    return lines


def grpo_estimator(prompt_ids, rewards, mask):
    grouped = rewards.view(-1, 8)
    advantages = (grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-6)
    return advantages.reshape(-1, 1).expand(mask.shape)


def dense_estimator(prompt_ids, rewards, mask):
    advantages = rewards.unsqueeze(-1) * mask
    mean = (advantages * mask).sum() / mask.sum()
    return (advantages - mean) * mask


def watched_call_figures(repeats: int, rows: int, cols: int) -> list[str]:
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    prompts = torch.randint(0, 32000, (rows // 8, 64), generator=generator, device=DEVICE).repeat_interleave(8, dim=0)
    rewards = torch.randint(0, 2, (rows,), generator=generator, device=DEVICE).float()
    _, _, mask = inputs(rows, cols)
    lines = [f"a whole watched call at {rows} x {cols} (JSONL sink, groups from prompt-id rows):"]
    with tempfile.TemporaryDirectory() as folder:
        for path in ("triton", "torch"):
            monitor = advmon.Monitor(f"bench-gpu-{path}", sinks=[advmon.JsonlSink(Path(folder) / f"{path}.jsonl")])
            for name, estimator, goal in (("GRPO expand view", grpo_estimator, 0.5), ("dense", dense_estimator, 1.0)):
                watched = monitor.watch(estimator)
                with statistics_path(path):
                    bare = median_ms(lambda: estimator(prompts, rewards, mask), repeats)
                    total = median_ms(lambda: watched(prompts, rewards, mask), repeats, between=monitor.wait)
                    synced = syncs(lambda: watched(prompts, rewards, mask))
                    launched = kernels_launched(lambda: watched(prompts, rewards, mask))
                added = total - bare
                lines.append(
                    f"  {path:6} {name:16} bare {bare:7.3f} ms, watched {total:7.3f} ms: adds {added:6.3f} ms | "
                    f"{launched:>3} kernels, {synced} sync(s){mark(added, goal if path == 'triton' else None)}"
                )
            monitor.close()
    return lines


def trl_figures(steps: int) -> list[str]:
    try:
        import trl  # noqa: F401
    except ImportError:
        return ["TRL: not installed here (carry trl, datasets, dill and multiprocess as wheels); skipped"]
    from tests import trl_run

    class Kept(advmon.Sink):
        name = "kept"
        synchronous = True

        def __init__(self):
            self.records = []

        def write(self, record):
            self.records.append(record)

    sink = Kept()
    monitor = advmon.Monitor("trl-gpu", sinks=[sink], reward_range=(0, 1))
    with tempfile.TemporaryDirectory() as folder:
        trainer = trl_run.trainer(Path(folder), monitor, use_cpu=False, bf16=True, max_steps=steps)
        start = time.perf_counter()
        trainer.train()
        took = time.perf_counter() - start
    monitor.close()
    logged = {h["step"]: h["reward"] for h in trainer.state.log_history if h.get("reward") is not None}
    equal = [abs(r.metrics["rewards/mean"] - logged.get(r.step, float("nan"))) <= 1e-6 for r in sink.records]
    return [f"TRL GRPOTrainer on {trainer.model.device} (bf16, tiny Llama, {steps} steps, {took:.1f} s): {len(sink.records)} "
            f"records, advmon's reward mean equals TRL's logged reward at {sum(equal)} of {len(equal)} steps"]


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--trl-steps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="the same code on the CPU at small sizes")
    args = parser.parse_args()
    sizes = SIZES
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
        # Two sizes, both sketched (above 65,536 values); Triton's interpreter takes a second per million values.
        DEVICE, sizes, args.repeats, args.no_trl = torch.device("cpu"), ((256, 512), (512, 512)), 2, True
    elif not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; run it where one is (make bench-gpu), or try --smoke")
        return
    import triton

    name = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "CPU (smoke run)"
    print(f"bench_gpu: {datetime.date.today()}, {name}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"triton {triton.__version__}, median of {args.repeats}")
    started = time.perf_counter()
    with torch.no_grad():
        for line in statistics_figures(args.repeats, sizes):
            print(line, flush=True)
        for line in watched_call_figures(args.repeats, *sizes[0]):
            print(line, flush=True)
    if not args.no_trl:
        for line in trl_figures(args.trl_steps):
            print(line)
    print(f"bench_gpu: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
