from __future__ import annotations

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


class ListSink(advmon.Sink):
    """A real sink that keeps records in memory."""

    name = "list"
    synchronous = True

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.closed = False

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
