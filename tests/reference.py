"""Independent NumPy references for every statistic advmon reports.

Written from the record's documented semantics, sharing no code with advmon.
"""

from __future__ import annotations

import math

import numpy as np

PERCENTILES = {"p01": 0.01, "p10": 0.10, "p50": 0.50, "p90": 0.90, "p99": 0.99}
VALUE_KEYS = ("mean", "std", "min", "max", "abs_mean", "count", "nan_count", "inf_count", *PERCENTILES)
REWARD_KEYS = ("mean", "std", "min", "max", "count", "nan_count", "inf_count")

#: What advmon promises for the percentiles of large (sketched) tensors (README.md, docs/api.md): each lies
#: between the two order statistics NumPy interpolates for it, each widened by this share of its own magnitude
#: (issue 36 asked for 1%; a bucket is at most 1/128 = 0.78% of its lower edge wide, plus float32 rounding).
SKETCHED_PERCENTILE_RELATIVE_ERROR = 0.008
#: ... or by this share of the largest magnitude, for order statistics that small (the sketch's tiny buckets).
SKETCHED_PERCENTILE_FLOOR = 2.0**-62


class ReferenceStats(dict):
    """:func:`value_stats`'s statistics, and each percentile's two order statistics (``order_bounds``)."""

    order_bounds: dict[str, tuple[float, float]]

#: float64's unit roundoff: a correctly rounded operation is within this much of the exact result, relatively.
UNIT_ROUNDOFF = 2.0**-53


def value_stats(values, valid=None) -> dict[str, float]:
    """Statistics of ``values`` over entries where ``valid > 0`` (all without it)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    keep = np.ones(x.shape, bool) if valid is None else (np.asarray(valid, dtype=np.float64).ravel() > 0)
    chosen = x[keep]
    finite = chosen[np.isfinite(chosen)]
    stats = ReferenceStats(
        count=float(chosen.size),
        nan_count=float(np.isnan(chosen).sum()),
        inf_count=float(np.isinf(chosen).sum()),
    )
    stats.order_bounds = {}
    if finite.size == 0:
        stats.update({k: math.nan for k in ("mean", "std", "min", "max", "abs_mean", *PERCENTILES)})
        return stats
    mean, std = _mean_and_std(finite)
    stats.update(
        mean=mean,
        std=std,
        min=float(np.min(finite)),
        max=float(np.max(finite)),
        abs_mean=float(np.mean(np.abs(finite))),
    )
    for name, q in PERCENTILES.items():
        stats[name] = float(np.quantile(finite, q))
        stats.order_bounds[name] = (float(np.quantile(finite, q, method="lower")),
                                    float(np.quantile(finite, q, method="higher")))
    return stats


def _mean_and_std(finite: np.ndarray) -> tuple[float, float]:
    """Mean and population std of finite float64 values, each within a few roundings of the exact one.

    ``math.fsum`` rounds the exact sum once. The std is the corrected two-pass formula (Chan, Golub
    and LeVeque, "Algorithms for computing the sample variance", 1983): the mean square of the
    deviations less the square of their mean, which takes out the error of the rounded mean. The
    plain two-pass formula (NumPy's ``std``) keeps its square: 2e-8 of the std for data at 1e12
    with a spread of 1e-3.
    """
    if finite.min() == finite.max():
        return float(finite[0]), 0.0
    n = finite.size
    mean = math.fsum(finite.tolist()) / n
    deviation = finite - mean
    shift = math.fsum(deviation.tolist()) / n
    variance = math.fsum((deviation * deviation).tolist()) / n - shift * shift
    return mean, math.sqrt(max(variance, 0.0))


def group_keys(groups) -> list:
    """One hashable key per sample: a row of a 2-D array, or the item itself."""
    array = np.asarray(groups)
    if array.ndim == 2:
        return [tuple(row.tolist()) for row in array]
    return [item.item() if isinstance(item, np.generic) else item for item in list(groups)]


def group_stats(rewards, keys, reward_range=None) -> dict[str, float]:
    """Group metrics from rewards and one key per sample, with Python loops."""
    r = np.asarray(rewards, dtype=np.float64)
    members: dict = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(r[i])
    comparable = zero = nonfinite = singles = low = high = 0
    for values in members.values():
        values = np.array(values)
        finite = values[np.isfinite(values)]
        singles += values.size == 1
        nonfinite += finite.size < values.size
        if finite.size >= 2:
            comparable += 1
            zero += bool(np.all(finite == finite[0]))
            if reward_range is not None:
                low += bool(np.all(finite <= reward_range[0]))
                high += bool(np.all(finite >= reward_range[1]))
    stats = {
        "groups/count": float(len(members)),
        "groups/singleton_count": float(singles),
        "groups/comparable_count": float(comparable),
        "groups/zero_std_count": float(zero),
        "groups/zero_std_fraction": zero / comparable if comparable else math.nan,
        "groups/nonfinite_count": float(nonfinite),
        "groups/max_size": float(max((len(v) for v in members.values()), default=0)),
    }
    if reward_range is not None:
        stats["groups/all_low_fraction"] = low / comparable if comparable else math.nan
        stats["groups/all_high_fraction"] = high / comparable if comparable else math.nan
    return stats


def derived_pre_norm(rewards, keys=None) -> np.ndarray:
    """Each reward minus the mean of the finite rewards of its group (the batch without keys)."""
    r = np.asarray(rewards, dtype=np.float64)
    keys = [0] * r.size if keys is None else keys
    out = np.empty_like(r)
    members: dict = {}
    for i, key in enumerate(keys):  # one pass: a scan of every key per group took 40 s at 8,192 groups
        members.setdefault(key, []).append(i)
    for idx in members.values():
        finite = r[idx][np.isfinite(r[idx])]
        mean = finite.mean() if finite.size else math.nan
        out[idx] = r[idx] - mean
    return out


def rounding_bound(terms: float) -> float:
    """``gamma_k = k u / (1 - k u)``: a float64 sum of ``k`` terms is within ``gamma_k`` times the sum of their
    magnitudes of the exact sum, whatever the order (Higham, *Accuracy and Stability of Numerical Algorithms*,
    2nd ed., section 4.2); vector width, FMA, threads and a GPU's reduction tree change the order only."""
    k = terms * UNIT_ROUNDOFF
    assert k < 0.5, terms
    return k / (1 - k)


def moment_tolerances(expected: dict) -> dict[str, float]:
    """How far advmon's ``mean``, ``std`` and ``abs_mean`` may be from :func:`value_stats`' (``expected``).

    Float64 rounding, each on the statistic's own scale. advmon sums, over the ``n`` finite values of range
    ``R = max - min``, their deviations ``d = x - c`` from a point ``c`` of the range (``|d| <= R``) and the
    squares of those, per part, chunk or block, and shifts each part's sums to a common point as parts merge:
    the mean is ``c + sum(d) / n``, the variance ``sum(d^2) / n - (sum(d) / n)^2``. ``gamma_N`` with
    ``N = 2n + 16`` counts every value's conversion, deviation, square and place in a sum, a shift per part
    (a part holds a value at least) and the final divisions, subtraction and square root. Then, with the
    constants doubled (which also covers the reference's own few roundings):

    * mean: ``4 gamma_N R + 3 u |mean|``, as ``sum(d) / n`` and its terms are at most ``R``;
    * variance: ``16 gamma_N (var + R^2)``, as ``sum(d^2) / n <= var + R^2`` and ``(sum(d) / n)^2 <= R^2``;
    * std: the variance's tolerance ``/ std + 2 u std`` (``|sqrt(a) - sqrt(b)| <= |a - b| / sqrt(b)``), and
      exactly 0 for a constant input (``R = 0``), whose deviations are all exactly 0;
    * abs_mean, a sum of magnitudes: ``2 gamma_N abs_mean``.

    So the std is held to ``~32 n u (1 + R^2 / var)`` of itself, which its values' offset does not enter:
    1.6e-8 for test_stats' 62,000 values at 1000 with a spread of 1e-3 (1e-9 of the values' magnitude, the
    check before, allowed 1e-3), 1.4e-5 for its zeros beside outliers (``R / std = 249``). A variance summed
    as ``sum(x^2) / n - mean^2`` loses ``u (mean / std)^2`` of itself instead: 2e-4 of that std at 1000.
    """
    n = expected["count"] - expected.get("nan_count", 0.0) - expected.get("inf_count", 0.0)
    spread = expected["max"] - expected["min"]
    gamma = rounding_bound(2 * n + 16)
    std = expected.get("std", math.nan)
    variance_tolerance = 16 * gamma * (std * std + spread * spread)
    return {
        "mean": 4 * gamma * spread + 3 * UNIT_ROUNDOFF * abs(expected.get("mean", math.nan)),
        "std": variance_tolerance / std + 2 * UNIT_ROUNDOFF * std if std > 0 else 0.0,
        "abs_mean": 2 * gamma * abs(expected.get("abs_mean", math.nan)),
    }


def percentile_bounds(expected: ReferenceStats, key: str) -> tuple[float, float]:
    """Where a sketched percentile may lie: between its two order statistics, each widened by the promise.

    Each is widened by :data:`SKETCHED_PERCENTILE_RELATIVE_ERROR` of its own magnitude, or by
    :data:`SKETCHED_PERCENTILE_FLOOR` of the data's largest magnitude if that is more (values so small share
    the sketch's tiny bucket), and by a few roundings of the data's magnitude (the interpolations).
    """
    assert isinstance(expected, ReferenceStats), "sketched percentiles are checked against value_stats' order statistics"
    low, high = expected.order_bounds[key]
    magnitude = max(abs(expected["max"]), abs(expected["min"]))
    slack = SKETCHED_PERCENTILE_FLOOR * magnitude + 8 * UNIT_ROUNDOFF * magnitude

    def widening(value: float) -> float:
        return SKETCHED_PERCENTILE_RELATIVE_ERROR * abs(value) + slack

    return low - widening(low), high + widening(high)


#: Whole numbers and values advmon picks out of its input: compared exactly.
EXACT_KEYS = ("count", "nan_count", "inf_count", "min", "max")


def assert_stats_close(got: dict, expected: dict, prefix: str = "", *, exact_percentiles: bool = True) -> None:
    """Compare advmon's metrics with reference statistics (:func:`value_stats`, or some of its keys).

    Counts and extrema exactly; moments to float64 rounding on their own scale (:func:`moment_tolerances`);
    percentiles exactly (to 1e-12 of the data's magnitude) or, for sketched inputs, between their order
    statistics widened by the promise (:func:`percentile_bounds`).
    """
    moments = moment_tolerances(expected) if {"mean", "std", "abs_mean"} & set(expected) else {}
    for key, want in expected.items():
        have = got[f"{prefix}{key}"]
        label = f"{prefix}{key}: advmon {have!r} vs numpy {want!r}"
        if math.isnan(want):
            assert math.isnan(have), label
            continue
        if key in EXACT_KEYS:
            tolerance = 0.0
        elif key in moments:
            tolerance = moments[key]
        elif key in PERCENTILES and not exact_percentiles:
            lowest, highest = percentile_bounds(expected, key)
            assert lowest <= have <= highest, f"{label}: outside [{lowest!r}, {highest!r}]"
            continue
        else:
            scale = max(abs(want), abs(expected.get("max", 0.0)), abs(expected.get("min", 0.0)), 1e-300)
            tolerance = (1e-12 if key in PERCENTILES else 1e-9) * scale
        assert abs(have - want) <= tolerance, f"{label}: off by {abs(have - want)!r}, allowed {tolerance!r}"


EXEMPLAR_REASONS = ("nonfinite_rewards", "nonfinite_reward_functions", "nonfinite_advantages", "beyond_bound",
                    "largest_abs_advantage")


def worst_groups(rewards, keys, advantages=None, mask=None, bound_factor=3.0, functions=()) -> list[dict]:
    """Every group worth naming, worst first, by docs/drilldown.md's rules, with Python loops.

    ``advantages`` is ``[B]`` or ``[B, T]`` (under ``mask > 0``); each entry's
    ``key`` is the group's key as ``keys`` gives it, ``first`` its first sample;
    ``functions`` are per-function scores (NaN where a function returned None).
    """
    r = np.asarray(rewards, dtype=np.float64)
    members: dict = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    a = None if advantages is None else np.asarray(advantages, dtype=np.float64)
    if a is not None and a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    m = None if mask is None or a is None or a.ndim == 1 else np.asarray(mask, dtype=np.float64) > 0
    entries = []
    for key, samples in members.items():
        values = r[samples]
        finite = values[np.isfinite(values)]
        peak, bad = -math.inf, 0
        for i in samples if a is not None else ():
            row = np.atleast_1d(a[i]) if a.ndim == 1 else a[i][m[i]] if m is not None else a[i]
            if not np.all(np.isfinite(row)):
                bad += 1  # a broken sample has no peak
            elif row.size:
                peak = max(peak, float(np.max(np.abs(row))))
        peak = math.nan if peak == -math.inf else peak
        size = len(samples)
        ratio = peak / (size / math.sqrt(size - 1)) if size > 1 else math.nan
        nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        function_bad = sum(int((~np.isfinite(np.asarray(f, dtype=np.float64)[samples])).sum()) for f in functions)
        if nan + inf:
            reason = "nonfinite_rewards"
        elif function_bad:
            reason = "nonfinite_reward_functions"
        elif bad:
            reason = "nonfinite_advantages"
        elif ratio > bound_factor:
            reason = "beyond_bound"
        elif peak >= 0:
            reason = "largest_abs_advantage"
        else:
            continue
        entries.append({
            "key": key, "first": samples[0], "reason": reason, "size": size,
            "reward_finite_count": int(finite.size), "reward_nan_count": nan, "reward_inf_count": inf,
            "reward_function_nonfinite_count": function_bad,
            "reward_min": float(finite.min()) if finite.size else math.nan,
            "reward_max": float(finite.max()) if finite.size else math.nan,
            "reward_mean": float(finite.mean()) if finite.size else math.nan,
            "advantage_abs_max": peak, "advantage_nonfinite_samples": bad, "advantage_bound_ratio": ratio,
        })
    return sorted(entries, key=exemplar_badness)


def exemplar_badness(entry: dict) -> tuple:
    """Worst first: the reason, then the most non-finite values, then the largest |advantage|."""
    nonfinite = (entry["reward_nan_count"] + entry["reward_inf_count"] + entry["reward_function_nonfinite_count"]
                 + entry["advantage_nonfinite_samples"])
    peak = entry["advantage_abs_max"]
    return EXEMPLAR_REASONS.index(entry["reason"]), -nonfinite, -(peak if not math.isnan(peak) else -1.0)


def slice_stats(labels, rewards, keys=None, advantages=None, mask=None, functions=()) -> dict[str, dict[str, float]]:
    """Per-label statistics with Python loops: the record's ``slices/<label>/...`` values (labels already folded)."""
    r = np.asarray(rewards, dtype=np.float64)
    a = None if advantages is None else np.asarray(advantages, dtype=np.float64)
    if a is not None and a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    m = None if mask is None or a is None or a.ndim == 1 else np.asarray(mask, dtype=np.float64) > 0
    first_of_group: dict = {}
    for i, key in enumerate(keys or []):
        first_of_group.setdefault(key, i)
    out: dict[str, dict[str, float]] = {}
    for label in dict.fromkeys(labels):
        samples = [i for i, lab in enumerate(labels) if lab == label]
        values = r[samples]
        finite = values[np.isfinite(values)]
        entry = {
            "rewards/count": float(len(samples)),
            "rewards/mean": float(finite.mean()) if finite.size else math.nan,
            "rewards/nan_count": float(np.isnan(values).sum()),
            "rewards/inf_count": float(np.isinf(values).sum()),
            "rewards/function_nonfinite_count": float(sum(
                (~np.isfinite(np.asarray(f, dtype=np.float64)[samples])).sum() for f in functions)),
        }
        if keys is not None:
            comparable = zero = 0
            for key, first in first_of_group.items():
                if labels[first] != label:
                    continue
                group = r[[i for i, k in enumerate(keys) if k == key]]
                kept = group[np.isfinite(group)]
                if kept.size >= 2:
                    comparable += 1
                    zero += int(np.all(kept == kept[0]))
            entry.update({"groups/comparable_count": float(comparable), "groups/zero_std_count": float(zero),
                          "groups/zero_std_fraction": zero / comparable if comparable else math.nan})
        if a is not None:
            chosen = []
            for i in samples:
                row = np.atleast_1d(a[i]) if a.ndim == 1 else a[i][m[i]] if m is not None else a[i]
                chosen.extend(row[np.isfinite(row)].tolist())
            chosen = np.array(chosen)
            entry.update({
                "advantages/post_norm/count": float(chosen.size),
                "advantages/post_norm/mean": float(chosen.mean()) if chosen.size else math.nan,
                "advantages/post_norm/abs_max": float(np.abs(chosen).max()) if chosen.size else math.nan,
            })
        out[label] = entry
    return out


def _sample_peaks(advantages, mask) -> list[float]:
    """Each sample's largest finite |A| at its valid positions; ``nan`` for a sample with a non-finite one or none."""
    a = np.asarray(advantages, dtype=np.float64)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    m = None if mask is None or a.ndim == 1 else np.asarray(mask, dtype=np.float64) > 0
    peaks = []
    for i in range(a.shape[0]):
        row = np.atleast_1d(a[i]) if a.ndim == 1 else a[i][m[i]] if m is not None else a[i]
        peaks.append(float(np.max(np.abs(row))) if row.size and np.all(np.isfinite(row)) else math.nan)
    return peaks


def group_bound_ratios(kind, rewards, keys, advantages, mask=None) -> list[float]:
    """Each group's peak |A| over what ``kind`` allows it (docs/alerts.md, Normalization kinds), with loops.

    group_std: G / sqrt(G - 1); group_mean: the spread of its finite rewards (two at least) plus 1e-6 of its
    largest |reward| (0 / 0 counts as 0); gpg: B / max(1, rewards != 0) times that; group_loo_std: the largest
    |reward - peers' mean| / peers' std (undivided where the peers are all equal) of its samples.
    """
    r = np.asarray(rewards, dtype=np.float64)
    peaks = _sample_peaks(advantages, mask)
    members: dict = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    scale = r.size / max(1, int(np.count_nonzero(r))) if kind == "gpg" else 1.0
    ratios = []
    for samples in members.values():
        known = [peaks[i] for i in samples if not math.isnan(peaks[i])]
        peak = max(known) if known else math.nan
        finite = r[samples][np.isfinite(r[samples])]
        size = len(samples)
        by_size = peak * math.sqrt(size - 1) / size if size >= 2 else math.nan
        if finite.size >= 2 and not math.isnan(peak):
            spread = float(finite.max() - finite.min())
            denominator = scale * (spread + 1e-6 * max(abs(float(finite.min())), abs(float(finite.max()))))
            by_spread = 0.0 if peak == 0 else (peak / denominator if denominator > 0 else math.inf)
        else:
            by_spread = math.nan
        if kind == "group_std":
            ratios.append(by_size)
        elif kind in ("group_mean", "gpg"):
            ratios.append(by_spread)
        elif kind == "group_loo_std":
            ratios.append(_loo_ratio(peak, r[samples]))
    return ratios


def _loo_ratio(peak: float, values: np.ndarray) -> float:
    """A group's peak over the largest |A| a leave-one-out baseline and std (NeMo-RL's GRPO) give its rewards."""
    if values.size < 2 or not np.all(np.isfinite(values)) or math.isnan(peak):
        return math.nan
    if np.all(values == values[0]):  # meant to be 0; float32 rounding below a normalized group's reach is harmless
        largest = values.size / math.sqrt(values.size - 1)
        return 0.0 if peak == 0 else peak / largest
    largest = 0.0
    for i in range(values.size):
        peers = np.delete(values, i)
        gap = abs(values[i] - peers.mean())
        equal = np.all(peers == peers[0])
        largest = max(largest, gap if equal else gap / peers.std(ddof=1))
    if peak == 0:
        return 0.0
    return peak / largest if largest > 0 else math.inf


def bound_ratio(kind, rewards, keys, advantages, mask=None, reward_range=None) -> float:
    """A step's ``advantages/bound_ratio`` under ``kind``, from its rewards, groups and advantages.

    ``unknown`` is the smallest of the group_std, group_mean, batch and none ratios, and ``nan`` without a
    reward scale.
    """
    r = np.asarray(rewards, dtype=np.float64)
    post = value_stats(advantages, mask)
    abs_max = max(abs(post["min"]), abs(post["max"])) if not math.isnan(post["max"]) else math.nan
    if kind in ("group_std", "group_mean", "gpg", "group_loo_std"):
        known = [x for x in group_bound_ratios(kind, r, keys, advantages, mask) if not math.isnan(x)]
        return max(known) if known else math.nan
    if kind == "batch":  # whitened: a std of 1, and no |A| beyond sqrt(N - 1) (Samuelson)
        finite = post["count"] - post["nan_count"] - post["inf_count"]
        return max(post["std"], abs_max / max(1.0, math.sqrt(finite - 1) if finite > 1 else 1.0))
    if kind == "none":
        finite = r[np.isfinite(r)]
        scales = [abs(finite.min()), abs(finite.max()), finite.max() - finite.min()] if finite.size else []
        if reward_range is not None:
            scales.append(reward_range[1] - reward_range[0])
        scale = max(scales, default=0.0)
        return abs_max / scale if scale > 0 else math.nan
    assert kind == "unknown", kind
    ratios = [bound_ratio(k, r, keys, advantages, mask, reward_range)
              for k in ("group_std", "group_mean", "batch", "none")]
    return math.nan if math.isnan(ratios[-1]) else min(x for x in ratios if not math.isnan(x))
