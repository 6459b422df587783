"""What each group's advantages may reach under each normalization, and what a call shows of its own.

Estimators promise different things about |A| (docs/alerts.md, "Normalization kinds"):

* ``group_std`` (GRPO: divide by the group's reward std): a group of ``G`` samples
  reaches at most ``G / sqrt(G - 1)``, whatever the reward scale;
* ``group_mean`` (Dr. GRPO, RLOO, OPO: a baseline inside the group's rewards, no std):
  at most the group's own reward spread ``max - min``; GPG multiplies it by its batch
  factor ``B / (rewards != 0)``;
* ``batch`` and ``none`` have no per-group bound: the step's scale decides
  (:mod:`advmon.normalization`).

:func:`group_peaks` reduces a call's per-sample peaks |A| to its groups;
:func:`call_bounds` sums up, in a few numbers merged across calls by
:data:`EVIDENCE_MERGE`, how the groups' peaks compare with both group bounds (what
:mod:`advmon.normalization` infers a kind from and judges a step by); and
:func:`group_ratios` gives each group's peak over its bound under a kind, for the
exemplars. Pure functions over host data, in NumPy (a device call's ``[B]``-sized
vectors cross to the host first: :func:`advmon.observation.finish_on_host`).

Example:
    >>> import numpy as np
    >>> size = np.array([8.0, 8.0])
    >>> ratios = group_ratios("group_mean", np.array([17.5, 0.0]), size, size, np.array([0.0, 20.0]),
    ...                       np.array([20.0, 20.0]))
    >>> ratios.round(4).tolist()  # Dr. GRPO on rewards 0 or 20: one pass in eight gives |A| = 17.5 of a spread of 20
    [0.875, 0.0]
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from advmon.stats.devices import host_float64

__all__ = [
    "EVIDENCE_FIELDS",
    "EVIDENCE_MERGE",
    "SLACK",
    "GroupPeaks",
    "call_bounds",
    "group_peaks",
    "group_ratios",
    "merge_evidence",
]

#: A call's evidence, in this order (each merged across calls as :data:`EVIDENCE_MERGE` says).
EVIDENCE_FIELDS = (
    "std_ratio",  #: largest group peak over its group_std bound G/sqrt(G-1)
    "spread_ratio",  #: largest group peak over its group_mean bound (spread + slack), groups of >= 2 finite rewards
    "loo_ratio",  #: largest group peak over its group_loo_std bound (only when that kind is declared)
    "spread_ratio_low",  #: smallest group peak over its spread, groups whose rewards differ
    "equal_ratio",  #: largest group peak over its slack, groups whose rewards are all equal (0: all exactly 0)
    "judged_groups",  #: groups whose rewards differ and whose peak is known
    "nonzero_rewards",  #: rewards that are not 0 (as torch.count_nonzero counts: NaN too), GPG's m
    "samples",  #: rewards, GPG's batch size
)
EVIDENCE_MERGE = ("max", "max", "max", "min", "max", "sum", "sum", "sum")
_EMPTY = (-math.inf, -math.inf, -math.inf, math.inf, -math.inf, 0.0, 0.0, 0.0)
_FIELD = {name: i for i, name in enumerate(EVIDENCE_FIELDS)}
#: A group of equal rewards may carry float32 rounding of its rewards' size (an RLOO of 0.3s gives
#: ~1e-8): |A| up to this fraction of its largest |reward| is still "0".
SLACK = 1e-6


class GroupPeaks(NamedTuple):
    """Per group slot: the largest finite |post-norm advantage| of its samples (``nan`` without one), and its
    samples with a non-finite valid advantage."""

    peak: Any
    bad: Any


def merge_evidence(totals: np.ndarray, evidence: np.ndarray) -> np.ndarray:
    """Two calls' evidence as one call on both batches would give it.

    Example:
        >>> first = np.array([2.0, 1.0, 2.0, 0.5, 0.0, 3.0, 10.0, 16.0])
        >>> merge_evidence(first, np.array([1.0, 1.5, -np.inf, 0.7, -np.inf, 2.0, 4.0, 16.0])).tolist()
        [2.0, 1.5, 2.0, 0.5, 0.0, 5.0, 14.0, 32.0]
    """
    merge = {"max": max, "min": min, "sum": float.__add__}
    return np.array([merge[how](float(a), float(b)) for how, a, b in zip(EVIDENCE_MERGE, totals, evidence)])


def group_ratios(kind: str | None, peak: np.ndarray, size: np.ndarray, finite: np.ndarray, low: np.ndarray,
                 high: np.ndarray, scale: Any = 1.0, base: float = math.nan, loo: np.ndarray | None = None) -> np.ndarray:
    """Each group's peak |A| over what ``kind`` allows it (NumPy arrays, one slot per group).

    ``group_std``: ``G / sqrt(G - 1)`` (``nan`` for groups of one); ``group_mean`` and
    ``gpg``: ``scale`` x (the spread of the group's ``finite`` rewards, plus :data:`SLACK`
    of its largest |reward|) (``nan`` with fewer than two: a singleton's "baseline" is the
    estimator's own choice, verl's GRPO gives it its raw reward; GPG's ``scale`` is its
    batch factor);
    ``group_loo_std``: ``loo``, the largest |A| NeMo-RL's leave-one-out std gives the
    group's rewards (:func:`loo_bounds`); ``batch`` and ``none``: the step's ``base``;
    any other kind (not declared): the looser of the two group bounds.
    """
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 spreads and empty slots: inf and nan, as meant
        if kind in ("batch", "none"):
            return peak / base
        if kind == "group_std":
            return _std_ratios(peak, size)
        if kind in ("group_mean", "gpg"):
            return _spread_ratios(peak, finite, low, high, scale)
        if kind == "group_loo_std" and loo is not None:
            return np.where(peak == 0, np.where(loo >= 0, 0.0, math.nan), peak / loo)
        return np.fmin(_std_ratios(peak, size), _spread_ratios(peak, finite, low, high, scale))


def _std_ratios(peak: np.ndarray, size: np.ndarray) -> np.ndarray:
    pairs = np.where(size >= 2, size, math.nan)  # nan: a group of one normalizes to nothing
    return peak * np.sqrt(pairs - 1) / pairs


def _spread_ratios(peak: np.ndarray, finite: np.ndarray, low: np.ndarray, high: np.ndarray, scale: Any) -> np.ndarray:
    comparable = finite >= 2
    spread = np.where(comparable, high - low, math.nan)
    slack = SLACK * np.maximum(np.abs(np.where(comparable, low, 0.0)), np.abs(np.where(comparable, high, 0.0)))
    # 0 / 0 (a group of zeros whose advantages are all 0) is within its bound.
    return np.where(peak == 0, np.where(comparable, 0.0, math.nan), peak / (scale * (spread + slack)))


# --------------------------------------------------------------------------- per group


def group_peaks(segments: Any, abs_max: Any, nonfinite: Any) -> GroupPeaks | None:
    """Each group's peak |A| and non-finite advantage samples, from per-sample summaries
    (:func:`advmon.stats.rows.row_summaries`' ``peak()`` and ``nonfinite``).

    ``segments`` are :func:`advmon.stats.exemplars.reward_segments`' (NumPy, one slot per
    group). ``None`` without per-sample summaries.
    """
    if abs_max is None or nonfinite is None:
        return None
    return _host_group_peaks(segments.groups, abs_max, nonfinite)


def _host_group_peaks(groups: Any, abs_max: Any, nonfinite: Any) -> GroupPeaks:
    # A call's fixed cost here is its number of NumPy calls: few, and the common case's only.
    slots = groups.size.shape[0]
    if not slots:
        return GroupPeaks(np.zeros(0), np.zeros(0))
    starts = groups.bounds[:slots]
    per_sample = host_float64(abs_max)
    peak = np.maximum.reduceat(per_sample if groups.in_order else per_sample[groups.order], starts)
    if peak.min() == -np.inf:
        peak[peak == -np.inf] = np.nan  # no finite advantage in the group
    broken = host_float64(nonfinite)
    bad = np.zeros(slots)
    if broken.any():
        bad = np.add.reduceat(broken if groups.in_order else broken[groups.order], starts)
    return GroupPeaks(peak, bad)


def call_bounds(segments: Any, peaks: GroupPeaks | None, rewards: torch.Tensor,
                kind: str | None = None) -> tuple[Any, Any]:
    """A call's evidence (:data:`EVIDENCE_FIELDS`), and each group's peak over its bound under its declared ``kind``.

    ``rewards`` are the call's float64 per-sample rewards (a CPU tensor). Without ``peaks`` (no
    advantages per sample) only the reward counts are known. The groups' ratios
    (:func:`group_ratios`; the looser group bound when ``kind`` is not declared) are
    ``None`` without peaks and for ``batch`` and ``none``, whose bound is the step's.
    """
    groups = segments.groups
    size, low, high, finite = groups.size, groups.low, groups.high, groups.finite
    evidence = np.array(_EMPTY)
    r = host_float64(rewards)
    evidence[_FIELD["nonzero_rewards"]] = nonzero = np.count_nonzero(r)
    evidence[_FIELD["samples"]] = r.shape[0]
    if peaks is None or not size.shape[0]:
        return evidence, None
    # Both group bounds once, for the evidence and the call's own ratios (counted in NumPy calls: a call's cost).
    with np.errstate(divide="ignore", invalid="ignore"):
        by_size = _std_ratios(peaks.peak, size)
        by_spread = _spread_ratios(peaks.peak, finite, low, high, 1.0)
        loo = None
        if kind == "group_loo_std":
            bounds = loo_bounds(r if groups.in_order else r[groups.order], groups, size, finite)
            loo = group_ratios(kind, peaks.peak, size, finite, low, high, loo=bounds)
        _host_judged(evidence, peaks.peak, low, high, by_size, by_spread, loo)
        ratios = {"group_std": by_size, "group_mean": by_spread, "gpg": by_spread * (nonzero or 1) / r.shape[0],
                  "group_loo_std": loo, "batch": None, "none": None}.get(kind, np.fmin(by_size, by_spread))
    return evidence, ratios


def loo_bounds(ordered: np.ndarray, segments: Any, size: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """Per group, the largest |A| NeMo-RL's GRPO gives its rewards: each sample's reward minus its peers' mean,
    divided by its peers' std (Bessel) where that is > 0, left undivided where its peers are all equal.

    That is the estimator's own promise, exactly: a leave-one-out std is unbounded in
    general (peers that nearly agree give a large |A|, and healthily so), but it is what
    the rewards make it. Computed in float64 from centred sums, so peers that are equal
    give a std of 0 here, where float32's ``E[x^2] - E[x]^2`` may not (the cancellation
    this bound catches). A group of equal rewards is allowed ``G / sqrt(G - 1)``, as a
    normalized group. ``nan`` for groups with a non-finite reward or of one sample.
    ``ordered`` are the rewards in group order, ``segments`` (:class:`~advmon.stats.groups.HostGroups`) their groups.
    """
    count = ordered.shape[0]
    slots = size.shape[0]
    starts = segments.bounds[:slots]
    each = np.repeat(np.arange(slots), np.diff(segments.bounds[: slots + 1]))

    def per_group(values: Any, how: Any = np.add) -> Any:
        return how.reduceat(values, starts) if slots else np.zeros(0)

    n = size[each] if count else size[:0]
    centred = ordered - (per_group(ordered) / size)[each]
    spread = per_group(centred * centred)[each]  # (n - 1) x the group's sample variance
    gap = centred * n / np.where(n > 1, n - 1, math.nan)  # reward minus the peers' mean
    with np.errstate(divide="ignore", invalid="ignore"):
        peers = (spread - centred * gap) / (n - 2)  # the peers' sample variance (n >= 3)
        peers = np.where(n >= 3, peers, 0.0)
        # Equal peers: 0, give or take the rounding of the centred sums.
        equal = peers <= 1e-12 * np.where(n > 1, spread / (n - 1), 0.0)
        value = np.where(equal, np.abs(gap), np.abs(gap) / np.sqrt(np.where(equal, 1.0, peers)))
    bound = per_group(value, np.maximum)
    # A group of equal rewards is meant to get 0, but float32 leaves a little (NeMo-RL gives 1.5e-4 at reward
    # 0.01): what a normalized group could reach is harmless there.
    differ = per_group(np.abs(centred), np.maximum) > 0
    bound = np.where(differ, bound, size / np.sqrt(np.where(size >= 2, size - 1, 1.0)))
    return np.where((finite == size) & (size >= 2), bound, math.nan)


def _host_judged(evidence: np.ndarray, peak: np.ndarray, low: np.ndarray, high: np.ndarray, by_size: np.ndarray,
                 by_spread: np.ndarray, loo: np.ndarray | None) -> None:
    """Fill the evidence from the groups' ratios to both group bounds (``nan`` where one does not apply)."""
    evidence[_FIELD["std_ratio"]] = np.fmax.reduce(by_size, initial=-math.inf)  # fmax: a nan is no evidence
    evidence[_FIELD["spread_ratio"]] = np.fmax.reduce(by_spread, initial=-math.inf)
    if loo is not None:
        evidence[_FIELD["loo_ratio"]] = np.fmax.reduce(loo, initial=-math.inf)
    comparable = by_spread == by_spread  # two finite rewards or more, and a peak
    differ = comparable & (high > low)
    if differ.any():
        evidence[_FIELD["spread_ratio_low"]] = (peak[differ] / (high[differ] - low[differ])).min()
        evidence[_FIELD["judged_groups"]] = np.count_nonzero(differ)
    equal = comparable & ~differ
    if equal.any():
        evidence[_FIELD["equal_ratio"]] = by_spread[equal].max()
