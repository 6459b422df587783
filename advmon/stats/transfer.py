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

Example:
    >>> import torch
    >>> [a.tolist() for a in pack([torch.tensor([1.0, 2.0]), torch.tensor([3], dtype=torch.int64)])]
    [[1.0, 2.0], [3.0]]
    >>> transfer = start_transfer([torch.tensor([5.0])])
    >>> transfer.arrays()[0].tolist()
    [5.0]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from advmon.stats.sketch_format import HostPart, Part

__all__ = ["Transfer", "pack", "start_transfer", "to_host"]


class Transfer:
    """A started crossing: one host buffer per device, and what to wait for before reading a device's buffer."""

    def __init__(self, sizes: list[int], buffers: list[tuple[list[int], torch.Tensor, Any]],
                 as_bits: set[int] = frozenset()) -> None:
        self._sizes = sizes  # float64 slots each tensor takes in its buffer
        self._as_bits = as_bits  # the tensors that crossed as int32 bits
        self._buffers = buffers  # (tensor indices, host buffer, CUDA event or None), one per device

    def arrays(self) -> list[np.ndarray]:
        """The tensors as float64 NumPy arrays, in the order given; waits for a device's copy to complete."""
        arrays: list[np.ndarray | None] = [None] * len(self._sizes)
        for indices, buffer, event in self._buffers:
            if event is not None:
                event.synchronize()  # where the host half runs: off the training thread
            host = buffer.numpy()
            offset = 0
            for i in indices:
                arrays[i] = host[offset : offset + self._sizes[i]]
                if i in self._as_bits:
                    arrays[i] = arrays[i].view(np.int32)
                offset += self._sizes[i]
        return arrays  # type: ignore[return-value]


def start_transfer(tensors: Sequence[torch.Tensor]) -> Transfer:
    """Start moving tensors to the host, one copy per device, without waiting for a device.

    Everything is packed into one float64 buffer per device first, so a record
    costs one device-to-host copy however many statistics it holds. A CUDA
    buffer is copied ``non_blocking`` into pinned memory and an event marks its
    end; other devices' buffers are copied at once.
    """
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    as_bits = {i for i, t in enumerate(tensors) if t.dtype == torch.int32 and t.numel() % 2 == 0 and t.numel()}
    flats = [_float64_or_whole(t.reshape(-1), i in as_bits) for i, t in enumerate(tensors)]
    buffers = []
    for device, indices in by_device.items():
        flat = torch.cat([flats[i] for i in indices]).to(torch.float64)
        if device.type == "cuda":
            host = torch.empty(flat.shape, dtype=torch.float64, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            buffers.append((indices, host, event))
        else:
            buffers.append((indices, flat if device.type == "cpu" else flat.cpu(), None))
    return Transfer([flat.numel() for flat in flats], buffers, as_bits)


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
