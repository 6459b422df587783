from __future__ import annotations

import logging
import os

import pytest

# One intra-op thread per test process, and for the processes the tests start (they inherit it): make test
# runs a worker per core, and a second OpenMP thread per worker only waits for a core another worker holds.
# Tiny ops suffer most: a TRL zoo case ran 20x slower with two threads on two busy cores than with one. A
# test about thread counts sets its own (test_host_half); an OMP_NUM_THREADS of the caller's is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray's workers at the suite's own priority (Ray renices them to 15, RAY_worker_niceness): beside three busy
# test processes on two cores a nice-15 actor got a few percent of a core, and importing torch and verl in it
# took three minutes, not ten seconds (the Ray tests and the docs' Ray snippet; the processes they start inherit it).
os.environ.setdefault("RAY_worker_niceness", "0")

import torch  # noqa: E402 - after OMP_NUM_THREADS, which torch reads when it loads

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Without a GPU, Triton runs its kernels on CPU tensors with NumPy; it reads this when a
# kernel is defined, so it is set before any test imports advmon's Triton modules. Set, not
# defaulted: an inherited TRITON_INTERPRET=0 would leave the kernels nothing to run on.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import advmon
from advmon.record import Record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What a test that forgot its temporary directory leaves in the working directory (the repository):
#: MLflow's default store and artifacts, W&B's run folder, advmon's default run directory.
STRAY_OUTPUTS = ("mlruns", "mlflow.db", "wandb", "advmon-runs")


def _stray_outputs() -> set[str]:
    """The paths under ``STRAY_OUTPUTS`` in the repository root, one level deep."""
    found = set()
    for name in STRAY_OUTPUTS:
        path = os.path.join(ROOT, name)
        if os.path.exists(path):
            found.add(name)
            if os.path.isdir(path):
                found.update(f"{name}/{entry}" for entry in os.listdir(path))
    return found


#: Python's logging tree as the suite found it. AReaL's ``areal.utils.logging.getLogger`` (called when its
#: modules load and when a PPOActor is made) replaces ``Logger.root`` and ``Logger.manager`` with new ones, so
#: named loggers made afterwards no longer reach ``logging.root``'s handlers (pytest's caplog among them).
_LOGGING_TREE = (logging.Logger.root, logging.Logger.manager)


@pytest.fixture(autouse=True)
def _logging_tree_as_found() -> None:
    """Each test starts with the process's own logging tree, whatever an earlier test imported."""
    if (logging.Logger.root, logging.Logger.manager) != _LOGGING_TREE:
        logging.Logger.root, logging.Logger.manager = _LOGGING_TREE


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._advmon_outputs_before = _stray_outputs()  # a demo's advmon-runs/ from before is not ours


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a test wrote into the repository instead of its temporary directory."""
    before = getattr(session.config, "_advmon_outputs_before", None)
    if before is None or hasattr(session.config, "workerinput"):
        return
    new = sorted(_stray_outputs() - before)
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"tests wrote into the repository ({ROOT}), not a temporary directory: {', '.join(new)}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


#: Tests of half a minute and more in make test (docs/performance.md, "The test suite's time"): started first,
#: so that the run does not end with one worker busy on one of them while the others wait.
SLOW_FIRST = (
    "tests/test_alert_zoo.py::test_healthy_runs_raise_no_alert_at_any_reward_scale[trl/",
    "tests/test_alert_zoo.py::test_every_fault_is_flagged_within_ten_steps_of_its_onset[trl/",
    "tests/test_fleet_remote_write.py::",
    "tests/test_install.py::test_what_the_docs_say_to_run_after_make_demo_works_after_make_demo",
    "tests/test_install.py::test_the_quickstart_install_works_in_a_fresh_venv",
    "tests/test_mlflow.py::test_a_dead_server_never_stops_training_and_replay_backfills",
    "tests/test_device_paths.py::test_the_gpu_profile_runs",
    "tests/test_device_paths.py::test_the_gpu_benchmark_runs",
    "tests/test_no_silent_skips.py::",
    "tests/test_alert_zoo.py::test_healthy_runs_raise_no_alert_at_any_reward_scale[verl/tir_optimal_token_baseline]",
    "tests/test_alert_zoo.py::test_healthy_runs_raise_no_alert_at_any_reward_scale[verl/gdpo]",
    "tests/test_report_compare.py::test_a_long_run_reports_with_a_progress_bar",
    "tests/test_groups.py::test_group_means_stay_exact_in_a_large_batch",
    "tests/test_mlflow.py::test_exemplars_go_to_json_artifacts_at_troubled_steps_and_every_n",
)
#: Modules whose tests share a module-scoped set-up (a Ray cluster; a Prometheus over prepared runs; a page
#: Chromium drew; the demo's boards drawn over a real Prometheus): each runs on one xdist worker, which sets it up
#: once (make test's ``--dist loadgroup``, scheduled by ``pytest_xdist_make_scheduler`` below).
SHARED_SET_UP = ("tests/test_dashboards.py", "tests/test_integration_ray.py", "tests/test_report_layout.py",
                 "tests/test_preview_looks.py")


def shared_set_up(nodeid: str) -> str | None:
    """The module of ``SHARED_SET_UP`` a test id belongs to, if any."""
    module = nodeid.split("::")[0]
    return module if module in SHARED_SET_UP else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest tests first, then the shared set-ups, then the rest in their order."""
    items.sort(key=lambda item: 0 if item.nodeid.startswith(SLOW_FIRST) else
               1 if shared_set_up(item.nodeid) else 2)  # a stable sort


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist has no such hook to validate
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with a group per module of ``SHARED_SET_UP``, every other test a unit of its own.

    xdist's own groups (an ``xdist_group`` mark, which its worker appends to the test's id) are lost on pytest 9:
    the id is no longer the attribute xdist 3.8 rewrites, so every worker that got one of a module's tests set the
    module up again (three Ray clusters, four Prometheus set-ups of the dashboards, in one run). This scheduler
    groups by the ids the workers report, which need nothing rewritten.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedSetUpScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shared_set_up(nodeid) or super()._split_scope(nodeid)

    return SharedSetUpScheduling(config, log)


def _starts_workers(config: pytest.Config) -> bool:
    """Whether this process starts xdist workers (make test's) that may fork from a zygote: not a worker, not a run
    without workers, and not on a machine with a GPU (CUDA cannot be used in a fork of a process that set it up,
    and loading the frameworks may)."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return False
    if not config.getoption("numprocesses", None) or os.environ.get("TESTS_ZYGOTE") == "off":
        return False
    return not torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    """With xdist workers, start a zygote (tests/zygote.py) that loads torch and the frameworks once, for every
    worker and docs snippet to fork from instead of loading them each (``TESTS_ZYGOTE=off`` does without)."""
    if _starts_workers(config):
        from tests.zygote import Zygote

        config._advmon_zygote = Zygote()


@pytest.hookimpl(optionalhook=True)  # xdist's hook
def pytest_xdist_setupnodes(config: pytest.Config, specs: list) -> None:
    """Each worker a fork of the zygote, once it has loaded its modules; without a zygote, a fresh interpreter."""
    zygote = getattr(config, "_advmon_zygote", None)
    if zygote is None:
        return
    if not zygote.wait():
        config._advmon_zygote = None
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # slower, never different: say so, and go on without it
            reporter.write_line(f"tests/zygote.py did not start; workers load everything themselves:\n{zygote.why()}",
                                yellow=True)
        return
    import shlex

    from tests.zygote import command

    os.environ["TESTS_ZYGOTE"] = zygote.socket_path  # for the processes the tests start (tests/zygote.py)
    for spec in specs:
        if spec.popen and not spec.python:
            spec.python = shlex.join(command(zygote.socket_path))


def pytest_unconfigure(config: pytest.Config) -> None:
    zygote = getattr(config, "_advmon_zygote", None)
    if zygote is not None:
        zygote.stop()
        os.environ.pop("TESTS_ZYGOTE", None)


class SettledRecords(list):
    """A sink's records as a reader after ``monitor.wait()`` sees them: every read first waits for the records
    open monitors are still finishing off the caller's thread (a list kept from before a call stays live)."""

    def _settled(self) -> SettledRecords:
        advmon.lifecycle.wait_all()
        return self

    def __len__(self) -> int:
        return super(SettledRecords, self._settled()).__len__()

    def __getitem__(self, index):
        return super(SettledRecords, self._settled()).__getitem__(index)

    def __iter__(self):
        return super(SettledRecords, self._settled()).__iter__()

    def __bool__(self) -> bool:
        return len(self) > 0

    def __eq__(self, other) -> bool:
        return list(self) == other

    def __repr__(self) -> str:
        return repr(list(self))


class ListSink(advmon.Sink):
    """A real sink that keeps records in memory."""

    name = "list"
    synchronous = True

    def __init__(self) -> None:
        self.records = SettledRecords()
        self.closed = False

    @property
    def written(self) -> list[Record]:
        """The records written so far, without waiting."""
        return list.copy(self.records)

    def write(self, record: Record) -> None:
        self.records.append(record)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def sink() -> ListSink:
    return ListSink()


@pytest.fixture
def monitor(sink: ListSink):
    with advmon.Monitor("test-run", sinks=[sink]) as m:
        yield m
