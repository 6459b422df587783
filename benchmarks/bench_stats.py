"""How much advmon's statistics cost, as ratios measured in one run.

Reference size: B=4096 sequences x T=2048 tokens, float32 advantages, a float
mask with random response lengths. Two outputs: a dense per-token tensor (GAE,
Reinforce++ with a KL term) and GRPO's zero-stride ``expand`` view.

For each, advmon's full post-normalization statistics (``tensor_part`` plus
``summarize``: counts, moments, extrema, percentiles) are timed against

* one ``torch.sum`` pass over the advantages (dense) or over the mask (expand
  view, whose statistics follow from B values and per-row mask counts): a
  proxy for the memory-bandwidth floor;
* a straightforward implementation of the same statistics (boolean indexing,
  ``isfinite`` filtering, ``torch.quantile``).

Ratios compare like with like: the floor pass and advmon's statistics timed
with the same number of intra-op threads, one (what a watched call uses, see
``advmon.stats.statistics_threads``) and the machine's. The dense case is also
timed with the prefix-mask fast path off: the general path any mask takes.

Peak extra memory is the rise of peak RSS during one call in a fresh process
(every page advmon touches counts), relative to the advantages tensor. These machines are noisy: figures are
medians, and only ratios measured in the same run are compared.

Usage: python benchmarks/bench_stats.py [--repeats N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import advmon.stats as stats
from advmon.observation import tensor_part
from advmon.stats import cpu_sketch, statistics_threads, summarize

B, T = 4096, 2048
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)


def straightforward(advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The statistics as one would first write them."""
    valid = advantages[mask > 0]
    finite = valid[torch.isfinite(valid)].double()
    stats = {
        "count": valid.numel(),
        "nan_count": torch.isnan(valid).sum().item(),
        "inf_count": torch.isinf(valid).sum().item(),
        "mean": finite.mean().item(),
        "std": finite.std(unbiased=False).item(),
        "min": finite.min().item(),
        "max": finite.max().item(),
        "abs_mean": finite.abs().mean().item(),
    }
    for q, value in zip(QUANTILES, linear_quantiles(finite, QUANTILES).tolist()):
        stats[f"q{q}"] = value
    return stats


def linear_quantiles(values: torch.Tensor, levels) -> torch.Tensor:
    """torch.quantile's linear interpolation; a sort where quantile refuses (over 2^24 values)."""
    levels = torch.tensor(levels, dtype=torch.float64, device=values.device)
    if values.numel() <= 2**24:
        return torch.quantile(values, levels)
    ordered = values.sort().values
    position = levels * (ordered.numel() - 1)
    below = position.floor().long()
    above = position.ceil().long()
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def advmon_stats(advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """What a watched call computes, with the intra-op threads a watched call uses."""
    with statistics_threads():
        return summarize([tensor_part(advantages, mask)])


def with_threads(threads: int, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with ``threads`` intra-op threads, advmon's statistics included."""

    def run() -> object:
        previous_torch, previous_advmon = torch.get_num_threads(), stats.STATISTICS_THREADS
        torch.set_num_threads(threads)
        stats.STATISTICS_THREADS = threads
        try:
            return fn()
        finally:
            torch.set_num_threads(previous_torch)
            stats.STATISTICS_THREADS = previous_advmon

    return run


def general_path(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with the prefix-mask fast path switched off (arbitrary masks take this path)."""

    def run() -> object:
        real = cpu_sketch._sketch_prefix
        cpu_sketch._sketch_prefix = lambda values, valid, extremes=None: None
        try:
            return fn()
        finally:
            cpu_sketch._sketch_prefix = real

    return run


# What the peers log, as they compute it (docs/research.md, section 2), for a like-with-like table.
def nemo_rl_logged(advantages: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """NeMo-RL: mean/max/min, unmasked first (then overwritten), masked by the token mask."""
    unmasked = advantages.mean().item()
    valid = mask.bool()
    return [unmasked, advantages[valid].mean().item(), advantages[valid].max().item(), advantages[valid].min().item()]


def verl_logged(advantages: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """verl: ``critic/advantages/{mean,max,min}`` over ``torch.masked_select``."""
    valid = torch.masked_select(advantages, mask.bool())
    return [valid.mean().item(), valid.max().item(), valid.min().item()]


def trl_logged(advantages: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """TRL: per-sequence advantages (one per completion), gathered; mean and std."""
    per_sequence = advantages[:, 0]
    return [per_sequence.mean().item(), per_sequence.std().item()]


def seconds(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    fn()  # warm up: allocator caches, lazy initialisation
    return statistics.median(seconds(fn, device) for _ in range(repeats))


def paired_ratio(fn: Callable[[], object], floor: Callable[[], object], repeats: int, device: torch.device):
    """(median seconds of ``floor``, of ``fn``, median of the ratios of pairs timed back to back).

    The machine's speed drifts within a run; a ratio of two calls made one after
    the other sees the same machine, so its median is steadier than a ratio of medians.
    """
    fn(), floor()
    pairs = [(seconds(floor, device), seconds(fn, device)) for _ in range(repeats)]
    return (statistics.median(f for f, _ in pairs), statistics.median(t for _, t in pairs),
            statistics.median(t / f for f, t in pairs))


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(case: str, device: torch.device) -> int:
    """Peak memory added by one advmon call on ``case`` ("dense" or "expand view").

    CUDA: the allocator's peak. CPU: the rise of peak RSS in a fresh process
    (nothing cached by earlier calls), so every page advmon touches counts.
    """
    if device.type == "cuda":
        advantages, mask = _case_inputs(case, device)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        advmon_stats(advantages, mask)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    done = subprocess.run(
        [sys.executable, __file__, "--peak-rss-of", case], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


def _peak_rss_of(case: str) -> int:
    advantages, mask = _case_inputs(case, torch.device("cpu"))
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark
    before = _rss_bytes("VmRSS")
    advmon_stats(advantages, mask)
    return max(_rss_bytes("VmHWM") - before, 0)


def _case_inputs(case: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    dense, expanded, mask = make_inputs(device)
    return (dense if case == "dense" else expanded), mask


def make_inputs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, T + 1, (B,), generator=generator)
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).float()
    dense = torch.randn(B, T, generator=generator)
    per_sequence = torch.randn(B, 1, generator=generator)
    return dense.to(device), per_sequence.to(device).expand(B, T), mask.to(device)


def spoilt_run(advantages: torch.Tensor, mask: torch.Tensor, repeats: int, device: torch.device) -> str:
    """The dense case when a run goes bad: one row of NaN and one of Inf among the valid values."""
    spoilt = advantages.clone()
    spoilt[17, :5] = float("nan")
    spoilt[2000, :] = float("inf")
    t_fast = median_seconds(lambda: advmon_stats(spoilt, mask), repeats, device)
    t_general = median_seconds(general_path(lambda: advmon_stats(spoilt, mask)), repeats, device)
    return (f"  with a NaN row and an Inf row: advmon {t_fast * 1e3:.2f} ms, "
            f"general path {t_general * 1e3:.2f} ms (1 thread)")


def run(repeats: int, device: torch.device) -> list[str]:
    dense, expanded, mask = make_inputs(device)
    tensor_bytes = dense.numel() * dense.element_size()
    caller = torch.get_num_threads()
    thread_counts = [1] if caller == 1 or device.type == "cuda" else [1, caller]
    lines = [
        f"bench_stats: B={B} T={T} float32, float prefix mask (random lengths), device={device}, "
        f"torch {torch.__version__}, median of {repeats}; each ratio is against the floor pass "
        f"timed with the same number of intra-op threads (a watched call uses {stats.STATISTICS_THREADS})",
    ]
    for name, advantages, floor_name, floor in (
        ("dense", dense, "torch.sum(advantages)", lambda: dense.sum()),
        ("expand view", expanded, "torch.sum(mask)", lambda: mask.sum()),
    ):
        lines.append(f"{name}:")
        for threads in thread_counts:
            t_floor, t_advmon, ratio = paired_ratio(
                with_threads(threads, lambda: advmon_stats(advantages, mask)), with_threads(threads, floor),
                repeats, device,
            )
            lines += [
                f"  {threads} thread(s): {floor_name:22} {t_floor * 1e3:8.2f} ms",
                f"  {threads} thread(s): advmon post_norm stats  {t_advmon * 1e3:8.2f} ms   = {ratio:6.1f}x"
                " (median of paired ratios)",
            ]
            if name == "dense" and device.type == "cpu":
                general = general_path(lambda: advmon_stats(advantages, mask))
                _, t_general, ratio = paired_ratio(
                    with_threads(threads, general), with_threads(threads, floor), max(3, repeats // 3), device
                )
                lines.append(
                    f"  {threads} thread(s): general path (any mask) {t_general * 1e3:8.2f} ms   = "
                    f"{ratio:6.1f}x (the prefix-mask fast path off)"
                )
        if name == "dense" and device.type == "cpu":
            lines.append(spoilt_run(advantages, mask, max(3, repeats // 3), device))
        t_advmon = median_seconds(lambda: advmon_stats(advantages, mask), repeats, device)
        t_simple = median_seconds(lambda: straightforward(advantages, mask), max(3, repeats // 3), device)
        peers = [(peer, median_seconds(lambda f=f: f(advantages, mask), repeats, device))
                 for peer, f in (("NeMo-RL's mean/max/min", nemo_rl_logged), ("verl's masked_select", verl_logged),
                                 ("TRL's mean/std", trl_logged))]
        peak = peak_extra_bytes(name, device)
        lines += [
            f"  as a watched call runs it (caller's {caller} threads, statistics on "
            f"{stats.STATISTICS_THREADS}): advmon {t_advmon * 1e3:.2f} ms",
            f"  straightforward stats      {t_simple * 1e3:9.2f} ms   advmon is {t_simple / t_advmon:6.1f}x faster",
            *[f"  {peer:26} {t * 1e3:9.2f} ms   = {t / t_advmon:6.2f}x advmon's time (what it logs: far less)"
              for peer, t in peers],
            f"  advmon peak extra memory   {peak / 2**20:9.1f} MiB  = {peak / tensor_bytes:6.2f}x the advantages tensor",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--peak-rss-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_rss_of:
        print(_peak_rss_of(args.peak_rss_of))
        return
    with torch.no_grad():
        print("\n".join(run(args.repeats, torch.device(args.device))))


if __name__ == "__main__":
    main()
