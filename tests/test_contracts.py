"""The docs' tables of a contract say what the code's one table says (issue 39).

Each contract has one source in the code: the Prometheus metrics (``advmon.sinks.prometheus.METRICS``, which the
collector serves and the generated rules and boards read), the sink specs (``advmon.config.specs.SINK_SPECS``), the
normalization kinds (``advmon.normalization.KINDS``) and each framework estimator's (the integrations' tables), the
exit codes (``advmon.cli``), the ``ADVMON_*`` variables (``advmon.config.environment.VARIABLES``, which every
variable the code names is in), the extras (``pyproject.toml``) and the version (``advmon.__version__``). Each test
reads the markdown table that restates one and names the row that is missing, extra or wrong: a metric, spec, kind,
exit code or variable added in code and not in the docs fails here.
"""

from __future__ import annotations

import inspect
import itertools
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


# --- reading markdown tables ---------------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    """The cells of one table row; ``\\|`` is a ``|`` inside a cell."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def table(path: Path, header: list[str]) -> list[list[str]]:
    """The body rows of the table in ``path`` whose header row is ``header`` (cells as written)."""
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        if line.lstrip().startswith("|") and _cells(line) == header:
            rows = []
            for body in lines[index + 2 :]:
                if not body.lstrip().startswith("|"):
                    break
                rows.append(_cells(body))
            return rows
    raise AssertionError(f"{path.relative_to(ROOT)} has no table headed | {' | '.join(header)} |")


def backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def expand_braces(name: str) -> list[str]:
    """``advmon_reward_{mean,std}`` -> ``advmon_reward_mean``, ``advmon_reward_std``."""
    match = re.search(r"\{([^}]*)\}", name)
    if match is None:
        return [name]
    return [expanded for choice in match.group(1).split(",")
            for expanded in expand_braces(name[: match.start()] + choice + name[match.end() :])]


def differences(what: str, documented: dict[Any, Any], code: dict[Any, Any], source: str) -> list[str]:
    """One line per row missing from the docs, extra in them, or saying something else than ``source`` (the code's
    table); a value ``None`` means the row only has to be there."""
    lines = [f"{what} lacks {key!r}"
             + (f", which {source} has" if code[key] is None else f": {source} has {code[key]!r}")
             for key in code if key not in documented]
    lines += [f"{what} has {key!r}, which {source} does not" for key in documented if key not in code]
    lines += [f"{what} says {key!r} is {documented[key]!r}; {source} says {code[key]!r}"
              for key in code if key in documented and documented[key] != code[key]]
    return lines


# --- Prometheus metrics ------------------------------------------------------------------------------------------


def documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """docs/sinks.md's metric table: name -> (type, labels besides run)."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for metric, kind, labels, _ in table(DOCS / "sinks.md", ["metric", "type", "labels (besides `run`)", "what it is"]):
        label_names = tuple(re.match(r"[a-z_]+", label).group(0) for label in backticked(labels))
        for written in backticked(metric):
            for name in expand_braces(written):
                found[name] = (kind, label_names)
    return found


def test_the_metric_table_of_sinks_md_is_the_code_s_list():
    from advmon.sinks.prometheus import METRICS

    problems = differences("docs/sinks.md's metric table", documented_metrics(), METRICS,
                           "advmon.sinks.prometheus.METRICS")
    assert not problems, "\n".join(problems)


def _served_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """What a collector serves after a record with every optional part: slices, reward functions, NaN, a kind."""
    import torch

    import advmon
    from advmon.sinks.prometheus import AdvmonCollector

    with advmon.Monitor("contracts", sinks=[], reward_range=(0.0, 1.0)) as monitor:
        rewards = torch.tensor([1.0, 0.0, 1.0, float("nan"), 0.0, 0.0, 1.0, 1.0])
        monitor.observe(rewards=rewards, advantages=torch.nan_to_num(rewards) - 0.5, group_size=4,
                        slices=["math"] * 4 + ["code"] * 4, normalization="group_mean",
                        reward_functions={"correctness": rewards, "format": torch.ones(8)})
        record = monitor.last_record
    collector = AdvmonCollector("contracts", sink_names=["jsonl"])
    collector.update(record)
    served = {}
    for family in collector.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = dict.fromkeys(label for sample in family.samples for label in sample.labels if label != "run")
        served[name] = (family.type, tuple(labels))
    return served


def test_the_collector_serves_exactly_the_code_s_list():
    from advmon.sinks.prometheus import METRICS

    problems = differences("advmon.sinks.prometheus.METRICS", METRICS, _served_metrics(),
                           "the collector (what a scrape reads)")
    assert not problems, "\n".join(problems)


# --- sink specs --------------------------------------------------------------------------------------------------


def test_the_spec_table_of_sinks_md_is_the_code_s_list():
    from advmon.config.specs import SINK_SPECS

    documented = {backticked(spec)[0]: None for spec, _ in table(DOCS / "sinks.md", ["spec", "sink"])}
    code = dict.fromkeys(SINK_SPECS.values(), None)
    problems = differences("docs/sinks.md's spec table", documented, code, "advmon.config.specs.SINK_SPECS")
    assert not problems, "\n".join(problems)


def test_the_unknown_sink_error_lists_the_sinks_as_sinks_and_the_notifiers_apart():
    from advmon.config.specs import NOTIFIER_SPECS, SINK_SPECS, SPEC_FORMS, parse_spec
    from advmon.errors import AdvmonConfigError

    with pytest.raises(AdvmonConfigError) as error:
        parse_spec("kafka:x")
    message = str(error.value)
    sinks_part, _, notifiers_part = message.partition("alert notifiers")
    assert all(form in sinks_part for form in SINK_SPECS.values()), message
    assert not any(form in sinks_part for form in NOTIFIER_SPECS.values()), message
    assert all(form in notifiers_part for form in NOTIFIER_SPECS.values()), message
    assert not any(form in SPEC_FORMS for form in NOTIFIER_SPECS.values())  # what replay --to's help lists


def test_the_readme_names_every_sink():
    from advmon.config.specs import SINK_SPECS

    names = {"jsonl": "JSONL", "wandb": "Weights & Biases", "mlflow": "MLflow", "tensorboard": "TensorBoard",
             "trackio": "trackio", "prometheus": "Prometheus", "pushgateway": "Pushgateway",
             "ray-metrics": "Ray's metrics agent"}
    assert set(names) == set(SINK_SPECS), "a sink was added: give it its name here and in README.md"
    readme = " ".join((ROOT / "README.md").read_text().split())
    sentence = readme[readme.index("Records go to") :].split(", delivered")[0]
    assert not (missing := [name for name in names.values() if name not in sentence]), \
        f"README.md's 'Records go to ...' lacks {missing}"


# --- ADVMON_* variables ------------------------------------------------------------------------------------------


def test_the_variable_table_of_integrations_md_is_the_code_s_list():
    from advmon.config.environment import VARIABLES

    rows = table(DOCS / "integrations.md", ["variable", "meaning"])
    documented = {name: None for variable, _ in rows for name in backticked(variable)}
    code = dict.fromkeys(VARIABLES, None)
    problems = differences("docs/integrations.md's variable table", documented, code,
                           "advmon.config.environment.VARIABLES")
    assert not problems, "\n".join(problems)


def test_every_variable_the_code_names_is_in_the_code_s_list():
    from advmon.config.environment import INTERNAL_VARIABLES, VARIABLES

    named: dict[str, str] = {}
    for path in sorted((ROOT / "advmon").rglob("*.py")):
        for name in re.findall(r"[\"'`](ADVMON_[A-Z_]+)\b", path.read_text()):
            named.setdefault(name, str(path.relative_to(ROOT)))
    listed = {*VARIABLES, *INTERNAL_VARIABLES}
    unlisted = {name: where for name, where in named.items() if name not in listed}
    assert not unlisted, f"variables the code names but advmon.config.environment.VARIABLES lacks: {unlisted}"


# --- exit codes --------------------------------------------------------------------------------------------------


def test_the_exit_codes_of_cli_md_are_the_code_s():
    from advmon import cli

    text = (DOCS / "cli.md").read_text()
    section = text[text.index("## Exit codes") :].split("\n## ")[0]
    documented = {int(code): None for code in re.findall(r"^- \*\*(\d+)\*\*:", section, re.MULTILINE)}
    code = dict.fromkeys((cli.OK, cli.FINDING, cli.BAD_INPUT), None)
    problems = differences("docs/cli.md's exit codes", documented, code, "advmon.cli (OK, FINDING, BAD_INPUT)")
    assert not problems, "\n".join(problems)


# --- normalization kinds per framework estimator ----------------------------------------------------------------


def _kinds_returned(function: Any) -> set[str]:
    """The kinds a function of the call's arguments may return: the kinds its source names."""
    from advmon.normalization import KINDS

    return {name for name in re.findall(r"\"([a-z_]+)\"", inspect.getsource(function)) if name in KINDS}


def _possible(value: Any) -> tuple[frozenset[str], bool]:
    """(kinds an integration's table entry may declare, whether it may declare none: inferred)."""
    if value is None:
        return frozenset(), True
    if callable(value):
        return frozenset(_kinds_returned(value)), False
    return frozenset({value}), False


def _openrlhf_possible(estimator: str) -> tuple[frozenset[str], bool]:
    from advmon.integrations.openrlhf import normalization_of

    results = set()
    for no_std_norm, kl_in_rewards in itertools.product((False, True), repeat=2):
        args = SimpleNamespace(algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator,
                                                                                 no_std_norm=no_std_norm)))
        results.add(normalization_of(args, kl_in_rewards))
    return frozenset(results - {None}), None in results


def code_kinds() -> dict[tuple[str, str], tuple[frozenset[str], bool]]:
    from advmon.integrations import nemo_rl, openrlhf, skyrl, verl

    kinds: dict[tuple[str, str], tuple[frozenset[str], bool]] = {}
    for framework, entries in (("verl", verl.NORMALIZATION), ("SkyRL", skyrl.NORMALIZATION),
                               ("NeMo-RL", {name: names.normalization for name, names in nemo_rl.ESTIMATORS.items()})):
        kinds.update({(framework, name): _possible(value) for name, value in entries.items()})
    kinds.update({("OpenRLHF", name): _openrlhf_possible(name) for name in openrlhf.NORMALIZATION})
    return kinds


def documented_kinds() -> dict[tuple[str, str], tuple[frozenset[str], bool]]:
    from advmon.normalization import KINDS

    return {(framework, backticked(estimator)[0]): (frozenset(k for k in backticked(kind) if k in KINDS),
                                                    "inferred" in kind)
            for framework, estimator, kind in table(DOCS / "alerts.md", ["framework", "estimator", "kind"])}


def test_the_kinds_of_alerts_md_are_the_code_s():
    from advmon.normalization import KINDS

    header = ["kind", "a healthy step's bound (`advantages/bound_ratio` = |A| over it)", "estimators"]
    documented = {backticked(kind)[0]: None for kind, *_ in table(DOCS / "alerts.md", header)}
    problems = differences("docs/alerts.md's table of kinds", documented, dict.fromkeys(KINDS),
                           "advmon.normalization.KINDS")
    assert not problems, "\n".join(problems)


def test_the_kind_table_of_alerts_md_is_the_integrations_tables():
    def readable(kinds: dict) -> dict:
        return {f"{framework} {estimator}": (sorted(names), "inferred" if inferred else "never inferred")
                for (framework, estimator), (names, inferred) in kinds.items()}

    problems = differences("docs/alerts.md's kind table", readable(documented_kinds()), readable(code_kinds()),
                           "advmon.integrations (verl, skyrl, nemo_rl, openrlhf)")
    assert not problems, "\n".join(problems)


# --- extras, versions ----------------------------------------------------------------------------------------------


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_extras_table_of_quickstart_md_is_pyproject_s():
    documented = {backticked(extra)[0]: None for extra, *_ in table(DOCS / "quickstart.md",
                                                                             ["extra", "pulls", "for"])}
    code = dict.fromkeys(_pyproject()["project"]["optional-dependencies"], None)
    problems = differences("docs/quickstart.md's extras table", documented, code,
                           "pyproject.toml's optional-dependencies")
    assert not problems, "\n".join(problems)


def changelog_versions() -> list[str]:
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)


def test_the_changelog_s_latest_version_is_the_package_s():
    """``advmon.__version__`` is the one version: pyproject.toml reads it (no version of its own), ``advmon
    --version`` prints it, and CHANGELOG.md's latest section names it. A literal, so that ``advmon --help`` never
    searches the installed distributions for it (200 ms in a full environment)."""
    import advmon

    pyproject = _pyproject()
    assert "version" not in pyproject["project"] and "version" in pyproject["project"].get("dynamic", []), \
        "pyproject.toml reads its version from advmon/__init__.py (one source): no version of its own"
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "advmon.__version__"}
    versions = changelog_versions()
    assert versions, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' section"
    assert versions[0] == advmon.__version__, \
        f"CHANGELOG.md's latest version is {versions[0]}; advmon.__version__ is {advmon.__version__}"


def test_compare_md_states_the_window_and_the_json_rounding():
    from advmon.reports.compare import _json_number, compare_runs

    text = " ".join((DOCS / "compare.md").read_text().split())
    window = inspect.signature(compare_runs).parameters["window"].default
    assert f"at least `window` common steps ({window} by default)" in text
    assert "rounds `max_abs_z`, `mean_a` and `mean_b` to 6 decimal places" in text
    assert _json_number(0.123456789) == 0.123457 and _json_number(4e-7) == 0.0


def test_every_metric_the_generated_rules_and_boards_read_is_in_the_code_s_list():
    """The rules, their promtool tests and the boards read only metrics a sink serves (recording rules'
    ``level:metric:operations`` names and Ray's ``ray_`` copies aside)."""
    from advmon.sinks.prometheus import METRICS

    read: dict[str, str] = {}
    for path in sorted([*(ROOT / "alerts").rglob("*.yml"), *(ROOT / "dashboards").glob("*.json")]):
        for name in re.findall(r"(?<![\w:])advmon_[a-z_]+\b(?!:)", path.read_text()):
            read.setdefault(name, str(path.relative_to(ROOT)))
    assert read, "no generated rules or boards found"
    unknown = {name: where for name, where in read.items() if name not in METRICS}
    assert not unknown, f"metrics the generated files read that advmon.sinks.prometheus.METRICS lacks: {unknown}"
