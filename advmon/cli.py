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

A RUN is a JSONL file (``FILE#RUN`` for one of several), ``mlflow+TRACKING_URI#RUN``,
a W&B offline run directory, ``tb+DIR`` or ``trackio+PROJECT#RUN``; see :mod:`advmon.runs`. ``summary`` and
``alerts check`` also take a directory of JSONL files (every run in it).

One convention for every command: exit code 0 when all is well, 1 for a finding (a
critical alert fired, two runs diverge, records could not be delivered), 2 for input
advmon cannot use (a missing or empty file, an unknown threshold, a package that is
not installed); problems are one line on stderr, ``advmon: error: ...`` or
``advmon: warning: ...``, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advmon.errors import AdvmonConfigError, AdvmonError

if TYPE_CHECKING:
    from advmon.record import Record

__all__ = ["BAD_INPUT", "FINDING", "OK", "entry_point", "main"]

#: Exit codes, the same for every command.
OK, FINDING, BAD_INPUT = 0, 1, 2

#: The boards ``advmon dashboards preview --board`` draws, and the file each is generated into (advmon.dashboards'
#: names, spelled here so that parsing the command line imports no dashboards).
BOARD_FILES = {"health": "advmon-health.json", "compare": "advmon-compare.json", "fleet": "advmon-fleet.json"}

#: The extra that installs each optional module a command may need.
EXTRAS = {"prometheus_client": "prometheus", "wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard",
          "grafanalib": "dashboards", "matplotlib": "dashboards"}


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


#: Stand-ins, in help texts, for the forms of a RUN and of a sink SPEC. They are filled in when help is shown
#: (:class:`_HelpFormatter`): the forms live in advmon.runs and advmon.config.specs, which import torch (through
#: advmon.record), and parsing ``advmon alerts generate`` or ``advmon dashboards generate`` must not.
_SOURCE_FORMS, _SPEC_FORMS, _THRESHOLD_NAMES = "{RUN sources}", "{sink SPECs}", "{threshold names}"


def _with_forms(text: str) -> str:
    """``text`` with the stand-ins replaced by the forms they stand for."""
    if _SOURCE_FORMS in text:
        from advmon.runs import SOURCE_FORMS

        text = text.replace(_SOURCE_FORMS, SOURCE_FORMS)
    if _SPEC_FORMS in text:
        from advmon.config.specs import SPEC_FORMS

        text = text.replace(_SPEC_FORMS, SPEC_FORMS)
    if _THRESHOLD_NAMES in text:
        from advmon.rules import THRESHOLDS

        text = text.replace(_THRESHOLD_NAMES, ", ".join(t.name for t in THRESHOLDS))
    return text


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with the run and sink forms filled in (see ``_SOURCE_FORMS``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        return _with_forms(text) if text else text

    def add_text(self, text: str | None) -> None:  # the description and the epilog
        super().add_text(_with_forms(text) if text else text)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help is :class:`_HelpFormatter`'s; its subcommands' parsers are ``_Parser`` too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def _command(commands: argparse._SubParsersAction, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand whose one line says what it does, in its parent's list and atop its own help."""
    return commands.add_parser(name, help=summary, description=summary[:1].upper() + summary[1:] + ".")


#: Help texts several commands share.
THRESHOLD_HELP = "override a threshold of the alert catalog, repeatable; NAME is one of " + _THRESHOLD_NAMES
FORMAT_HELP = "output format (default text; json for programs)"


def _parser() -> argparse.ArgumentParser:
    from advmon import __version__

    parser = _Parser(
        prog="advmon", description="Advantage monitoring for RL training of LLMs.",
        epilog="Exit codes: 0 all is well, 1 a finding (a critical alert fired, runs diverge, records not "
               "delivered), 2 input advmon cannot use. RUN sources: " + _SOURCE_FORMS + ".",
    )
    parser.add_argument("--version", action="version", version=f"advmon {__version__}",
                        help="print advmon's version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="what to do (advmon COMMAND --help for its options)")

    demo = _command(commands, "demo", "simulate a stable and an unstable GRPO run and summarise them")
    demo.add_argument("--steps", type=_positive_int, default=60, help="training steps per run (default 60)")
    demo.add_argument("--seed", type=_non_negative_int, default=0, help="random seed (default 0)")
    demo.add_argument("--out", type=Path, default=Path("advmon-runs"), help="directory for the JSONL files")
    demo.add_argument("--serve", action="store_true", help="keep the runs exposed on a local Prometheus endpoint")
    demo.add_argument("--port", type=_non_negative_int, default=9464, help="port for --serve (default 9464, 0: free)")
    demo.add_argument("--step-seconds", type=float, default=5.0, help="seconds per step with --serve (default 5)")

    summary = _command(commands, "summary", "last and worst values of recorded runs, and when instability began")
    summary.add_argument("sources", nargs="+", metavar="RUN", help=RUNS_HELP)
    summary.add_argument("--format", choices=("text", "json"), default="text", help=FORMAT_HELP)
    summary.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help=THRESHOLD_HELP)

    replay = _command(commands, "replay", "send the records of a JSONL file to sinks (exit 1 if some could not be)")
    replay.add_argument("file", type=Path, help="a JSONL file written by advmon")
    replay.add_argument(
        "--to", dest="specs", action="append", required=True, metavar="SPEC",
        help="sink spec, repeatable: " + _SPEC_FORMS,
    )
    replay.add_argument("--since-step", type=_non_negative_int, default=0, help="only records from this step on")
    replay.add_argument("--retries", type=_non_negative_int, default=3, help="attempts per record after the first")
    replay.add_argument("--resume", action="store_true",
                        help="append to a jsonl:PATH that already holds records (default: move that file aside)")
    _add_alert_commands(commands)
    _add_dashboard_commands(commands)
    _add_run_commands(commands)
    return parser


RUN_HELP = "one run: " + _SOURCE_FORMS
RUNS_HELP = "runs: " + _SOURCE_FORMS + ", or a directory of JSONL files (every run in it)"


def _add_run_commands(commands: argparse._SubParsersAction) -> None:
    report = _command(commands, "report", "an HTML page (or PNG) about a recorded run")
    report.add_argument("run", help=RUN_HELP)
    report.add_argument("--out", type=Path, default=None,
                        help="file to write (default report-<run>.html/.png beside the run's file; "
                             "in the current directory for an MLflow run)")
    report.add_argument("--format", choices=("html", "png"), default="html",
                        help="html: a self-contained page with every plot (default); png: one picture")
    report.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help=THRESHOLD_HELP)
    report.add_argument("--runbook-base", default="", metavar="URL",
                        help="where the runbooks page is hosted (default: the page carries the runbooks itself)")
    compare = _command(commands, "compare", "do two runs diverge, where, and in which statistic first")
    compare.add_argument("run_a", help=RUN_HELP)
    compare.add_argument("run_b", help=RUN_HELP)
    compare.add_argument("--format", choices=("text", "json"), default="text", help=FORMAT_HELP)
    compare.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write overlay plots here")
    compare.add_argument("--window", type=_positive_int, default=20, help="steps per compared window (default 20)")
    compare.add_argument("--z", type=float, default=4.0, help="|z| that counts as divergence (default 4)")
    compare.add_argument("--persistence", type=_positive_int, default=3, help="consecutive steps needed (default 3)")


def _add_dashboard_commands(commands: argparse._SubParsersAction) -> None:
    boards = _command(commands, "dashboards", "generate Grafana boards, or preview one as a PNG")
    verbs = boards.add_subparsers(dest="dashboards_command", required=True, metavar="VERB",
                                  help="generate or preview (advmon dashboards VERB --help for its options)")
    generate = _command(verbs, "generate", "write the boards and Grafana provisioning files")
    generate.add_argument("--out", type=Path, default=Path("dashboards"), help="directory to write (default dashboards/)")
    generate.add_argument("--datasource-uid", default="advmon-prometheus", help="uid of the Prometheus datasource")
    generate.add_argument("--prometheus-url", default="http://127.0.0.1:9090", help="URL of the provisioned datasource")
    generate.add_argument("--selector", default="", metavar="MATCHERS", help="label matchers for every query")
    generate.add_argument("--title", default="", metavar="PREFIX", help="put before each board's title")
    generate.add_argument("--runbook-base", default="", metavar="URL",
                          help="where the runbooks page is hosted: links to it (the advice of each alert travels anyway)")
    generate.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help=THRESHOLD_HELP)
    preview = _command(verbs, "preview", "draw a board from a Prometheus's data, without Grafana")
    preview.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus that scrapes the runs")
    preview.add_argument("--run", action="append", default=[], metavar="RUN",
                         help="run(s) to show, repeatable (run A for the compare board; the fleet board shows every run)")
    preview.add_argument("--run-b", metavar="RUN", help="run B, for the compare board")
    preview.add_argument("--board", choices=tuple(BOARD_FILES), default="health",
                         help="health: one run's on-call board (default); compare: run A against run B; "
                              "fleet: every run of the jobs, worst first")
    preview.add_argument("--job", default=".*", help="job regex (default all)")
    preview.add_argument("--range", default="1h", metavar="DURATION", help="time range to draw (default 1h)")
    preview.add_argument("--out", type=Path, default=Path("board.png"), help="PNG to write (default board.png)")


def _add_alert_commands(commands: argparse._SubParsersAction) -> None:
    alerts = _command(commands, "alerts", "generate alert rules, or check recorded runs against them")
    verbs = alerts.add_subparsers(dest="alerts_command", required=True, metavar="VERB",
                                  help="generate or check (advmon alerts VERB --help for its options)")
    generate = _command(verbs, "generate", "write Prometheus rules, Alertmanager config and promtool tests")
    generate.add_argument("--out", type=Path, default=Path("alerts"), help="directory to write (default alerts/)")
    generate.add_argument(
        "--interval", default="1m", metavar="DURATION",
        help="time between two records as Prometheus sees them: scrape interval or step time (default 1m)",
    )
    generate.add_argument("--for", dest="for_", metavar="DURATION", help="pending time of every rule that waits")
    generate.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help=THRESHOLD_HELP)
    generate.add_argument("--runbook-base", default="", metavar="URL",
                          help="where the runbooks page is hosted: links to it (the advice of each alert travels anyway)")
    generate.add_argument("--dashboard-url", default="", metavar="URL", help="on-call dashboard URL for messages")
    generate.add_argument("--selector", default="", metavar="MATCHERS", help="label matchers for every metric, e.g. 'job=\"grpo\"'")
    generate.add_argument(
        "--slack-webhook-file", default=None, metavar="PATH",
        help="file Alertmanager reads the Slack webhook URL from (default /etc/alertmanager/secrets/slack-webhook-url)",
    )
    generate.add_argument("--slack-channel", default="", metavar="CHANNEL", help="Slack channel override")
    check = _command(verbs, "check", "evaluate the alert catalog over recorded runs (exit 1 if a critical fired)")
    check.add_argument("sources", nargs="+", metavar="RUN", help=RUNS_HELP)
    check.add_argument("--format", choices=("text", "json"), default="text", help=FORMAT_HELP)
    check.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE", help=THRESHOLD_HELP)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code: :data:`OK`, :data:`FINDING` or :data:`BAD_INPUT`.

    Example:
        >>> main(["alerts", "check", "no-such-run.jsonl"])  # says "advmon: error: ..." on stderr
        2
    """
    args = _parser().parse_args(argv)  # a usage error: argparse prints the usage and exits 2
    with _warnings_as_lines():
        try:
            return COMMANDS[args.command](args)
        except ModuleNotFoundError as exc:
            extra = EXTRAS.get((exc.name or "").partition(".")[0])
            hint = f": pip install 'advmon[{extra}]'" if extra else ""
            return _error(f"{exc.name} is not installed{hint}")
        except (AdvmonError, OSError) as exc:
            return _error(str(exc))


def _error(message: str) -> int:
    from advmon.redact import scrub

    print(f"advmon: error: {_unprefixed(scrub(message))}", file=sys.stderr)
    return BAD_INPUT


def _unprefixed(message: str) -> str:
    """advmon's messages start with ``advmon:`` where they reach a log; the CLI says it once."""
    return message.removeprefix("advmon: ")


@contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Every warning a command raises is one ``advmon: warning: ...`` line on stderr, said when it happens."""
    from advmon.redact import scrub

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 - warnings' API
        print(f"advmon: warning: {_unprefixed(scrub(str(message)))}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


def _demo(args: argparse.Namespace) -> int:
    from advmon.demo import DemoConfig, run_demo, serve_demo

    config = DemoConfig(steps=args.steps, seed=args.seed, out=args.out)
    if args.serve:
        serve_demo(config, port=args.port, step_seconds=args.step_seconds)
    else:
        said: list[str] = []

        def say(section: str) -> None:  # each section as soon as it is ready: the header before any progress
            print(("\n" if said else "") + section, flush=True)
            said.append(section)

        run_demo(config, say=say)
    return OK


def _summary(args: argparse.Namespace) -> int:
    import json

    from advmon.reports.terminal import format_summary, summary_data
    from advmon.rules import Thresholds
    from advmon.runs import read_runs

    thresholds = Thresholds.parse(args.threshold)
    runs = [run for source in args.sources for run in read_runs(source)]
    if args.format == "json":
        print(json.dumps([summary_data(run.name, run.records, run.source, thresholds) for run in runs], indent=2))
    else:
        print("\n\n".join(format_summary(run.name, run.records, run.source, thresholds) for run in runs))
    return OK


def _alerts(args: argparse.Namespace) -> int:
    from advmon.alerts.cli import check, generate

    if args.alerts_command == "generate":
        return generate(args)
    return check(args.sources, args.format, args.threshold)


def redact_spec(spec: str) -> str:
    """A sink spec as it may be printed: a URL's password and tokens masked."""
    from advmon.redact import redact_url

    kind, sep, argument = spec.partition(":")
    return f"{kind}{sep}{redact_url(argument)}" if "://" in argument else spec


def _replay(path: Path, specs: list[str], since_step: int, retries: int, resume: bool = False) -> int:
    from advmon.config.specs import parse_spec
    from advmon.redact import remember_secrets
    from advmon.runs import read_runs

    for spec in specs:
        parse_spec(spec)
        remember_secrets(spec.partition(":")[2])
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        example = f", e.g. {files[0]}" if files else ""
        raise AdvmonError(f"{path} is a directory: replay sends one JSONL file, pass one of its files{example}")
    # The records a reader of the file sees: where a run's steps start again, the later record of each step.
    records = [r for run in read_runs(path) for r in run.records if r.step >= since_step]
    failed = 0
    for spec in specs:
        for run in dict.fromkeys(r.run for r in records):
            mine = [r for r in records if r.run == run]
            failed += _replay_run(path, spec, run, mine, retries, resume)
    if failed:
        print(f"advmon: error: {failed} record(s) could not be sent; they stay in {path}: run the replay again",
              file=sys.stderr)
        return FINDING
    return OK


def _replay_run(path: Path, spec: str, run: str, records: list[Record], retries: int, resume: bool) -> int:
    """Send one run's records to one sink; how many could not be sent, said in one line with the first error."""
    from advmon.config.specs import sink_from_spec
    from advmon.redact import scrub
    from advmon.sinks.delivery import DeliveryPolicy, attach_sink, write_with_retries
    from advmon.sinks.jsonl import JsonlSink

    sink = sink_from_spec(spec, run)
    if isinstance(sink, JsonlSink):
        sink.resume = resume
        sink.resume_hint = f"'advmon replay {path} --to {spec} --resume'"
    attach_sink(sink, run, [spec.partition(":")[0]])
    policy = DeliveryPolicy(retries=retries)
    accept = getattr(sink, "accept", None)
    unsent: list[tuple[int, BaseException]] = []
    for record in records:
        if callable(accept):
            accept(record)  # what a monitor does for every record before queueing it
        error = write_with_retries(sink, record, policy)
        if error is not None:
            unsent.append((record.step, error))
    close = getattr(sink, "close", None)
    if callable(close):
        close()
    if unsent:
        (first_step, error), last_step = unsent[0], unsent[-1][0]
        steps = f"step {first_step}" if len(unsent) == 1 else f"steps {first_step}-{last_step}"
        print(scrub(f"advmon: warning: {len(unsent)} of {len(records)} record(s) of run {run} ({steps}) not sent "
                    f"to {redact_spec(spec)}: {type(error).__name__}: {error}"), file=sys.stderr)
    print(f"replayed {len(records) - len(unsent)} record(s) of run {run} to {redact_spec(spec)}")
    return len(unsent)


def _report(args: argparse.Namespace) -> int:
    from advmon.reports.html_page import write_png, write_report
    from advmon.rules import Thresholds
    from advmon.runs import read_run

    thresholds = Thresholds.parse(args.threshold)
    run = read_run(args.run)
    out = args.out or default_report_path(run, args.format)
    if args.format == "png":
        write_png(run, out, thresholds)
        print(f"wrote {out}")
    else:
        write_report(run, out, thresholds, args.runbook_base)
        print(f"wrote {out}: open it in a browser")
    return OK


def default_report_path(run, suffix: str) -> Path:  # noqa: ANN001 - a runs.Run
    """``report-<run>.<suffix>`` beside the run's file (as ``advmon demo`` writes it); for an MLflow or trackio run,
    here."""
    source = run.source.removeprefix("tb+")
    if source.startswith(("mlflow+", "trackio+")):
        return Path(f"report-{run.name}.{suffix}")
    return Path(source).parent / f"report-{run.name}.{suffix}"


def _compare(args: argparse.Namespace) -> int:
    from advmon.reports.compare import compare_runs, write_comparison_html
    from advmon.runs import read_run

    comparison = compare_runs(read_run(args.run_a), read_run(args.run_b), args.window, args.z, args.persistence)
    print(comparison.to_json() if args.format == "json" else comparison.to_text())
    if args.html is not None:
        write_comparison_html(comparison, args.html)
        if args.format == "text":
            print(f"wrote {args.html}")
    return FINDING if comparison.diverged else OK


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
        return OK
    from advmon.dashboards.preview import render_board

    if not args.run and args.board != "fleet":
        raise AdvmonConfigError(f"the {args.board} board shows chosen runs: pass --run RUN")
    settings = DashboardSettings()
    board = boards(settings)[BOARD_FILES[args.board]].to_json_data(settings.context)
    runs = args.run or [".*"]
    values = {"job": args.job, "run": runs, "run_a": runs[0], "run_b": args.run_b or runs[-1], "shift_a": ""}
    out = render_board(board, args.prometheus, values, args.out, range_seconds=parse_duration(args.range))
    print(f"wrote {out}")
    return OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo, "summary": _summary, "replay": lambda args: _replay(args.file, args.specs, args.since_step,
                                                                        args.retries, args.resume),
    "alerts": _alerts, "dashboards": _dashboards, "report": _report, "compare": _compare,
}


def entry_point() -> None:
    """Console-script entry point."""
    sys.exit(main())
