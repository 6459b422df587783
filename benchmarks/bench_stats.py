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
from advmon.stats import statistics_threads, summarize

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
    for q, value in zip(QUANTILES, torch.quantile(finite, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()):
        stats[f"q{q}"] = value
    return stats


def advmon_stats(advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """What a watched call computes, with the intra-op threads a watched call uses."""
    with statistics_threads():
        return summarize([tensor_part(advantages, mask)])


def advmon_stats_all_threads(advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    previous, stats.STATISTICS_THREADS = stats.STATISTICS_THREADS, None
    try:
        return advmon_stats(advantages, mask)
    finally:
        stats.STATISTICS_THREADS = previous


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


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    fn()  # warm up: allocator caches, lazy initialisation
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def run(repeats: int, device: torch.device) -> list[str]:
    dense, expanded, mask = make_inputs(device)
    tensor_bytes = dense.numel() * dense.element_size()
    lines = [
        f"bench_stats: B={B} T={T} float32, float mask, device={device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, median of {repeats}",
    ]
    for name, advantages, floor_name, floor in (
        ("dense", dense, "torch.sum(advantages)", lambda: dense.sum()),
        ("expand view", expanded, "torch.sum(mask)", lambda: mask.sum()),
    ):
        t_floor = median_seconds(floor, repeats, device)
        t_advmon = median_seconds(lambda: advmon_stats(advantages, mask), repeats, device)
        t_all = median_seconds(lambda: advmon_stats_all_threads(advantages, mask), repeats, device)
        t_simple = median_seconds(lambda: straightforward(advantages, mask), max(3, repeats // 3), device)
        peers = [(peer, median_seconds(lambda f=f: f(advantages, mask), repeats, device))
                 for peer, f in (("NeMo-RL's mean/max/min", nemo_rl_logged), ("verl's masked_select", verl_logged),
                                 ("TRL's mean/std", trl_logged))]
        peak = peak_extra_bytes(name, device)
        lines += [
            f"{name}:",
            f"  {floor_name:26} {t_floor * 1e3:9.2f} ms",
            f"  advmon post_norm stats     {t_advmon * 1e3:9.2f} ms   = {t_advmon / t_floor:6.1f}x {floor_name}"
            f" (1 intra-op thread, as in a watched call)",
            f"  advmon, caller's threads   {t_all * 1e3:9.2f} ms   = {t_all / t_floor:6.1f}x",
            f"  straightforward stats      {t_simple * 1e3:9.2f} ms   advmon is {t_simple / t_advmon:6.1f}x faster",
            *[f"  {peer:26} {t * 1e3:9.2f} ms   = {t / t_floor:6.1f}x (what it logs: far less)" for peer, t in peers],
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
