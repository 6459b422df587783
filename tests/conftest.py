from __future__ import annotations

import logging
import os

import pytest
import torch

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
