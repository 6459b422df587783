"""Which statistics path a tensor takes, and host data moved to a device without a sync.

Three paths compute the same :class:`~advmon.stats.sketch_format.Part`:

* ``"cpu"``: CPU tensors. Cache-sized row chunks, a prefix-mask fast path, and
  shortcuts that look at values (free on the host).
* ``"torch"``: any other device. A fixed number of whole-tensor torch ops per
  call whatever the size (chunks only bound memory), nothing read back to the
  host, exact integer counts (:mod:`advmon.stats.device_sketch`).
* ``"triton"``: CUDA and ROCm devices where ``triton`` imports. A handful of
  kernels (:mod:`advmon.stats.triton_sketch`).

``ADVMON_STATISTICS_PATH=torch`` (or ``triton``) in the environment, or
:func:`statistics_path` in code, chooses a device path for every tensor; the
benchmarks and tests use it to run the device paths on CPU tensors.

Example:
    >>> path_for(torch.device("cpu"))
    'cpu'
    >>> with statistics_path("torch"):
    ...     path_for(torch.device("cpu"))
    'torch'
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal, TypeVar

import numpy as np
import torch

__all__ = [
    "NO_FLOAT64",
    "PATHS",
    "attempt_triton",
    "host_float64",
    "path_for",
    "statistics_path",
    "sync_free",
    "to_device",
    "triton_usable",
    "where_float64_works",
]

T = TypeVar("T")

Path = Literal["cpu", "torch", "triton"]
PATHS: tuple[str, ...] = ("cpu", "torch", "triton")
#: The environment variable that chooses a device path for every tensor.
PATH_VARIABLE = "ADVMON_STATISTICS_PATH"

_FORCED: ContextVar[str | None] = ContextVar("advmon_statistics_path", default=None)


@contextmanager
def statistics_path(path: Path | None) -> Iterator[None]:
    """Run the statistics of this context on ``path`` (``None``: choose by device).

    ``"torch"`` and ``"triton"`` apply to CPU tensors too (Triton then needs
    ``TRITON_INTERPRET=1``, set before ``triton`` is imported).

    Raises:
        ValueError: for a path that is not one of :data:`PATHS`.
    """
    if path is not None and path not in PATHS:
        raise ValueError(f"statistics path must be one of {PATHS} or None, got {path!r}")
    token = _FORCED.set(path)
    try:
        yield
    finally:
        _FORCED.reset(token)


def path_for(device: torch.device) -> Path:
    """The path the statistics of a tensor on ``device`` take (see the module docstring)."""
    forced = _FORCED.get() or os.environ.get(PATH_VARIABLE) or None
    if forced in PATHS and not (forced == "triton" and not triton_usable()):
        return forced  # type: ignore[return-value]
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda" and triton_usable():  # ROCm builds of torch call their devices "cuda" too
        return "triton"
    return "torch"


def sync_free(tensor: torch.Tensor) -> bool:
    """Whether work on ``tensor`` must avoid reading values back to the host (any path but the CPU's)."""
    return path_for(tensor.device) != "cpu"


@functools.cache
def triton_usable() -> bool:
    """Whether ``triton`` can be imported (checked once)."""
    return importlib.util.find_spec("triton") is not None


#: The first failure of a Triton kernel in this process; from then on the torch path is used.
_TRITON_FAILURE: list[str] = []


def attempt_triton(compute: Callable[[], T], device: torch.device) -> T | None:
    """``compute()`` (Triton kernels), or ``None`` for the torch path once one has failed.

    A kernel that cannot compile or launch on this device must not stop the
    statistics: the first failure warns once, with its cause, and every later
    call goes straight to the pure-torch path.
    """
    if _TRITON_FAILURE:
        return None
    try:
        return compute()
    except Exception as exc:  # noqa: BLE001 - any Triton failure falls back; the warning names it
        _TRITON_FAILURE.append(f"{type(exc).__name__}: {exc}")
        warnings.warn(
            f"advmon: the Triton statistics kernels failed on {device} ({_TRITON_FAILURE[0]}); using the "
            f"pure-torch device path from now on ({PATH_VARIABLE}=torch skips Triton)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


#: Device types without float64 (Apple's MPS), whose tensors advmon summarises on the host.
NO_FLOAT64 = frozenset({"mps"})


def where_float64_works(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a host copy of it where its device has no float64 (:data:`NO_FLOAT64`).

    Exact statistics need float64 sums; MPS has none, so its tensors cross to the
    host first (one synchronizing copy each) and take the CPU's path.
    """
    return tensor.cpu() if tensor.device.type in NO_FLOAT64 else tensor


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; host data goes to CUDA through pinned memory, without a sync.

    A plain ``.to("cuda")`` of pageable host memory waits for the copy (a
    synchronizing call); a pinned buffer copies asynchronously and torch keeps it
    alive until the copy is done.
    """
    if tensor.device == device:
        return tensor
    if tensor.device.type == "cpu" and device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def host_float64(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
    """A CPU tensor's (or a NumPy array's) values as a float64 NumPy array (itself when float64 already).

    NumPy's conversion of a few thousand values costs less than a torch op's dispatch;
    dtypes NumPy lacks (bfloat16) go through torch.

    Example:
        >>> host_float64(torch.tensor([1.5, 2.0], dtype=torch.float32)).dtype
        dtype('float64')
    """
    if isinstance(tensor, np.ndarray):
        return tensor if tensor.dtype == np.float64 else tensor.astype(np.float64)
    if tensor.dtype == torch.float64:
        return tensor.numpy()
    if tensor.dtype == torch.bfloat16 or tensor.is_complex() or tensor.is_neg():
        return tensor.to(torch.float64).numpy()
    return tensor.numpy().astype(np.float64)
