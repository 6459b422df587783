"""The device half's one crossing: tensors packed into one float64 buffer per device and copied to the host.

int32 tensors of even length (a sketch's bucket counts) cross as their bits, two to
a float64, and come back as int32 arrays: a sketch's 16,132 counts weigh 64,528
bytes in the buffer instead of twice that.

:func:`start_transfer` starts the copy and returns at once: on CUDA it is a
``non_blocking`` copy into pinned host memory followed by a CUDA event, so the
calling (training) thread never waits for the device; :meth:`Transfer.arrays`,
called where the host half runs, waits for the event. CPU tensors are copied at
once (the buffer is advmon's own: the caller may change its tensors next).
:func:`pack` is both in one.

The device-specific steps (a pinned buffer, the asynchronous copy and the event that
marks it, whether that event completed) go through a small seam, :class:`CopySeam`,
so the protocol's rules hold and are tested without a GPU (``tests/test_transfer_protocol.py``
drives it with events that complete late, out of order or never):

* the host reads a buffer only once its event completed;
* a buffer is never reused or freed while a copy into it may be in flight: each
  transfer has its own, kept by the :class:`Transfer` until its event completed, and
  kept for good (:data:`ABANDONED`) if it never does;
* the event is recorded on the stream the copy was queued on: the current stream of
  the *tensor's* device (a trainer that moves tensors to ``cuda:1`` while ``cuda:0``
  is current, or copies under ``torch.cuda.stream(side)``), not the current device's;
* an event that does not complete within the transfer's ``timeout`` (half the monitor's
  ``close_timeout``, so that ``close()`` says so within its budget) raises
  :class:`TransferTimeout`: the monitor counts and warns once and loses that record; no
  record is made of bytes a copy may still write.

Example:
    >>> import torch
    >>> [a.tolist() for a in pack([torch.tensor([1.0, 2.0]), torch.tensor([3], dtype=torch.int64)])]
    [[1.0, 2.0], [3.0]]
    >>> transfer = start_transfer([torch.tensor([5.0])])
    >>> transfer.arrays()[0].tolist()
    [5.0]
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from advmon.stats.sketch_format import HostPart, Part

__all__ = ["ABANDONED", "CopySeam", "Transfer", "TransferTimeout", "pack", "start_transfer", "to_host"]

#: How long :meth:`Transfer.arrays` waits for a device's copy by default (the monitor passes its close_timeout).
DEFAULT_TIMEOUT = 10.0
#: Buffers whose copy never completed (with their events): kept, since the device may still write into them.
ABANDONED: list[tuple[torch.Tensor, Any]] = []
_ABANDONED_LOCK = threading.Lock()


class TransferTimeout(RuntimeError):
    """A device's copy of a record did not complete in time: the record is lost, never read half-written."""


class CopySeam(Protocol):
    """The device-specific steps of a transfer (:class:`CudaSeam` on CUDA; a stand-in in the tests)."""

    def pinned_like(self, flat: torch.Tensor) -> torch.Tensor:
        """A host buffer for ``flat``'s copy, of its own (never shared with another copy in flight)."""

    def start_copy(self, host: torch.Tensor, flat: torch.Tensor) -> Any:
        """Queue the copy of ``flat`` into ``host`` without waiting; return what marks its completion."""

    def is_done(self, marker: Any) -> bool:
        """Whether the copy ``marker`` marks completed (raises if the device failed)."""


class CudaSeam:
    """CUDA's transfer steps: pinned memory, a ``non_blocking`` copy, an event on the copy's own stream."""

    def pinned_like(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.empty(flat.shape, dtype=torch.float64, pin_memory=True)

    def start_copy(self, host: torch.Tensor, flat: torch.Tensor) -> Any:
        # copy_ queues a device-to-host copy on the current stream of the tensor's device (a side stream under
        # torch.cuda.stream(s)), whatever device is current: the event must mark that stream, not the current
        # device's, or the host could read the buffer before the copy ends.
        with torch.cuda.device(flat.device):
            stream = torch.cuda.current_stream(flat.device)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def is_done(self, marker: Any) -> bool:
        return bool(marker.query())


#: The seam of each device type whose copies are asynchronous (others are copied at once).
SEAMS: dict[str, CopySeam] = {"cuda": CudaSeam()}


def _seam_for(device: torch.device) -> CopySeam | None:
    return SEAMS.get(device.type)


class Transfer:
    """A started crossing: one host buffer per device, and what to wait for before reading a device's buffer."""

    def __init__(self, sizes: list[int], buffers: list[tuple[list[int], torch.Tensor, Any]],
                 as_bits: set[int] = frozenset(), timeout: float = DEFAULT_TIMEOUT) -> None:
        self._sizes = sizes  # float64 slots each tensor takes in its buffer
        self._as_bits = as_bits  # the tensors that crossed as int32 bits
        self.timeout = timeout
        self._buffers = buffers  # (tensor indices, host buffer, CUDA event or None), one per device

    def arrays(self) -> list[np.ndarray]:
        """The tensors as float64 NumPy arrays, in the order given; waits for a device's copy to complete.

        Raises :class:`TransferTimeout` if a copy has not completed within ``timeout`` seconds.
        """
        arrays: list[np.ndarray | None] = [None] * len(self._sizes)
        for indices, buffer, marker in self._buffers:
            if marker is not None:
                self._wait(buffer, marker)  # where the host half runs: off the training thread
            host = buffer.numpy()
            offset = 0
            for i in indices:
                arrays[i] = host[offset : offset + self._sizes[i]]
                if i in self._as_bits:
                    arrays[i] = arrays[i].view(np.int32)
                offset += self._sizes[i]
        return arrays  # type: ignore[return-value]

    def _wait(self, buffer: torch.Tensor, marker: tuple[CopySeam, Any]) -> None:
        """Until the copy into ``buffer`` completed: polled, so a copy that never completes cannot hang the host
        half; such a buffer is kept for good (the device may still write into it)."""
        seam, event = marker
        deadline = time.monotonic() + self.timeout
        pause = 2e-5
        while not seam.is_done(event):
            if time.monotonic() >= deadline:
                with _ABANDONED_LOCK:
                    ABANDONED.append((buffer, event))
                raise TransferTimeout(f"a record's device-to-host copy had not completed after {self.timeout:g}s "
                                      "(half of close_timeout): the record is lost, not read half-written")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)


def start_transfer(tensors: Sequence[torch.Tensor], timeout: float = DEFAULT_TIMEOUT) -> Transfer:
    """Start moving tensors to the host, one copy per device, without waiting for a device.

    Everything is packed into one float64 buffer per device first, so a record
    costs one device-to-host copy however many statistics it holds. A CUDA
    buffer is copied ``non_blocking`` into pinned memory of its own and an event
    marks its end (:class:`CudaSeam`); other devices' buffers are copied at once.
    ``timeout``: how long :meth:`Transfer.arrays` waits for a copy.
    """
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    as_bits = {i for i, t in enumerate(tensors) if t.dtype == torch.int32 and t.numel() % 2 == 0 and t.numel()}
    flats = [_float64_or_whole(t.reshape(-1), i in as_bits) for i, t in enumerate(tensors)]
    buffers = []
    for device, indices in by_device.items():
        flat = torch.cat([flats[i] for i in indices]).to(torch.float64)
        seam = _seam_for(device)
        if seam is not None:
            host = seam.pinned_like(flat)
            buffers.append((indices, host, (seam, seam.start_copy(host, flat))))
        else:
            buffers.append((indices, flat if device.type == "cpu" else flat.cpu(), None))
    return Transfer([flat.numel() for flat in flats], buffers, as_bits, timeout)


def pack(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Move tensors to the host in one transfer per device and return NumPy arrays (waits for the copy)."""
    return start_transfer(tensors).arrays()


def _float64_or_whole(tensor: torch.Tensor, as_bits: bool = False) -> torch.Tensor:
    """Floats become float64 first; integer counts go into ``cat`` as they are (it promotes them in the same kernel);
    ``as_bits``: an int32 tensor viewed as float64 (its bits, two to a slot: no kernel, and ``cat`` copies bits)."""
    if as_bits:
        return tensor.contiguous().view(torch.float64)
    return tensor if tensor.dtype == torch.float64 or not tensor.is_floating_point() else tensor.to(torch.float64)


def to_host(part: Part) -> HostPart:
    """Transfer one part (convenience for tests and single-part use)."""
    return HostPart(part.kind, tuple(pack(part.tensors)))
