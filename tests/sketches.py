"""Helpers shared by the tests of the statistics paths: masks, and one sketch compared with another."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from advmon.stats import cpu_sketch, sketch_format
from advmon.stats import summarize

#: Values that break careless statistics: signed zeros, subnormals, float32's extremes, NaN and Inf.
ADVERSARIAL = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 1e30, -1e30, 3.4e38, -3.4e38, 1e-45, 0.3, math.nan, math.inf,
               -math.inf]


def float_arrays(max_side: int):
    """2-D float32 or float64 arrays of any float32 value, adversarial ones often."""
    return hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float64]),
        shape=hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=max_side),
        elements=st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True), st.sampled_from(ADVERSARIAL)),
    )


def prefix_mask(lengths, cols: int, kind: str = "float") -> torch.Tensor:
    mask = torch.arange(cols) < torch.as_tensor(lengths).unsqueeze(-1)
    if kind == "bool":
        return mask
    if kind == "int":
        return mask.long()
    if kind == "weights":  # validity is ``> 0``: any positive weight inside, anything <= 0 outside
        return torch.where(mask, torch.full(mask.shape, 0.25), torch.full(mask.shape, -2.0))
    return mask.float()


def general_part(values: torch.Tensor, mask: torch.Tensor) -> sketch_format.Part:
    """What the general two-pass sketch makes of the same input."""
    return cpu_sketch._sketch_two_passes(values, mask)


def kept_representatives(part: sketch_format.Part) -> list[float] | None:
    """A sketch's representatives as a sorted list (the paths list them in different orders), ``None``: none kept."""
    scalars, _, table = (t.cpu().numpy() for t in part.tensors)
    if scalars[sketch_format._N_FINITE] == 0:
        return []
    kept = sketch_format.representatives(table, int(scalars[sketch_format._SCALE]))
    return None if kept is None else sorted(kept.tolist())


def assert_same_sketch(fast: sketch_format.Part, general: sketch_format.Part) -> None:
    """Same counts, extrema, top bucket, scale and histogram; moments to float64 rounding.

    Rounding is relative to the data's scale (the largest magnitude): float64 sums in
    another order differ there, e.g. ``1 + 1e30 - 1e30``.
    """
    f_scalars, f_hist = (t.numpy() for t in fast.tensors[:2])
    g_scalars, g_hist = (t.numpy() for t in general.tensors[:2])
    np.testing.assert_array_equal(f_hist, g_hist)
    assert kept_representatives(fast) == kept_representatives(general)
    compared = [sketch_format._N_VALID, sketch_format._N_NAN, sketch_format._N_INF, sketch_format._N_FINITE]
    if g_scalars[sketch_format._N_FINITE] > 0:  # where the buckets are means nothing without a finite value
        compared += [sketch_format._MIN, sketch_format._MAX, sketch_format._TOP, sketch_format._SCALE]
    for index in compared:
        assert f_scalars[index] == g_scalars[index], index
    f_summary, g_summary = summarize([fast]), summarize([general])
    for key, value in g_summary.items():
        if np.isnan(value):
            assert np.isnan(f_summary[key]), key
        elif key.startswith("p") or key in ("min", "max", "count", "nan_count", "inf_count"):
            assert f_summary[key] == value, key
        else:
            scale = max(abs(g_summary["min"]), abs(g_summary["max"]), abs(value))
            assert abs(f_summary[key] - value) <= 1e-12 * scale, key
