"""What the advantage histograms (issue 19, item 2) add to a watched call on the CPU.

The reference size of bench_drilldown.py (B=4096 sequences x T=2048 tokens, float32,
a prefix mask of random lengths, groups of 8 from prompt-id rows, a JSONL sink), a
GRPO estimator returning the expand view and one returning dense advantages, each
watched by two monitors that differ only in ``histograms`` (True, False; no
exemplars on either). Calls alternate in pairs whose order alternates too; the
figure is the median of the per-pair ratios. Issue 19's goal: within 5% (1.05).

Usage: python benchmarks/bench_histograms.py [--repeats N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import advmon  # noqa: E402
from bench_drilldown import B, G, T, estimators, inputs, paired  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    prompts, rewards, mask, noise = inputs()
    print(f"bench_histograms: torch {torch.__version__}, {torch.get_num_threads()} threads, B={B} T={T} G={G}, "
          f"median of {args.repeats} pairs")
    with tempfile.TemporaryDirectory() as folder:
        with advmon.Monitor("on", sinks=[f"jsonl:{folder}/on.jsonl"], exemplars=0, histograms=True) as with_them, \
                advmon.Monitor("off", sinks=[f"jsonl:{folder}/off.jsonl"], exemplars=0, histograms=False) as without:
            for name, estimator in estimators(noise).items():
                on, off = with_them.watch(estimator), without.watch(estimator)
                without_ms, with_ms, ratio = paired(lambda: on(prompts, rewards, mask),
                                                    lambda: off(prompts, rewards, mask), args.repeats)
                print(f"  {name:17} watched, no histograms {without_ms * 1e3:6.2f} ms, histograms {with_ms * 1e3:6.2f} ms"
                      f" | ratio {ratio:5.3f} (goal <= 1.05)")
            line = (Path(folder) / "on.jsonl").read_text().splitlines()[-1]
            print(f"  a JSONL line: {len(line)} bytes with histograms, "
                  f"{len((Path(folder) / 'off.jsonl').read_text().splitlines()[-1])} without")


if __name__ == "__main__":
    main()
