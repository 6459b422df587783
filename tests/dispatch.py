"""What torch dispatches during a piece of advmon's work: every op, and those that would sync a device.

On a GPU every dispatched op that is not a view is a kernel launch, and some ops
make the host wait for the device: reading a value (``.item()``, ``float(t)``,
``bool(t)``), or producing a shape that depends on the values. These modes see
the same ops on CPU tensors, so the device paths' promises are checked on any
machine; the CUDA tests confirm them with ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops that launch no kernel: views and metadata. (``scalar_tensor``, a Python number that an op such as
#: ``where`` makes into a tensor, is a fill kernel on a device: it counts.)
NOT_KERNELS = {
    "alias", "as_strided", "detach", "expand", "lift_fresh", "reshape", "select", "slice",
    "squeeze", "t", "transpose", "unbind", "unsqueeze", "view", "_unsafe_view", "split", "split_with_sizes",
    "empty", "empty_like", "empty_strided",
}
#: Ops whose output shape or result the host can only know by waiting for the device.
SYNCING = {
    "_local_scalar_dense", "is_nonzero", "item", "equal", "allclose", "nonzero", "nonzero_static", "unique_dim",
    "_unique", "_unique2", "unique_consecutive", "masked_select", "bincount", "histogram", "histogramdd",
    "_histogramdd_from_bin_cts", "_histogramdd_bin_edges", "masked_scatter", "tolist",
}


def op_name(func) -> str:
    """``aten.sum.dim_IntList`` -> ``sum``."""
    return func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)


class Dispatched(TorchDispatchMode):
    """Records every dispatched op's name; ``kernels`` leaves out views and metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = op_name(func)
        self.ops.append(name)
        if name in SYNCING or _data_dependent(name, args, kwargs):
            self.syncs.append(name)
        return func(*args, **kwargs)

    @property
    def kernels(self) -> list[str]:
        return [name for name in self.ops if name not in NOT_KERNELS]


def _data_dependent(name: str, args, kwargs) -> bool:
    """Boolean-mask indexing, and ``repeat_interleave`` without ``output_size``, size their output on the host."""
    if name in ("index", "index_put", "index_put_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices if i is not None)
    if name == "repeat_interleave":
        return kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None)
    return False


def largest_allocation(fn) -> int:
    """The most bytes one allocation made while ``fn`` ran, copies made inside an op included.

    A dispatch mode cannot see those: ``bool.sum(dtype=float64)`` first copies its whole
    input to float64 below the dispatcher. The profiler's memory events do.
    """
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        fn()
    return max((event.cpu_memory_usage for event in profile.events()), default=0)
