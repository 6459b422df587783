"""How advmon's cost grows: with the batch (B*T from 1M to 64M elements) and with the groups.

1. Dense per-token statistics and the GRPO expand view at T=2048 and B from 512 to
   32768 (1M to 64M elements, float32), against one sum pass over the same tensor,
   on the one intra-op thread a watched call uses. Linear cost shows as a flat
   ns/element column; a cliff (a chunk that stops fitting in cache, a path that
   switches) as a jump.
2. Rewards, groups and the derived pre-normalization statistics of one call
   (``observe_inputs``), B=16384 rewards, with 1 to 16384 groups given as 2-D
   prompt-id rows, as NeMo-RL passes them.

Medians of a few repeats: these machines are noisy, read the ratios and the trend.

Usage: python benchmarks/bench_scaling.py [--repeats N] [--max-batch B]
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable

import torch
from bench_stats import advmon_stats
from bench_stats import median_seconds as _median_seconds

from advmon.observation import ObserveSettings, observe_inputs
from advmon.stats import statistics_threads

T = 2048
CPU = torch.device("cpu")


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    return _median_seconds(fn, repeats, CPU)


def batch_scaling(repeats: int, max_batch: int) -> list[str]:
    lines = ["time against B*T (T=2048, float32, random response lengths):",
             f"  {'B':>6} {'elements':>9} {'sum pass':>9} {'dense':>9} {'x sum':>6} {'ns/elem':>8}"
             f" {'mask sum':>9} {'expand':>8} {'x sum':>6} {'ns/elem':>8}"]
    batch = 512
    while batch <= max_batch:
        generator = torch.Generator().manual_seed(batch)
        lengths = torch.randint(1, T + 1, (batch, 1), generator=generator)
        mask = (torch.arange(T) < lengths).float()
        dense = torch.randn(batch, T, generator=generator)
        expanded = torch.randn(batch, 1, generator=generator).expand(batch, T)
        elements = batch * T
        t_sum = median_seconds(lambda: dense.sum(), repeats)
        t_dense = median_seconds(lambda: advmon_stats(dense, mask), repeats)
        t_mask = median_seconds(lambda: mask.sum(), repeats)
        t_expand = median_seconds(lambda: advmon_stats(expanded, mask), repeats)
        lines.append(
            f"  {batch:6d} {elements / 2**20:8.0f}M {t_sum * 1e3:7.2f}ms {t_dense * 1e3:7.1f}ms {t_dense / t_sum:6.1f}"
            f" {t_dense / elements * 1e9:8.2f} {t_mask * 1e3:7.2f}ms {t_expand * 1e3:6.2f}ms {t_expand / t_mask:6.1f}"
            f" {t_expand / elements * 1e9:8.2f}"
        )
        del dense, expanded, mask
        gc.collect()
        batch *= 2
    return lines


def group_scaling(repeats: int) -> list[str]:
    batch = 16384
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (batch,), generator=generator).float()
    lines = [f"rewards, groups and derived pre_norm of one call against the number of groups (B={batch}):",
             f"  {'groups':>6} {'time':>9} {'us/group':>9}"]
    groups = 1
    while groups <= batch:
        prompt_ids = (torch.arange(batch) * groups // batch).unsqueeze(-1).repeat(1, 16)  # 2-D rows, contiguous

        def observe() -> object:
            with statistics_threads():
                return observe_inputs(estimator="bench", rewards=rewards, mask=None, groups=prompt_ids,
                                      group_size=None, settings=ObserveSettings(reward_range=(0.0, 1.0)), problems=[])

        elapsed = median_seconds(observe, repeats)
        lines.append(f"  {groups:6d} {elapsed * 1e3:7.2f}ms {elapsed / groups * 1e6:9.3f}")
        groups *= 8 if groups < 4096 else 4
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-batch", type=int, default=32768)
    args = parser.parse_args()
    print(f"bench_scaling: torch {torch.__version__}, {torch.get_num_threads()} threads "
          f"(statistics on 1, as in a watched call), medians of {args.repeats}")
    with torch.no_grad():
        print("\n".join(batch_scaling(args.repeats, args.max_batch)))
        print("\n".join(group_scaling(args.repeats)))


if __name__ == "__main__":
    main()
