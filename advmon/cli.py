"""The ``advmon`` command line. Every command is ``main(argv) -> exit code``.

* ``advmon demo``: simulate a stable and an unstable GRPO run, print their summaries.
* ``advmon summary FILE...``: summarise JSONL files written by advmon.
* ``advmon replay FILE --to SPEC``: send a file's records to a sink afterwards
  (backfill W&B or MLflow after an outage).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from advmon.errors import AdvmonError
from advmon.sinks.specs import SPEC_FORMS

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

    replay = commands.add_parser("replay", help="send the records of a JSONL file to sinks")
    replay.add_argument("file", type=Path, help="JSONL file written by advmon")
    replay.add_argument(
        "--to", dest="specs", action="append", required=True, metavar="SPEC",
        help="sink spec, repeatable: " + SPEC_FORMS,
    )
    replay.add_argument("--since-step", type=_non_negative_int, default=0, help="only records from this step on")
    replay.add_argument("--retries", type=_non_negative_int, default=3, help="attempts per record after the first")
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
        elif args.command == "replay":
            return _replay(args.file, args.specs, args.since_step, args.retries)
    except (AdvmonError, OSError, ModuleNotFoundError) as exc:
        print(f"advmon: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _replay(path: Path, specs: list[str], since_step: int, retries: int) -> int:
    from advmon.emitter import DeliveryPolicy, attach_sink, write_with_retries
    from advmon.sinks.jsonl import read_jsonl
    from advmon.sinks.specs import parse_spec, sink_from_spec

    for spec in specs:
        parse_spec(spec)
    records = [r for r in read_jsonl(path) if r.step >= since_step]
    policy = DeliveryPolicy(retries=retries)
    failed = 0
    for spec in specs:
        for run in dict.fromkeys(r.run for r in records):
            sink = sink_from_spec(spec, run)
            attach_sink(sink, run, [spec.partition(":")[0]])
            sent = 0
            for record in (r for r in records if r.run == run):
                error = write_with_retries(sink, record, policy)
                if error is None:
                    sent += 1
                else:
                    failed += 1
                    print(f"advmon: step {record.step}: {type(error).__name__}: {error}", file=sys.stderr)
            close = getattr(sink, "close", None)
            if callable(close):
                close()
            print(f"replayed {sent} record(s) of run {run} to {spec}")
    if failed:
        print(f"advmon: error: {failed} record(s) could not be sent", file=sys.stderr)
        return 1
    return 0


def entry_point() -> None:
    """Console-script entry point."""
    sys.exit(main())
