"""A call's group counts and derived pre_norm on a CUDA or ROCm device, in two Triton kernels.

The pure-torch groups (:mod:`advmon.groups`, sorted segments) take a few dozen
ops; here every sample compares its group id with every other sample's, in tiles
of ``TILE x TILE`` (quadratic, so only up to :data:`MAX_BATCH` samples; beyond,
the torch path is cheaper):

1. ``_group_kernel``: for each sample, its group's size, finite rewards' count,
   minimum and maximum, and first member, then the sum of ``reward - minimum``
   over the group (a zero-std group sums exact zeros: its mean is its value);
   it writes ``reward - group mean`` and, for the groups whose first member it
   holds, the program's share of :data:`~advmon.groups.GROUP_COUNT_FIELDS`.
2. ``_finalize_kernel``: the shares summed (and the largest size), as float64.

Every sum runs in a fixed order and the counts are integers: the result does not
depend on scheduling. The reward range's ends travel as their float64 bits (a
Triton float argument is float32).
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl

__all__ = ["MAX_BATCH", "triton_group_statistics"]

#: Samples compared per tile side.
TILE = 64
#: Largest batch sent to the quadratic kernel (16384**2 comparisons: well under a millisecond).
MAX_BATCH = 16384
_FIELDS = 8  # GROUP_COUNT_FIELDS, in their order
_OPTIONS = {"num_warps": 4, "enable_fp_fusion": False}


def triton_group_statistics(
    rewards: torch.Tensor, ids: torch.Tensor, reward_range: tuple[float, float] | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(float64 counts of ``GROUP_COUNT_FIELDS``, derived pre_norm) of float64 rewards; ``None`` past :data:`MAX_BATCH`."""
    count = rewards.shape[0]
    if count == 0 or count > MAX_BATCH:
        return None
    programs = triton.cdiv(count, TILE)
    rewards = rewards.contiguous()  # the kernel reads sample i at rewards + i (a [B, 1] column or a slice is strided)
    pre_norm = torch.empty(count, dtype=torch.float64, device=rewards.device)
    shares = torch.empty((programs, _FIELDS), dtype=torch.int32, device=rewards.device)
    counts = torch.empty(_FIELDS, dtype=torch.float64, device=rewards.device)
    low, high = reward_range if reward_range is not None else (math.nan, math.nan)
    _group_kernel[(programs,)](
        rewards, ids.contiguous(), pre_norm, shares, count, _bits(low), _bits(high), TILE=TILE, **_OPTIONS
    )
    _finalize_kernel[(1,)](shares, programs, counts, HAS_RANGE=reward_range is not None, REDUCE=256, **_OPTIONS)
    return counts, pre_norm


def _bits(value: float) -> int:
    """The float64's bit pattern as an int (exact, unlike a float argument)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


@triton.jit(do_not_specialize=["count", "low_bits", "high_bits"])  # 0 or 1 would become constants
def _group_kernel(rewards, ids, pre_norm, shares, count, low_bits, high_bits, TILE: tl.constexpr):
    mine = tl.program_id(0) * TILE + tl.arange(0, TILE)
    live = mine < count
    group = tl.load(ids + mine, mask=live, other=-1)
    reward = tl.load(rewards + mine, mask=live, other=0.0)
    lanes = tl.arange(0, TILE)
    size = tl.zeros([TILE], dtype=tl.int32)
    finite = tl.zeros([TILE], dtype=tl.int32)
    least = tl.full([TILE], float("inf"), dtype=tl.float64)
    most = tl.full([TILE], float("-inf"), dtype=tl.float64)
    first = tl.full([TILE], count, dtype=tl.int32)
    for start in range(0, count, TILE):
        other = start + lanes
        there = other < count
        peer = tl.load(ids + other, mask=there, other=-2)  # -2: equal to no id, nor to a dead lane's -1
        value = tl.load(rewards + other, mask=there, other=0.0)
        same = group[:, None] == peer[None, :]
        usable = same & (tl.abs(value) < float("inf"))[None, :]
        size += tl.sum(same.to(tl.int32), axis=1)
        finite += tl.sum(usable.to(tl.int32), axis=1)
        least = tl.minimum(least, tl.min(tl.where(usable, value[None, :], float("inf")), axis=1))
        most = tl.maximum(most, tl.max(tl.where(usable, value[None, :], float("-inf")), axis=1))
        first = tl.minimum(first, tl.min(tl.where(same, other[None, :], count), axis=1))
    above = tl.zeros([TILE], dtype=tl.float64)
    for start in range(0, count, TILE):
        other = start + lanes
        there = other < count
        peer = tl.load(ids + other, mask=there, other=-2)
        value = tl.load(rewards + other, mask=there, other=0.0)
        usable = (group[:, None] == peer[None, :]) & (tl.abs(value) < float("inf"))[None, :]
        above += tl.sum(tl.where(usable, value[None, :] - least[:, None], 0.0), axis=1)
    mean = least + above / finite.to(tl.float64)  # NaN for a group without a finite reward, as on the CPU
    tl.store(pre_norm + mine, reward - mean, mask=live)
    low = low_bits.to(tl.int64).to(tl.float64, bitcast=True)
    high = high_bits.to(tl.int64).to(tl.float64, bitcast=True)
    lead = live & (first == mine)  # the group's first member counts it
    comparable = lead & (finite >= 2)
    out = shares + tl.program_id(0) * 8
    tl.store(out + 0, tl.sum(lead.to(tl.int32), axis=0))
    tl.store(out + 1, tl.sum((lead & (size == 1)).to(tl.int32), axis=0))
    tl.store(out + 2, tl.sum(comparable.to(tl.int32), axis=0))
    tl.store(out + 3, tl.sum((comparable & (least == most)).to(tl.int32), axis=0))
    tl.store(out + 4, tl.sum((lead & (finite < size)).to(tl.int32), axis=0))
    tl.store(out + 5, tl.sum((comparable & (most <= low)).to(tl.int32), axis=0))
    tl.store(out + 6, tl.sum((comparable & (least >= high)).to(tl.int32), axis=0))
    tl.store(out + 7, tl.max(tl.where(lead, size, 0), axis=0))


@triton.jit
def _finalize_kernel(shares, programs, counts, HAS_RANGE: tl.constexpr, REDUCE: tl.constexpr):
    rows = tl.arange(0, REDUCE)
    fields = tl.arange(0, 8)
    totals = tl.zeros([8], dtype=tl.int32)
    largest = tl.zeros([8], dtype=tl.int32)
    for start in range(0, programs, REDUCE):
        at = start + rows
        block = tl.load(shares + at[:, None] * 8 + fields[None, :], mask=(at < programs)[:, None], other=0)
        totals += tl.sum(block, axis=0)
        largest = tl.maximum(largest, tl.max(block, axis=0))
    result = tl.where(fields == 7, largest, totals).to(tl.float64)
    if not HAS_RANGE:
        result = tl.where((fields == 5) | (fields == 6), float("nan"), result)
    tl.store(counts + fields, result)
