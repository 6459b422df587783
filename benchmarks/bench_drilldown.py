"""What the drill-down (worst-group exemplars) adds to a watched call on the CPU.

At the reference size, B=4096 sequences x T=2048 tokens (float32 advantages, a
prefix mask of random response lengths, groups of 8 from prompt-id rows), a GRPO
estimator returning the expand view and one returning dense advantages are
watched by two monitors that differ only in ``exemplars`` (5, the default, and
0); then the same with slice labels (two data sources) on the first. Calls alternate between them, in pairs whose order alternates too; the
figure is the median of the per-pair ratios (this machine's speed drifts, a pair
sees the same machine). Issue 18's
goal: at most 1.10.

Usage: python benchmarks/bench_drilldown.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import advmon  # noqa: E402

B, T, G = 4096, 2048, 8


def inputs():
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 32000, (B // G, 64), generator=generator).repeat_interleave(G, dim=0)
    rewards = torch.randint(0, 2, (B,), generator=generator).float()
    lengths = torch.randint(1, T + 1, (B, 1), generator=generator)
    mask = (torch.arange(T) < lengths).float()
    noise = 0.05 * torch.randn(B, T, generator=generator)
    return prompts, rewards, mask, noise


def estimators(noise):
    def grpo(prompt_ids, rewards, mask):
        grouped = rewards.view(-1, G)
        advantages = (grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-6)
        return advantages.reshape(-1, 1).expand(mask.shape)

    def dense(prompt_ids, rewards, mask):
        return (grpo(prompt_ids, rewards, mask) + noise) * mask

    return {"GRPO expand view": grpo, "dense": dense}


def paired(on, off, repeats: int) -> tuple[float, float, float]:
    """Medians of each, and of the per-pair ratios; which of the two runs first alternates (caches favour neither)."""
    on(), off()
    pairs = []
    for index in range(repeats):
        first, second = (off, on) if index % 2 == 0 else (on, off)
        start = time.perf_counter()
        first()
        middle = time.perf_counter()
        second()
        times = (middle - start, time.perf_counter() - middle)
        pairs.append(times if index % 2 == 0 else times[::-1])
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(b / a for a, b in pairs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    prompts, rewards, mask, noise = inputs()
    sources = ["math" if i % 4 == 0 else "gsm8k" for i in range(B // G) for _ in range(G)]
    print(f"bench_drilldown: torch {torch.__version__}, {torch.get_num_threads()} threads, B={B} T={T} G={G}, "
          f"median of {args.repeats} pairs")
    with tempfile.TemporaryDirectory() as folder:
        with advmon.Monitor("on", sinks=[f"jsonl:{folder}/on.jsonl"], exemplars=5) as with_them, \
                advmon.Monitor("off", sinks=[f"jsonl:{folder}/off.jsonl"], exemplars=0) as without:
            for name, estimator in estimators(noise).items():
                on, off = with_them.watch(estimator), without.watch(estimator)
                bare = statistics.median(_seconds(lambda: estimator(prompts, rewards, mask)) for _ in range(5))

                def sliced():
                    with advmon.sliced_by(sources):
                        return on(prompts, rewards, mask)

                for label, call in (("exemplars=5", lambda: on(prompts, rewards, mask)),
                                    ("+ 2 slices", sliced)):
                    without_ms, with_ms, ratio = paired(call, lambda: off(prompts, rewards, mask), args.repeats)
                    print(f"  {name:17} estimator {bare * 1e3:6.2f} ms | watched, no drill-down {without_ms * 1e3:6.2f} ms,"
                          f" {label:11} {with_ms * 1e3:6.2f} ms | ratio {ratio:5.3f} (goal <= 1.10)")


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
