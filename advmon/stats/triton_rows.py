"""A device call's two row reductions in one Triton kernel each: prompt rows' hashes and a mask's row counts.

On the pure-torch path the prompt rows' 64-bit hash
(:func:`~advmon.stats.groups.device_group_vector`) is six whole-tensor ops and a
mask's row counts (:func:`~advmon.stats.rows.row_valid_counts`) five; each is a
kernel launch that costs the CPU more than the arithmetic. Here each is one
kernel: a program takes :data:`ROWS` rows and walks their columns in blocks of
:data:`COLUMNS`, reading entries where they lie (any strides).

The results are the torch path's, bit for bit: the hash is integer arithmetic
modulo ``2**64`` (a sum of wrapped products does not depend on its order) and the
counts are whole numbers. Without a GPU, ``TRITON_INTERPRET=1`` runs both on CPU
tensors, which is how ``make test`` checks them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["COLUMNS", "ROWS", "triton_row_counts", "triton_row_hashes"]

#: Rows per program, and columns per step of its walk.
ROWS = 16
COLUMNS = 128
_OPTIONS = {"num_warps": 4}


def triton_row_hashes(rows: torch.Tensor, weights: torch.Tensor, mix: int) -> torch.Tensor:
    """Each row's 64-bit hash as int64, as :func:`advmon.stats.groups._row_hashes` computes it.

    ``weights`` are the columns' odd int64 weights and ``mix`` the multiplier of the
    mixing step (the groups module owns both).
    """
    count, columns = rows.shape
    out = torch.empty(count, dtype=torch.int64, device=rows.device)
    if rows.dtype == torch.bool:
        rows = rows.view(torch.uint8)
    _row_hash_kernel[(triton.cdiv(max(count, 1), ROWS),)](
        rows, weights, out, count, columns, rows.stride(0), rows.stride(1), mix,
        FLOAT=rows.is_floating_point(), ROWS=ROWS, COLUMNS=COLUMNS, **_OPTIONS,
    )
    return out


def triton_row_counts(valid: torch.Tensor) -> torch.Tensor:
    """Entries ``> 0`` in each row of a 2-D mask (any dtype; a NaN entry is not ``> 0``), as float64."""
    count, columns = valid.shape
    out = torch.empty(count, dtype=torch.float64, device=valid.device)
    if valid.dtype == torch.bool:
        valid = valid.view(torch.uint8)  # Triton loads bytes; the test is the same (> 0)
    _row_count_kernel[(triton.cdiv(max(count, 1), ROWS),)](
        valid, out, count, columns, valid.stride(0), valid.stride(1), ROWS=ROWS, COLUMNS=COLUMNS, **_OPTIONS,
    )
    return out


@triton.jit
def _rows(count, ROWS: tl.constexpr):
    """This program's rows, and which of them are in the tensor."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    return row, row < count


@triton.jit
def _tile(row, row_inside, start, columns, s_row, s_col, COLUMNS: tl.constexpr):
    """One step of the walk: its columns, which entries are in the tensor, and where each lies."""
    column = start + tl.arange(0, COLUMNS).to(tl.int64)
    inside = row_inside[:, None] & (column < columns)[None, :]
    return column, inside, row[:, None] * s_row + column[None, :] * s_col


@triton.jit
def _row_hash_kernel(rows, weights, out, count, columns, r_row, r_col, mix,
                     FLOAT: tl.constexpr, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    row, row_inside = _rows(count, ROWS)
    total = tl.zeros([ROWS], dtype=tl.int64)
    for start in range(0, columns, COLUMNS):
        column, inside, at = _tile(row, row_inside, start, columns, r_row, r_col, COLUMNS)
        if FLOAT:
            # + 0.0: -0.0 and 0.0 are one id; then the float64's bits, as the torch path views them
            value = (tl.load(rows + at, mask=inside, other=0.0).to(tl.float64) + 0.0).to(tl.int64, bitcast=True)
        else:
            value = tl.load(rows + at, mask=inside, other=0).to(tl.int64)
        mixed = value * tl.load(weights + column, mask=column < columns, other=0)[None, :]
        mixed = mixed ^ ((mixed >> 31) & 0x1FFFFFFFF)  # the mask keeps the bits a logical shift would
        mixed = mixed * mix
        total += tl.sum(tl.where(inside, mixed, 0), axis=1)
    tl.store(out + row, total, mask=row_inside)


@triton.jit
def _row_count_kernel(valid, out, count, columns, v_row, v_col, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    row, row_inside = _rows(count, ROWS)
    total = tl.zeros([ROWS], dtype=tl.int64)
    for start in range(0, columns, COLUMNS):
        _, inside, at = _tile(row, row_inside, start, columns, v_row, v_col, COLUMNS)
        entry = tl.load(valid + at, mask=inside, other=0)
        # compared as float32: the same answer for every dtype (NaN is not > 0), bf16 included in the interpreter
        total += tl.sum((inside & (entry.to(tl.float32) > 0)).to(tl.int64), axis=1)
    tl.store(out + row, total.to(tl.float64), mask=row_inside)
