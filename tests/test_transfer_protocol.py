"""The device transfer's protocol, without a GPU (issue 40, item 1).

A record crosses to the host in one asynchronous copy per device, marked by an event
(:mod:`advmon.stats.transfer`). Its device-specific steps go through a seam
(:class:`~advmon.stats.transfer.CopySeam`); here a stand-in plays a device whose copies
land only when their event completes: late, out of order, never, or failing, under many
threads. Until a copy lands its buffer holds NaN, so a record read too early is wrong and
these tests see it. The CUDA seam's own choice of stream is checked against recording
stand-ins for ``torch.cuda``.
"""

from __future__ import annotations

import gc
import threading
import time
import types
import warnings
import weakref

import numpy as np
import pytest
import torch

import advmon
from advmon.stats import transfer

from .conftest import ListSink
from .reference import assert_stats_close, value_stats
from .sketches import prefix_mask


class FakeEvent:
    """A copy in flight: the bytes land in the host buffer when it completes, not before."""

    def __init__(self, seam: LateDevice, host: torch.Tensor, data: torch.Tensor) -> None:
        self.seam, self.data, self.completed, self.failed = seam, data, False, False
        self.host = weakref.ref(host)  # the seam must not keep the buffer alive: the Transfer must
        self.host_id = id(host)
        self.created = time.monotonic()

    def complete(self) -> None:
        host = self.host()
        if host is None:
            self.seam.violations.append("a buffer was freed while its copy was in flight")
        else:
            host.copy_(self.data)
        self.completed = True


class LateDevice:
    """A device whose copies complete as ``policy`` says: "late", "reverse" (newest first), "never", "fail"."""

    def __init__(self, policy: str, delay: float = 0.02) -> None:
        self.policy, self.delay = policy, delay
        self.lock = threading.Lock()
        self.in_flight: list[FakeEvent] = []
        self.violations: list[str] = []
        self.copies = 0
        self._stop = threading.Event()
        self._driver = threading.Thread(target=self._drive, daemon=True)
        self._driver.start()

    # The seam.
    def pinned_like(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.full(flat.shape, float("nan"), dtype=torch.float64)  # stale bytes until the copy lands

    def start_copy(self, host: torch.Tensor, flat: torch.Tensor) -> FakeEvent:
        event = FakeEvent(self, host, flat.clone())
        with self.lock:
            if any(e.host_id == id(host) and e.host() is host for e in self.in_flight):
                self.violations.append("a buffer was reused while a copy into it was in flight")
            self.in_flight.append(event)
            self.copies += 1
        return event

    def is_done(self, event: FakeEvent) -> bool:
        if self.policy == "fail":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return event.completed

    # The device.
    def _drive(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                due = [e for e in self.in_flight if time.monotonic() - e.created >= self.delay]
                if self.policy == "reverse":
                    due = due[::-1][:1]  # the newest due copy first, one at a time
                elif self.policy in ("never", "fail"):
                    due = []
                for event in due:
                    event.complete()
                    self.in_flight.remove(event)
            gc.collect(0)  # a buffer nobody holds goes now, not at some later collection
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._driver.join(5)


@pytest.fixture
def device(request, monkeypatch):
    """CPU tensors take the stand-in device's asynchronous path."""
    seam = LateDevice(request.param)
    monkeypatch.setitem(transfer.SEAMS, "cpu", seam)
    yield seam
    seam.stop()


def _batch(seed: int, rows: int = 96, cols: int = 800):
    """A GRPO-like call whose post_norm is sketched (more than 65,536 entries)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (rows,), generator=g).float()
    advantages = torch.randn(rows, cols, generator=g) * (1 + seed)
    mask = prefix_mask(torch.randint(1, cols + 1, (rows,), generator=g), cols)
    return rewards, advantages, mask


def _record_steps(run: str, steps: int, sink: ListSink, **settings) -> advmon.Monitor:
    monitor = advmon.Monitor(run, sinks=[sink], **settings)
    for step in range(steps):
        rewards, advantages, mask = _batch(step)
        with monitor.step(step):
            monitor.observe(rewards=rewards, advantages=advantages, mask=mask, group_size=8)
    return monitor


def _check_records(sink: ListSink, steps: int) -> None:
    assert [r.step for r in sink.records] == list(range(steps))
    for record in sink.records:
        _, advantages, mask = _batch(record.step)
        assert_stats_close(record.metrics, value_stats(advantages.numpy(), mask.numpy()), "advantages/post_norm/",
                           exact_percentiles=False)


@pytest.mark.parametrize("device", ["late"], indirect=True)
def test_the_host_reads_a_buffer_only_after_its_copy_completed(device, tmp_path):
    sink = ListSink()
    monitor = _record_steps("late-copies", 4, sink)
    monitor.close()
    assert device.copies == 4 and not device.violations
    _check_records(sink, 4)  # a buffer read before its copy landed would hold NaN


@pytest.mark.parametrize("device", ["late"], indirect=True)
def test_reading_before_the_event_completed_is_caught(device, monkeypatch):
    """The rule can fail: a seam that says "done" before the copy landed makes records of stale bytes."""
    monkeypatch.setattr(device, "is_done", lambda event: True)
    sink = ListSink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stale record's own problems (NaN everywhere) are beside the point
        _record_steps("too-early", 2, sink).close()
    with pytest.raises(AssertionError):
        _check_records(sink, 2)


@pytest.mark.parametrize("device", ["reverse"], indirect=True)
def test_records_finish_in_step_order_whatever_the_order_copies_complete(device):
    sink = ListSink()
    monitor = _record_steps("reversed-copies", 6, sink)
    monitor.close()
    assert not device.violations
    _check_records(sink, 6)


@pytest.mark.parametrize("device", ["late"], indirect=True)
def test_no_buffer_is_freed_or_shared_while_its_copy_is_in_flight_under_many_threads(device):
    sinks = [ListSink() for _ in range(4)]
    failures = []

    def train(index: int) -> None:
        try:
            _record_steps(f"thread-{index}", 3, sinks[index]).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=train, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures and not any(t.is_alive() for t in threads)
    assert device.copies == 12 and not device.violations, device.violations
    for sink in sinks:
        _check_records(sink, 3)


@pytest.mark.parametrize("device", ["never", "fail"], indirect=True)
def test_a_copy_that_never_completes_or_fails_costs_one_warning_and_a_counter_never_a_hang(device):
    sink = ListSink()
    abandoned = len(transfer.ABANDONED)
    finished = threading.Event()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = _record_steps("stuck-copy", 1, sink, close_timeout=0.5)
        closer = threading.Thread(target=lambda: (monitor.close(), finished.set()), daemon=True)
        closer.start()
        closer.join(60)
    assert finished.is_set(), "close() hung on a copy that never completes"
    assert sink.written == []  # no record made of stale bytes
    messages = [str(w.message) for w in caught if "advmon" in str(w.message)]
    assert len(messages) == 1, messages
    assert monitor.internal_errors == 1  # the lost record counted
    if device.policy == "never":
        assert "close_timeout" in messages[0] and "not read half-written" in messages[0]
        assert len(transfer.ABANDONED) >= abandoned + 1  # the buffer is kept: the device may still write
    else:
        assert "illegal memory access" in messages[0]


# --------------------------------------------------------------------------- the CUDA seam's stream


class _RecordingCuda:
    """Stand-ins for the few ``torch.cuda`` calls the seam makes, recording which device and stream each uses."""

    def __init__(self, current_device: int, side_streams: dict[int, str] | None = None) -> None:
        self.current = current_device
        self.side = side_streams or {}
        self.recorded: list[str] = []
        self.copied_under: list[int] = []

    def device(self, device):
        cuda = self

        class Guard:
            def __enter__(self):
                self.previous, cuda.current = cuda.current, torch.device(device).index
                return self

            def __exit__(self, *exc):
                cuda.current = self.previous

        return Guard()

    def current_stream(self, device=None):
        index = self.current if device is None else torch.device(device).index
        return self.side.get(index, f"default stream of cuda:{index}")

    def Event(self):  # noqa: N802 - torch.cuda's name
        cuda = self
        return types.SimpleNamespace(record=lambda stream=None: cuda.recorded.append(
            stream if stream is not None else cuda.current_stream()))


def _fake_copy(cuda: _RecordingCuda):
    return types.SimpleNamespace(copy_=lambda flat, non_blocking: cuda.copied_under.append(cuda.current))


@pytest.mark.parametrize("side", [False, True], ids=["default-stream", "side-stream"])
def test_the_cuda_event_marks_the_stream_of_the_tensors_device(monkeypatch, side):
    """Tensors on cuda:1 while cuda:0 is current (a trainer's .to(f"cuda:{rank}") without set_device), and a copy
    made under torch.cuda.stream(s): the event must mark the stream copy_ queues on, the tensor device's."""
    cuda = _RecordingCuda(current_device=0, side_streams={1: "side stream s on cuda:1"} if side else None)
    for name in ("device", "current_stream", "Event"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    flat = types.SimpleNamespace(device=torch.device("cuda", 1))
    transfer.CudaSeam().start_copy(_fake_copy(cuda), flat)
    expected = "side stream s on cuda:1" if side else "default stream of cuda:1"
    assert cuda.recorded == [expected], cuda.recorded
    assert cuda.copied_under == [1]  # copy_ runs with the tensor's device current, as the event's stream is
    assert cuda.current == 0  # and the trainer's current device is left as it was


def test_an_event_recorded_on_the_current_devices_stream_is_caught(monkeypatch):
    """The rule can fail: the code before issue 40 recorded the event on the current device's stream."""
    cuda = _RecordingCuda(current_device=0)
    for name in ("device", "current_stream", "Event"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))

    def old_start_copy(self, host, flat):
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return event

    monkeypatch.setattr(transfer.CudaSeam, "start_copy", old_start_copy)
    transfer.CudaSeam().start_copy(_fake_copy(cuda), types.SimpleNamespace(device=torch.device("cuda", 1)))
    assert cuda.recorded != ["default stream of cuda:1"]
