"""advmon's statistics engine, and its one door: the rest of advmon imports from here, never from a module inside.

Nothing here knows about decorators, monitors, sinks or threads; the engine uses
torch, NumPy and Triton and nothing else of advmon. Statistics are computed in two
halves so that a whole record crosses to the host once:

1. **The device half** reduces what is ``[B, T]`` on the tensors' own device. Each
   tensor becomes a :class:`Part` (:mod:`~advmon.stats.parts` dispatches): a few small
   tensors (exact values and weights for small inputs, or moments plus a histogram for
   large ones). No reference to the caller's tensors is kept. Large tensors are
   sketched on the path their device takes (:mod:`~advmon.stats.devices`): the CPU's
   own (:mod:`~advmon.stats.prefix_sketch` and :mod:`~advmon.stats.cpu_sketch`, which
   may look at values: they are on the host already), or on any other device the
   pure-torch (:mod:`~advmon.stats.device_sketch`) or Triton
   (:mod:`~advmon.stats.triton_sketch`) paths, which never read a value back. Each
   sample's row summaries (:mod:`~advmon.stats.rows`) and the prompt rows' hash
   (:func:`device_group_vector`) are ``[B]`` vectors; :func:`pack`
   (:mod:`~advmon.stats.transfer`) moves everything to the host in one transfer.
2. **The host half** is NumPy: :func:`summarize` (:mod:`~advmon.stats.summaries`)
   merges any number of parts (several calls of one training step) and finishes the
   statistics and their :mod:`~advmon.stats.histograms`; groups
   (:mod:`~advmon.stats.groups`), their bounds (:mod:`~advmon.stats.group_bounds`),
   the worst of them (:mod:`~advmon.stats.exemplars`) and slices
   (:mod:`~advmon.stats.slices`) read the call's ``[B]`` vectors.

The format both halves share is :mod:`~advmon.stats.sketch_format`. Modules inside
may share underscore names with their siblings; nothing outside this package may.

Merging only ever adds counts and sums and takes minima, maxima and histogram
bins; it never averages averages. So one step split into chunks gives the same
record as one call on the concatenated batch.

Semantics (the record's contract):

* ``count`` counts every valid entry, finite or not; ``nan_count`` and
  ``inf_count`` count the valid non-finite ones;
* ``mean``, ``std`` (population, ddof=0), ``min``, ``max``, ``abs_mean`` and the
  percentiles use the finite valid entries only, and are ``nan`` when there are
  none;
* percentiles follow NumPy's default (linear) definition. Inputs of at most
  :data:`EXACT_LIMIT` entries get them exactly; larger ones get them from a
  histogram of relative buckets (:mod:`~advmon.stats.sketch_format`), each at most
  1/128 of its lower edge wide: every percentile lies between the two order
  statistics NumPy interpolates, each widened by 0.79% of its own magnitude
  (magnitudes below ``2**-63`` of the largest ``|x|`` are within that much of 0);
  where at most 227 buckets hold values, a percentile that falls on a value is that
  value (a discrete set of values gives those values).

Example:
    >>> import torch
    >>> stats = summarize([value_part(torch.tensor([1.0, 2.0, float("nan"), 4.0]))])
    >>> stats["mean"], stats["count"], stats["nan_count"], stats["p50"]
    (2.3333333333333335, 4.0, 1.0, 2.0)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from advmon.stats.devices import (
    PATHS,
    host_float64,
    path_for,
    statistics_path,
    sync_free,
    to_device,
    where_float64_works,
)
from advmon.stats.exemplars import FIELDS as EXEMPLAR_FIELDS
from advmon.stats.exemplars import NOT_CHOSEN as EXEMPLAR_NOT_CHOSEN
from advmon.stats.exemplars import REASONS as EXEMPLAR_REASONS
from advmon.stats.exemplars import HostSegments, reward_segments, worst_groups
from advmon.stats.group_bounds import (
    EVIDENCE_FIELDS,
    EVIDENCE_MERGE,
    GroupPeaks,
    call_bounds,
    group_peaks,
    group_ratios,
    merge_evidence,
)
from advmon.stats.groups import (
    GROUP_COUNT_FIELDS,
    Grouping,
    GroupsError,
    HostGroups,
    RowKeys,
    check_group_tensor,
    derived_pre_norm,
    device_group_vector,
    group_counts,
    group_ids,
    group_ids_and_row_keys,
    group_statistics,
    host_group_values,
    host_grouping,
    merge_group_counts,
    row_keys,
)
from advmon.stats.histograms import MAX_BINS, Histogram, coarsened
from advmon.stats.parts import EXACT_LIMIT, dense_part, value_part
from advmon.stats.prefix_sketch import RowExtremes
from advmon.stats.rows import RowSummary, row_summaries, row_valid_counts, value_summaries
from advmon.stats.sketch_format import RELATIVE_BUCKET_WIDTH, HostPart, Part
from advmon.stats.slices import SLICE_FIELDS, SliceIndex, slice_name, slice_table
from advmon.stats.summaries import PERCENTILES, VALUE_KEYS, summarize, summarize_with_histogram
from advmon.stats.transfer import Transfer, pack, start_transfer, to_host

__all__ = [
    # the record's statistics
    "EXACT_LIMIT",
    "PERCENTILES",
    "RELATIVE_BUCKET_WIDTH",
    "STATISTICS_THREADS",
    "VALUE_KEYS",
    "HostPart",
    "Part",
    "Transfer",
    "dense_part",
    "pack",
    "start_transfer",
    "statistics_threads",
    "summarize",
    "summarize_with_histogram",
    "to_host",
    "value_part",
    # which path a tensor takes
    "PATHS",
    "host_float64",
    "path_for",
    "statistics_path",
    "sync_free",
    "to_device",
    "where_float64_works",
    # per-sample rows
    "RowExtremes",
    "RowSummary",
    "row_summaries",
    "row_valid_counts",
    "value_summaries",
    # groups, their bounds and the worst of them
    "EVIDENCE_FIELDS",
    "EVIDENCE_MERGE",
    "EXEMPLAR_FIELDS",
    "EXEMPLAR_NOT_CHOSEN",
    "EXEMPLAR_REASONS",
    "GROUP_COUNT_FIELDS",
    "GroupPeaks",
    "Grouping",
    "GroupsError",
    "HostGroups",
    "HostSegments",
    "RowKeys",
    "call_bounds",
    "check_group_tensor",
    "derived_pre_norm",
    "device_group_vector",
    "group_counts",
    "group_ids",
    "group_ids_and_row_keys",
    "group_peaks",
    "group_ratios",
    "group_statistics",
    "host_group_values",
    "host_grouping",
    "merge_evidence",
    "merge_group_counts",
    "reward_segments",
    "row_keys",
    "worst_groups",
    # slices
    "SLICE_FIELDS",
    "SliceIndex",
    "slice_name",
    "slice_table",
    # histograms
    "MAX_BINS",
    "Histogram",
    "coarsened",
]

# --------------------------------------------------------------------------- threads
# The setting lives on the door, where docs/api.md promises it (``advmon.stats.STATISTICS_THREADS = n``).

#: Intra-op threads advmon's CPU statistics use on the caller's thread (``None``: the caller's own).
STATISTICS_THREADS: int | None = 1


@contextmanager
def statistics_threads() -> Iterator[None]:
    """Run advmon's CPU statistics with :data:`STATISTICS_THREADS` intra-op threads.

    The statistics are many small, memory-bound ops over cache-sized chunks. With
    more OpenMP threads than free cores (a busy machine: data loaders, reward
    workers, other jobs) every one of those parallel regions waits for a
    descheduled thread: ``benchmarks/bench_busy.py`` measured up to 19-42x the
    quiet cost beside torch neighbours with two threads (watched calls of 250-300
    ms), 1.4-5.5x with one, and a quiet machine pays little for one. ``torch.set_num_threads`` sets the calling
    thread's OpenMP team size (and torch's process-wide MKL and pthreadpool
    sizes) and is restored on exit.
    """
    wanted = STATISTICS_THREADS
    previous = torch.get_num_threads()
    if wanted is None or previous == wanted:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
