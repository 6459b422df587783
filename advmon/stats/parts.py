"""The dispatcher of the device half: a tensor becomes a :class:`~advmon.stats.sketch_format.Part` on its own device.

Small inputs (at most :data:`EXACT_LIMIT` entries) keep their values for exact
statistics. Larger ones are sketched on the path their device takes
(:mod:`advmon.stats.devices`): the CPU's own (:func:`advmon.stats.cpu_sketch.cpu_part`,
which may look at values: they are on the host already), or on any other device the
pure-torch (:mod:`advmon.stats.device_sketch`) or Triton (:mod:`advmon.stats.triton_sketch`)
paths, which never read a value back. No reference to the caller's tensors is kept.

Example:
    >>> from advmon.stats.summaries import summarize
    >>> summarize([value_part(torch.tensor([1.0, 2.0, float("nan"), 4.0]))])["mean"]
    2.3333333333333335
"""

from __future__ import annotations

import torch

from advmon.stats.cpu_sketch import cpu_part
from advmon.stats.device_sketch import device_part
from advmon.stats.devices import attempt_triton, path_for
from advmon.stats.prefix_sketch import RowExtremes
from advmon.stats.sketch_format import Part

__all__ = ["EXACT_LIMIT", "dense_part", "value_part"]

#: Inputs with at most this many entries keep their values for exact statistics.
EXACT_LIMIT = 1 << 16


def value_part(values: torch.Tensor, weights: torch.Tensor | None = None, *, own_weights: bool = False) -> Part:
    """Part for a set of values with optional per-value weights (0 = not valid).

    Small sets are kept exactly; large ones are sketched. ``own_weights``: the weights
    are a float64 tensor made for this part, none below 0 (an expand view's row counts),
    kept as they are instead of copied and clamped (two device ops fewer).

    Example:
        >>> from advmon.stats.summaries import summarize
        >>> p = value_part(torch.tensor([1.0, 5.0]), torch.tensor([3.0, 0.0]))
        >>> summarize([p])["count"], summarize([p])["max"]
        (3.0, 1.0)
    """
    flat = values.detach().reshape(-1)
    if weights is not None:
        weights = weights.detach().reshape(-1)
    if flat.numel() <= EXACT_LIMIT:
        copy = flat.to(torch.float64, copy=True)
        if weights is None:
            w = torch.ones_like(copy)
        elif own_weights and weights.dtype == torch.float64:
            w = weights
        else:
            w = weights.to(torch.float64, copy=True).clamp_(min=0.0)
        return Part("exact", (copy, w))
    if weights is None:
        return dense_part(flat.unsqueeze(0), None)
    # Weights are entry counts (rows of an expand view).
    counts = weights.round().clamp(min=0)
    path = path_for(flat.device)
    if path != "cpu":  # the expansion's size is on the device: sketch with weights instead
        return _device_sketch(flat.unsqueeze(0), None, counts.unsqueeze(0), path)
    return dense_part(flat.repeat_interleave(counts.to(torch.long)).unsqueeze(0), None)


def dense_part(values: torch.Tensor, valid: torch.Tensor | None, extremes: RowExtremes | None = None) -> Part:
    """Part for a 2-D tensor where ``valid`` (bool or numeric, ``> 0`` = valid) selects entries.

    At most :data:`EXACT_LIMIT` entries are kept exactly; more are sketched in
    row chunks that stay in cache: moments in float64 plus a histogram whose bin
    width is the power of two ``2**level`` with ``level`` fixed by the range.
    ``extremes`` (CPU, prefix masks) also collects each row's extremes on the way
    (:class:`~advmon.stats.prefix_sketch.RowExtremes`; ``complete`` says whether it did).

    Example:
        >>> from advmon.stats.summaries import summarize
        >>> x = torch.tensor([[1.0, 2.0, 9.0], [3.0, float("inf"), 0.0]])
        >>> m = torch.tensor([[1, 1, 0], [1, 1, 0]])
        >>> s = summarize([dense_part(x, m)])
        >>> s["count"], s["inf_count"], s["mean"]
        (4.0, 1.0, 2.0)
    """
    values = values.detach()
    if values.dim() != 2:
        values = values.reshape(values.shape[0] if values.dim() else 1, -1)
    if valid is not None:
        valid = valid.detach().reshape(values.shape)
    if values.numel() <= EXACT_LIMIT:
        weights = None if valid is None else _as_valid_bool(valid).to(torch.float64)
        return value_part(values, weights)
    return _sketch(values, valid, extremes)


def _as_valid_bool(valid: torch.Tensor) -> torch.Tensor:
    return valid if valid.dtype == torch.bool else valid > 0


def _sketch(values: torch.Tensor, valid: torch.Tensor | None, extremes: RowExtremes | None = None) -> Part:
    """Moments and histogram of a large 2-D tensor, on the path its device takes (:mod:`advmon.stats.devices`)."""
    path = path_for(values.device)
    if path != "cpu":
        return _device_sketch(values, valid, None, path)
    return cpu_part(values, valid, extremes)


def _device_sketch(values: torch.Tensor, valid: torch.Tensor | None, weights: torch.Tensor | None, path: str) -> Part:
    """The Triton kernels where they apply and work, else the whole-tensor torch ops."""
    if path == "triton" and weights is None:
        part = attempt_triton(lambda: _triton_sketch(values, valid), values.device)
        if part is not None:
            return part
    return device_part(values, valid, weights)


def _triton_sketch(values: torch.Tensor, valid: torch.Tensor | None) -> Part | None:
    from advmon.stats.triton_sketch import triton_part  # imports triton: only where it is used

    return triton_part(values, valid)
