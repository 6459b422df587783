"""The ``advmon`` command line. Every command is ``main(argv) -> exit code``.

* ``advmon demo``: simulate a stable and an unstable GRPO run, print their summaries.
* ``advmon summary FILE...``: summarise JSONL files written by advmon.
* ``advmon replay FILE --to SPEC``: send a file's records to a sink afterwards
  (backfill W&B or MLflow after an outage).
* ``advmon alerts generate``: write Prometheus rules, the Alertmanager configuration
  and promtool tests for a team's settings.
* ``advmon alerts check FILE...``: evaluate the alert catalog over recorded runs
  (exit 1 when a critical alert fired: a CI gate).
* ``advmon report RUN``: a self-contained HTML page (or a PNG) about a recorded run.
* ``advmon compare RUN_A RUN_B``: do two runs diverge, where, and in what (exit 1 if so).
* ``advmon dashboards generate|preview``: Grafana boards, and pictures of them.

A RUN is a JSONL file (``FILE#RUN`` for one of several), ``mlflow+TRACKING_URI#RUN``
or a W&B offline run directory; see :mod:`advmon.runs`.
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
    demo.add_argument("--serve", action="store_true", help="keep the runs exposed on a local Prometheus endpoint")
    demo.add_argument("--port", type=_non_negative_int, default=9464, help="port for --serve (default 9464, 0: free)")
    demo.add_argument("--step-seconds", type=float, default=5.0, help="seconds per step with --serve (default 5)")

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
    _add_alert_commands(commands)
    _add_dashboard_commands(commands)
    _add_run_commands(commands)
    return parser


RUN_HELP = "a JSONL file (FILE#RUN for one of several), mlflow+TRACKING_URI#RUN_ID_OR_NAME, or a W&B offline run dir"


def _add_run_commands(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="an HTML page (or PNG) about a recorded run")
    report.add_argument("run", help=RUN_HELP)
    report.add_argument("--out", type=Path, default=None, help="file to write (default report-<run>.html/.png)")
    report.add_argument("--format", choices=("html", "png"), default="html")
    report.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help="override a threshold")
    report.add_argument("--runbook-base", default="", metavar="URL",
                        help="where the runbooks page is hosted (default: the page carries the runbooks itself)")
    compare = commands.add_parser("compare", help="do two runs diverge, where, and in which statistic first")
    compare.add_argument("run_a", help=RUN_HELP)
    compare.add_argument("run_b", help=RUN_HELP)
    compare.add_argument("--format", choices=("text", "json"), default="text")
    compare.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write overlay plots here")
    compare.add_argument("--window", type=_positive_int, default=20, help="steps per compared window (default 20)")
    compare.add_argument("--z", type=float, default=4.0, help="|z| that counts as divergence (default 4)")
    compare.add_argument("--persistence", type=_positive_int, default=3, help="consecutive steps needed (default 3)")


def _add_dashboard_commands(commands: argparse._SubParsersAction) -> None:
    boards = commands.add_parser("dashboards", help="generate Grafana boards, or preview one as a PNG")
    verbs = boards.add_subparsers(dest="dashboards_command", required=True, metavar="VERB")
    generate = verbs.add_parser("generate", help="write the boards and Grafana provisioning files")
    generate.add_argument("--out", type=Path, default=Path("dashboards"), help="directory to write (default dashboards/)")
    generate.add_argument("--datasource-uid", default="advmon-prometheus", help="uid of the Prometheus datasource")
    generate.add_argument("--prometheus-url", default="http://127.0.0.1:9090", help="URL of the provisioned datasource")
    generate.add_argument("--selector", default="", metavar="MATCHERS", help="label matchers for every query")
    generate.add_argument("--title", default="", metavar="PREFIX", help="put before each board's title")
    generate.add_argument("--runbook-base", default="", metavar="URL",
                          help="where the runbooks page is hosted: links to it (the advice of each alert travels anyway)")
    generate.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help="override a threshold")
    preview = verbs.add_parser("preview", help="draw a board from a Prometheus's data, without Grafana")
    preview.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus that scrapes the runs")
    preview.add_argument("--run", required=True, action="append", metavar="RUN", help="run(s) to show (A for compare)")
    preview.add_argument("--run-b", metavar="RUN", help="run B, for the compare board")
    preview.add_argument("--board", choices=("health", "compare"), default="health")
    preview.add_argument("--job", default=".*", help="job regex (default all)")
    preview.add_argument("--range", default="1h", metavar="DURATION", help="time range to draw (default 1h)")
    preview.add_argument("--out", type=Path, default=Path("board.png"), help="PNG to write (default board.png)")


def _add_alert_commands(commands: argparse._SubParsersAction) -> None:
    alerts = commands.add_parser("alerts", help="generate alert rules, or check recorded runs against them")
    verbs = alerts.add_subparsers(dest="alerts_command", required=True, metavar="VERB")
    generate = verbs.add_parser("generate", help="write Prometheus rules, Alertmanager config and promtool tests")
    generate.add_argument("--out", type=Path, default=Path("alerts"), help="directory to write (default alerts/)")
    generate.add_argument(
        "--interval", default="1m", metavar="DURATION",
        help="time between two records as Prometheus sees them: scrape interval or step time (default 1m)",
    )
    generate.add_argument("--for", dest="for_", metavar="DURATION", help="pending time of every rule that waits")
    generate.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help="override a threshold")
    generate.add_argument("--runbook-base", default="", metavar="URL",
                          help="where the runbooks page is hosted: links to it (the advice of each alert travels anyway)")
    generate.add_argument("--dashboard-url", default="", metavar="URL", help="on-call dashboard URL for messages")
    generate.add_argument("--selector", default="", metavar="MATCHERS", help="label matchers for every metric, e.g. 'job=\"grpo\"'")
    generate.add_argument(
        "--slack-webhook-file", default=None, metavar="PATH",
        help="file Alertmanager reads the Slack webhook URL from (default /etc/alertmanager/secrets/slack-webhook-url)",
    )
    generate.add_argument("--slack-channel", default="", metavar="CHANNEL", help="Slack channel override")
    check = verbs.add_parser("check", help="evaluate the alert catalog over recorded JSONL runs")
    check.add_argument("files", nargs="+", type=Path, help="JSONL files written by advmon")
    check.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    check.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help="override a threshold")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (0 ok, 1 advmon error, 2 usage error)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from advmon.demo import DemoConfig, run_demo

            if args.serve:
                from advmon.demo import serve_demo

                serve_demo(DemoConfig(steps=args.steps, seed=args.seed, out=args.out), port=args.port,
                           step_seconds=args.step_seconds)
                return 0
            print(run_demo(DemoConfig(steps=args.steps, seed=args.seed, out=args.out)))
        elif args.command == "summary":
            from advmon.report import format_summary
            from advmon.sinks.jsonl import one_history, read_jsonl

            for path in args.files:
                records = one_history(read_jsonl(path), str(path))
                runs = sorted({r.run for r in records}) or [path.stem]
                for run in runs:
                    print(format_summary(run, [r for r in records if r.run == run], str(path)))
        elif args.command == "replay":
            return _replay(args.file, args.specs, args.since_step, args.retries)
        elif args.command == "alerts":
            from advmon.alerts.cli import check, generate

            if args.alerts_command == "generate":
                return generate(args)
            return check(args.files, args.format, args.threshold)
        elif args.command == "dashboards":
            return _dashboards(args)
        elif args.command in ("report", "compare"):
            return _run_command(args)
    except (AdvmonError, OSError, ModuleNotFoundError) as exc:
        from advmon.redact import scrub

        print(f"advmon: error: {scrub(str(exc))}", file=sys.stderr)
        return 1
    return 0


def redact_spec(spec: str) -> str:
    """A sink spec as it may be printed: a URL's password and tokens masked."""
    from advmon.redact import redact_url

    kind, sep, argument = spec.partition(":")
    return f"{kind}{sep}{redact_url(argument)}" if "://" in argument else spec


def _replay(path: Path, specs: list[str], since_step: int, retries: int) -> int:
    from advmon.emitter import DeliveryPolicy, attach_sink, write_with_retries
    from advmon.redact import remember_secrets, scrub
    from advmon.sinks.jsonl import read_jsonl
    from advmon.sinks.specs import parse_spec, sink_from_spec

    for spec in specs:
        parse_spec(spec)
        remember_secrets(spec.partition(":")[2])
    records = [r for r in read_jsonl(path) if r.step >= since_step]
    policy = DeliveryPolicy(retries=retries)
    failed = 0
    for spec in specs:
        for run in dict.fromkeys(r.run for r in records):
            sink = sink_from_spec(spec, run)
            attach_sink(sink, run, [spec.partition(":")[0]])
            sent = 0
            accept = getattr(sink, "accept", None)
            for record in (r for r in records if r.run == run):
                if callable(accept):
                    accept(record)  # what a monitor does for every record before queueing it
                error = write_with_retries(sink, record, policy)
                if error is None:
                    sent += 1
                else:
                    failed += 1
                    print(scrub(f"advmon: step {record.step}: {type(error).__name__}: {error}"), file=sys.stderr)
            close = getattr(sink, "close", None)
            if callable(close):
                close()
            print(f"replayed {sent} record(s) of run {run} to {redact_spec(spec)}")
    if failed:
        print(f"advmon: error: {failed} record(s) could not be sent", file=sys.stderr)
        return 1
    return 0


def _run_command(args: argparse.Namespace) -> int:
    """``report`` and ``compare``: bad input is one line and exit code 2."""
    import warnings

    from advmon.rules import Thresholds

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if args.command == "report":
                from advmon.html_report import write_png, write_report
                from advmon.runs import read_run

                run = read_run(args.run)
                thresholds = Thresholds.parse(args.threshold)
                out = args.out or Path(f"report-{run.name}.{args.format}")
                if args.format == "png":
                    write_png(run, out, thresholds)
                else:
                    write_report(run, out, thresholds, args.runbook_base)
                print(f"wrote {out}: open it in a browser" if args.format == "html" else f"wrote {out}")
                code = 0
            else:
                from advmon.compare import compare_runs, write_comparison_html
                from advmon.runs import read_run

                comparison = compare_runs(read_run(args.run_a), read_run(args.run_b), args.window, args.z,
                                          args.persistence)
                print(comparison.to_json() if args.format == "json" else comparison.to_text())
                if args.html is not None:
                    write_comparison_html(comparison, args.html)
                    if args.format == "text":
                        print(f"wrote {args.html}")
                code = 1 if comparison.diverged else 0
        for warning in caught:
            print(f"advmon: warning: {warning.message}", file=sys.stderr)
        return code
    except (AdvmonError, OSError) as exc:
        print(f"advmon: error: {exc}", file=sys.stderr)
        return 2


def _dashboards(args: argparse.Namespace) -> int:
    from advmon.dashboards import DashboardSettings, boards, generate
    from advmon.rules import Thresholds, parse_duration

    if args.dashboards_command == "generate":
        settings = DashboardSettings(
            datasource_uid=args.datasource_uid, prometheus_url=args.prometheus_url, selector=args.selector,
            title_prefix=args.title, runbook_base=args.runbook_base, thresholds=Thresholds.parse(args.threshold),
        )
        for path in generate(args.out, settings):
            print(f"wrote {path}")
        return 0
    from advmon.dashboards.preview import render_board

    settings = DashboardSettings()
    name = "advmon-health.json" if args.board == "health" else "advmon-compare.json"
    board = boards(settings)[name].to_json_data(settings.context)
    values = {"job": args.job, "run": args.run, "run_a": args.run[0], "run_b": args.run_b or args.run[-1], "shift_a": ""}
    out = render_board(board, args.prometheus, values, args.out, range_seconds=parse_duration(args.range))
    print(f"wrote {out}")
    return 0


def entry_point() -> None:
    """Console-script entry point."""
    sys.exit(main())
