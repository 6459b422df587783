"""The device half's one crossing: tensors packed into one float64 buffer per device and copied to the host.

Example:
    >>> import torch
    >>> [a.tolist() for a in pack([torch.tensor([1.0, 2.0]), torch.tensor([3], dtype=torch.int64)])]
    [[1.0, 2.0], [3.0]]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from advmon.stats.sketch_format import HostPart, Part

__all__ = ["pack", "to_host", "to_host_array"]


def pack(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Move tensors to the host in one transfer per device and return NumPy arrays.

    Everything is packed into one float64 buffer per device first, so a record
    costs one device-to-host copy however many statistics it holds.
    """
    arrays: list[np.ndarray | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    for indices in by_device.values():
        host = to_host_array(torch.cat([_float64_or_whole(tensors[i].reshape(-1)) for i in indices]))
        offset = 0
        for i in indices:
            size = tensors[i].numel()
            arrays[i] = host[offset : offset + size]
            offset += size
    return arrays  # type: ignore[return-value]


def to_host_array(flat: torch.Tensor) -> np.ndarray:
    """A 1-D tensor as a float64 NumPy array: the record's one device-to-host transfer (a sync on a GPU)."""
    flat = flat.to(torch.float64)  # integers promoted by cat arrive here; float64 is a no-op
    return flat.numpy() if flat.device.type == "cpu" else flat.cpu().numpy()


def _float64_or_whole(tensor: torch.Tensor) -> torch.Tensor:
    """Floats become float64 first; integer counts go into ``cat`` as they are (it promotes them in the same kernel)."""
    return tensor if tensor.dtype == torch.float64 or not tensor.is_floating_point() else tensor.to(torch.float64)


def to_host(part: Part) -> HostPart:
    """Transfer one part (convenience for tests and single-part use)."""
    return HostPart(part.kind, tuple(pack(part.tensors)))
