"""Where a call's time goes on a CUDA GPU: the kernels' own times and the host's Python.

bench_gpu.py says whether a goal is met; this says why not. For the Triton and
torch paths' dense and expand-view statistics at 4096 x 2048 and 16384 x 8192, and
for a whole watched GRPO call at 4096 x 2048, it prints:

* the profiler's table of CUDA kernels (time on the device, calls);
* the wall time next to the device time, so the host's share shows;
* ``cProfile``'s top functions by own time for the watched call (the host's share).

About half a minute on an H200. ``--smoke`` runs it on the CPU at small sizes.

Usage: python benchmarks/profile_gpu.py [--smoke]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_gpu  # noqa: E402
from bench_gpu import grpo_estimator, inputs, median_ms  # noqa: E402

import advmon  # noqa: E402
from advmon.stats import statistics_path  # noqa: E402
from advmon.observation import tensor_part  # noqa: E402
from advmon.stats import summarize  # noqa: E402

#: Calls per figure: timed for a median, profiled for the kernel table, profiled for the host's table. --smoke
#: makes one or two of each: it checks that the code runs (Triton's interpreter is slow), not what it measures.
CALLS = {"median": 10, "watched median": 20, "kernels": 5, "host": 20}


def kernel_table(fn, rows: int = 12) -> str:
    fn()
    fn()
    bench_gpu.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if bench_gpu.DEVICE.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(CALLS["kernels"]):
            fn()
        bench_gpu.synchronize()
    sort = "cuda_time_total" if bench_gpu.DEVICE.type == "cuda" else "cpu_time_total"
    return profile.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=60)


def host_profile(fn, rows: int = 25) -> str:
    fn()
    fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(CALLS["host"]):
        fn()
    bench_gpu.synchronize()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(rows)
    return out.getvalue()


def statistics_profiles(sizes) -> None:
    for rows, cols in sizes:
        dense, expanded, mask = inputs(rows, cols)
        for path in ("triton", "torch"):
            for name, advantages in (("dense", dense), ("expand view", expanded)):
                def call(a=advantages):
                    return summarize([tensor_part(a, mask)])

                with statistics_path(path):
                    print(f"=== {path} {name} {rows} x {cols}: median {median_ms(call, CALLS['median']):.3f} ms "
                          f"(profiled below: {CALLS['kernels']} calls)")
                    print(kernel_table(call))


def watched_profile(rows: int, cols: int) -> None:
    generator = torch.Generator(device=bench_gpu.DEVICE).manual_seed(1)
    prompts = torch.randint(0, 32000, (rows // 8, 64), generator=generator, device=bench_gpu.DEVICE)
    prompts = prompts.repeat_interleave(8, dim=0)
    rewards = torch.randint(0, 2, (rows,), generator=generator, device=bench_gpu.DEVICE).float()
    _, _, mask = inputs(rows, cols)
    with tempfile.TemporaryDirectory() as folder:
        monitor = advmon.Monitor("profile-gpu", sinks=[advmon.JsonlSink(Path(folder) / "run.jsonl")])
        watched = monitor.watch(grpo_estimator)
        with statistics_path("triton"):
            def call():
                return watched(prompts, rewards, mask)

            print(f"=== watched GRPO call {rows} x {cols}: median {median_ms(call, CALLS['watched median']):.3f} ms")
            print(kernel_table(call, rows=25))
            print(host_profile(call))
        monitor.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="run on the CPU at small sizes")
    args = parser.parse_args()
    sizes = bench_gpu.SIZES
    if args.smoke:
        bench_gpu.DEVICE, sizes = torch.device("cpu"), ((256, 512),)
        CALLS.update({"median": 2, "watched median": 2, "kernels": 1, "host": 2})
    print(f"profile_gpu: {torch.cuda.get_device_name() if not args.smoke else 'CPU (smoke run)'}, torch {torch.__version__}")
    with torch.no_grad():
        statistics_profiles(sizes)
        watched_profile(*sizes[0])


if __name__ == "__main__":
    main()
