"""The ``advmon`` command line. Every command is ``main(argv) -> exit code``.

* ``advmon demo``: simulate a stable and an unstable GRPO run, print their summaries.
* ``advmon summary FILE...``: summarise JSONL files written by advmon.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from advmon.errors import AdvmonError

__all__ = ["entry_point", "main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="advmon", description="Advantage monitoring for RL training of LLMs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="simulate a stable and an unstable GRPO run and summarise them")
    demo.add_argument("--steps", type=_positive_int, default=60, help="training steps per run (default 60)")
    demo.add_argument("--seed", type=_non_negative_int, default=0, help="random seed (default 0)")
    demo.add_argument("--out", type=Path, default=Path("advmon-runs"), help="directory for the JSONL files")

    summary = commands.add_parser("summary", help="summarise advmon JSONL files")
    summary.add_argument("files", nargs="+", type=Path, help="JSONL files written by advmon")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (0 ok, 1 advmon error, 2 usage error)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from advmon.demo import DemoConfig, run_demo

            print(run_demo(DemoConfig(steps=args.steps, seed=args.seed, out=args.out)))
        elif args.command == "summary":
            from advmon.report import format_summary
            from advmon.sinks.jsonl import read_jsonl

            for path in args.files:
                records = read_jsonl(path)
                runs = sorted({r.run for r in records}) or [path.stem]
                for run in runs:
                    print(format_summary(run, [r for r in records if r.run == run], str(path)))
    except (AdvmonError, OSError) as exc:
        print(f"advmon: error: {exc}", file=sys.stderr)
        return 1
    return 0


def entry_point() -> None:
    """Console-script entry point."""
    sys.exit(main())
