"""The catalog, the generators and the CLI start without torch (issue 29, item 6).

Each check runs in a fresh interpreter (this one has torch loaded already), with the
repository's advmon first on the path, and asserts on that interpreter's ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Modules whose import must leave torch out: the package, the catalog, the alert and dashboard generators, the CLI.
LIGHT_MODULES = [
    "advmon",
    "advmon.errors",
    "advmon.rules",
    "advmon.alerts",
    "advmon.alerts.prometheus_rules",
    "advmon.alerts.alertmanager",
    "advmon.alerts.runbooks",
    "advmon.alerts.evaluator",
    "advmon.alerts.cli",
    "advmon.dashboards",
    "advmon.dashboards.boards",
    "advmon.dashboards.build",
    "advmon.dashboards.queries",
    "advmon.dashboards.lint",
    "advmon.cli",
]


def _run(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last, which is returned."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Appended to a statement: print what it loaded.
_LOADED = """
import json, sys
print(json.dumps({"torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules,
                  "advmon": sys.modules["advmon"].__file__}))
"""


def test_the_subprocess_sees_this_checkout():
    assert _run("import advmon" + _LOADED)["advmon"] == str(ROOT / "advmon" / "__init__.py")


def test_the_check_sees_torch_where_it_is_imported():
    """The check itself can fail: the engine does import torch."""
    assert _run("import advmon.stats" + _LOADED)["torch"]
    assert _run("import advmon; advmon.Monitor" + _LOADED)["torch"]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_importing_leaves_torch_out(module: str):
    loaded = _run(f"import {module}" + _LOADED)
    assert not loaded["torch"], f"import {module} imports torch"
    assert not loaded["numpy"], f"import {module} imports numpy"


@pytest.mark.parametrize("argv", [
    ["alerts", "generate", "--out", "{out}", "--interval", "30s", "--threshold", "zero_std_ratio=0.6"],
    ["dashboards", "generate", "--out", "{out}", "--selector", 'job="grpo"'],
], ids=["alerts", "dashboards"])
def test_generating_leaves_torch_out(argv: list[str], tmp_path: Path):
    """The console script's own path: ``entry_point`` parses ``sys.argv`` and exits with the command's code."""
    argv = [a.replace("{out}", str(tmp_path)) for a in argv]
    loaded = _run("""
        import json, sys
        from advmon.cli import entry_point
        sys.argv = ["advmon", *sys.argv[1:]]
        try:
            entry_point()
            code = None
        except SystemExit as exit:
            code = exit.code
        print(json.dumps({"code": code, "torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules}))
    """, *argv)
    assert loaded["code"] in (0, None), loaded
    assert not loaded["torch"], f"advmon {' '.join(argv[:2])} imports torch"
    assert not loaded["numpy"], f"advmon {' '.join(argv[:2])} imports numpy"
    assert len(list(tmp_path.rglob("*.yml")) + list(tmp_path.rglob("*.json"))) >= 3


def test_help_still_lists_the_run_and_sink_forms():
    """The help fills in the forms it no longer imports up front, for subcommands as for the program."""
    from advmon.cli import _parser
    from advmon.config.specs import SPEC_FORMS
    from advmon.runs import SOURCE_FORMS

    parser = _parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    flat = " ".join(parser.format_help().split())
    assert " ".join(SOURCE_FORMS.split()) in flat
    for name, forms in (("summary", SOURCE_FORMS), ("report", SOURCE_FORMS), ("replay", SPEC_FORMS)):
        text = " ".join(commands[name].format_help().split())
        assert " ".join(forms.split()) in text, name
        assert "{RUN sources}" not in text and "{sink SPECs}" not in text, name


def test_public_names_resolve_on_first_use():
    loaded = _run("""
        import json, sys
        import advmon
        before = "torch" in sys.modules
        from advmon import Monitor, watch
        from advmon import *
        import advmon.hooks, advmon.monitor, advmon.normalization, advmon.record, advmon.sinks
        expected = {
            "Monitor": advmon.monitor.Monitor, "get_monitor": advmon.monitor.get_monitor,
            "set_monitor": advmon.monitor.set_monitor, "ArgumentNames": advmon.hooks.ArgumentNames,
            "tap": advmon.hooks.tap, "sliced_by": advmon.hooks.sliced_by, "scored_by": advmon.hooks.scored_by,
            "watch": advmon.hooks.watch,
            "NORMALIZATION_KINDS": advmon.normalization.KINDS, "Normalization": advmon.normalization.Normalization,
            "Record": advmon.record.Record, "JsonlSink": advmon.sinks.JsonlSink, "Sink": advmon.sinks.Sink,
            "read_jsonl": advmon.sinks.read_jsonl,
        }
        wrong = [n for n, value in expected.items()
                 if getattr(advmon, n) is not value or (n in advmon.__all__ and globals()[n] is not value)]
        missing = [n for n in advmon.__all__ if n not in globals()]
        try:
            advmon.no_such_name
            unknown = "resolved"
        except AttributeError as exc:
            unknown = str(exc)
        print(json.dumps({"before": before, "after": "torch" in sys.modules, "wrong": wrong, "missing": missing,
                          "same": Monitor is advmon.Monitor, "unknown": unknown, "version": advmon.__version__,
                          "dir": dir(advmon)}))
    """)
    assert not loaded["before"] and loaded["after"]
    assert loaded["wrong"] == [] and loaded["missing"] == [] and loaded["same"]
    assert loaded["unknown"] == "module 'advmon' has no attribute 'no_such_name'"
    assert loaded["version"]
    import advmon

    public = set(advmon.__all__) | {"ArgumentNames", "Normalization", "__version__"}
    assert public <= set(loaded["dir"])
    assert public <= set(dir(advmon))


def test_watch_and_instrument_work_from_a_fresh_import():
    """``advmon.watch`` loads on first use, and ``advmon.instrument`` (defined in advmon/__init__.py) loads what it
    calls when it is called."""
    loaded = _run("""
        import json
        import advmon
        import torch

        monitor = advmon.Monitor("fresh", sinks=[])
        advmon.set_monitor(monitor)

        @advmon.watch(groups=None)
        def estimate(rewards, mask):
            return rewards - rewards.mean()

        class Estimator:
            def compute_advantage(self, prompt_ids, rewards, mask):
                return rewards - rewards.mean()

        estimate(torch.tensor([1.0, 3.0]), None)
        watched = monitor.last_metrics["rewards/mean"]
        advmon.instrument(Estimator(), monitor).compute_advantage(None, torch.tensor([2.0, 6.0]), None)
        advmon.flush()
        print(json.dumps({"watched": watched, "instrumented": monitor.last_metrics["rewards/mean"]}))
    """)
    assert loaded == {"watched": 2.0, "instrumented": 4.0}


def test_alerts_sink_still_resolves():
    from advmon.alerts import AlertSink
    from advmon.alerts.sink import AlertSink as defined

    import advmon.alerts

    assert AlertSink is defined is advmon.alerts.AlertSink
    assert "AlertSink" in dir(advmon.alerts)
    with pytest.raises(AttributeError):
        advmon.alerts.NoSuchName  # noqa: B018


def test_reading_a_recorded_run_leaves_torch_and_the_engine_out(tmp_path: Path):
    """Issue 36, item 5: the record's words need no engine, so ``advmon report``, ``compare`` and ``summary``
    (and every reader behind them) load neither torch nor ``advmon.stats``. One fresh interpreter runs all three."""
    from advmon.simulation import RunSpec, simulate

    specs = [RunSpec("grpo_binary", seed=seed, steps=24, onset=30, prompts=4) for seed in (0, 1)]
    for spec in specs:
        simulate(spec, tmp_path)
    a, b = (str(tmp_path / f"{spec.name}.jsonl") for spec in specs)
    loaded = _run("""
        import json, sys
        from advmon.cli import main
        codes = [main(["summary", sys.argv[1]]), main(["report", sys.argv[1], "--out", sys.argv[3]]),
                 main(["compare", sys.argv[1], sys.argv[2]])]
        print(json.dumps({"codes": codes, "torch": "torch" in sys.modules,
                          "engine": sorted(m for m in sys.modules if m.startswith("advmon.stats"))}))
    """, a, b, str(tmp_path / "a.html"))
    assert loaded["codes"][:2] == [0, 0] and loaded["codes"][2] in (0, 1), loaded
    assert (tmp_path / "a.html").exists()
    assert not loaded["torch"], "advmon summary/report/compare import torch"
    assert loaded["engine"] == [], loaded["engine"]
