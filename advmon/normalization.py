"""Normalization kinds: what an estimator promises about the size of its advantages, declared or inferred.

Estimators normalize differently, and rewards come at any scale, so "how large may
|A| be" has one answer per kind (docs/alerts.md, "Normalization kinds"):

=================  ==========================================================  ===========================
kind               estimators                                                  a healthy step's bound
=================  ==========================================================  ===========================
``group_std``      GRPO dividing by the group's reward std (verl ``grpo``,     ``G / sqrt(G - 1)`` per group
                   TRL ``scale_rewards="group"``)
``group_loo_std``  NeMo-RL's GRPO: leave-one-out baseline and std, a sample    as ``group_std``; the group's
                   whose peers are all equal is left undivided                 spread where one sample is odd
``group_mean``     a baseline inside the group's rewards, no std: Dr. GRPO,    the group's reward spread
                   RLOO, OPO
``gpg``            GPG: a group mean baseline times ``B / (rewards != 0)``     that factor x the spread
``batch``          whitened over the batch: REINFORCE++, GAE, GDPO, TRL        a std of 1, and |A| within
                   ``scale_rewards="batch"``                                   ``sqrt(N - 1)`` for N values
``none``           in reward units: ReMax, raw rewards, unwhitened returns     the step's reward scale
=================  ==========================================================  ===========================

A record carries the kind (``Record.normalization``), whether it was declared or
inferred, what the data look like, and ``advantages/bound_ratio``: the step's |A|
over its kind's bound, which the alert compares with ``bound_factor`` whatever the
kind. Where nobody declared a kind, :func:`infer` reads it from the call's groups,
and says ``unknown`` when the data fit several kinds or none; then the loosest of
all kinds' bounds judges the step, so ambiguity never pages anyone.

Example:
    >>> verdict = judge([None], None, {"post_norm": {"count": 4096.0, "mean": 0.0, "std": 1.0, "min": -3.1,
    ...                                              "max": 4.2, "nan_count": 0.0, "inf_count": 0.0}}, None)
    >>> verdict.kind, verdict.source, verdict.ratio  # whitened: a std of 1, |A| 4.2 well within sqrt(4095)
    ('batch', 'inferred', 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np

from advmon.errors import AdvmonConfigError
from advmon.stats import EVIDENCE_FIELDS, group_ratios

__all__ = [
    "KINDS",
    "Kind",
    "Normalization",
    "Verdict",
    "checked_normalization",
    "infer",
    "judge",
    "resolve",
    "step_ratios",
]

Kind = Literal["group_std", "group_loo_std", "group_mean", "gpg", "batch", "none"]
#: The kinds an estimator can be declared as (``watch(normalization=...)``).
KINDS: tuple[str, ...] = ("group_std", "group_loo_std", "group_mean", "gpg", "batch", "none")
#: A declared normalization: a kind, a function of the call's arguments that returns one (``None``: infer
#: it), or ``None`` (infer it from the data).
Normalization = Union[Kind, Callable[[Mapping[str, Any]], Union[str, None]], None]
#: What a record says when its kind is not known: the data fit several kinds or none / its calls disagree.
UNKNOWN, MIXED = "unknown", "mixed"
#: Tolerance of the inference's exact promises (|A| <= the bound, a whitened mean 0 and std 1).
_TOLERANCE = 1e-3
_WHITENED_TOLERANCE = 0.05


def checked_normalization(value: Any) -> Normalization:
    """A declared normalization, or a clear error (when the estimator is wrapped, not during training).

    Example:
        >>> checked_normalization("group_mean")
        'group_mean'
        >>> checked_normalization("grpo")
        Traceback (most recent call last):
        ...
        advmon.errors.AdvmonConfigError: unknown normalization 'grpo'; expected one of group_std, group_loo_std, group_mean, gpg, batch, none, a function of the call's arguments returning one, or None to infer it (docs/alerts.md, Normalization kinds)
    """
    if value is None or callable(value) or value in KINDS:
        return value
    raise AdvmonConfigError(
        f"unknown normalization {value!r}; expected one of {', '.join(KINDS)}, a function of the call's "
        "arguments returning one, or None to infer it (docs/alerts.md, Normalization kinds)")


def resolve(declared: Normalization, arguments: Mapping[str, Any]) -> str | None:
    """The kind a call declares: ``declared`` itself, or what a function of the call's arguments returns.

    Raises:
        ValueError: the function raised or returned something that is not a kind.
    """
    if not callable(declared):
        return declared
    try:
        kind = declared(arguments)
    except Exception as exc:  # noqa: BLE001 - reported by the caller as a problem of the call
        raise ValueError(f"the normalization function {getattr(declared, '__qualname__', declared)!r} raised "
                         f"{type(exc).__name__}: {exc}; the kind is inferred instead") from exc
    if kind is not None and kind not in KINDS:
        raise ValueError(f"the normalization function {getattr(declared, '__qualname__', declared)!r} returned "
                         f"{kind!r}, not one of {', '.join(KINDS)}; the kind is inferred instead")
    return kind


# --------------------------------------------------------------------------- a step's bounds


def _evidence(evidence: np.ndarray | Mapping[str, float] | None) -> Mapping[str, float]:
    if evidence is None:
        return {}
    if isinstance(evidence, Mapping):
        return evidence  # read once already
    return dict(zip(EVIDENCE_FIELDS, evidence.tolist()))


def _known(value: float | None) -> float:
    """An evidence maximum, ``nan`` where no group gave one (its identity, -inf)."""
    return math.nan if value is None or value == -math.inf else value


def _abs_max(summary: Mapping[str, float]) -> float:
    ends = [abs(summary.get(end, math.nan)) for end in ("min", "max")]
    finite = [e for e in ends if not math.isnan(e)]
    return max(finite) if finite else math.nan


def gpg_scale(evidence: Mapping[str, float]) -> float:
    """GPG's batch factor ``B / max(1, rewards != 0)`` (1 without rewards)."""
    samples = evidence.get("samples", 0.0)
    return samples / max(1.0, evidence.get("nonzero_rewards", 0.0)) if samples > 0 else 1.0


def batch_base(summaries: Mapping[str, Mapping[str, float]]) -> float:
    """The most |A| whitening over the batch allows: ``sqrt(N - 1)`` for N finite values of std 1 (Samuelson's
    inequality, the batch's G/sqrt(G-1)), at least 1."""
    post = summaries.get("post_norm", {})
    finite = post.get("count", 0.0) - post.get("nan_count", 0.0) - post.get("inf_count", 0.0)
    return max(1.0, math.sqrt(finite - 1)) if finite > 1 else 1.0


def reward_scale(summaries: Mapping[str, Mapping[str, float]], reward_range: tuple[float, float] | None) -> float:
    """The step's reward scale: its largest |reward|, its rewards' spread, or the reward range's width
    (``nan`` when all are 0 or unknown: advantages in reward units cannot be judged then)."""
    rewards = summaries.get("rewards", {})
    low, high = rewards.get("min", math.nan), rewards.get("max", math.nan)
    candidates = [abs(low), abs(high), high - low]
    if reward_range is not None:
        candidates.append(reward_range[1] - reward_range[0])
    scale = max((c for c in candidates if c == c), default=math.nan)
    return scale if scale > 0 else math.nan


def step_ratios(evidence: np.ndarray | Mapping[str, float] | None, summaries: Mapping[str, Mapping[str, float]],
                reward_range: tuple[float, float] | None, scale: float | None = None) -> dict[str, float]:
    """The step's |A| over each kind's bound (``nan`` where the kind cannot judge it); ``scale`` is the step's
    :func:`reward_scale` when the caller has it."""
    found = _evidence(evidence)
    abs_max = _abs_max(summaries.get("post_norm", {}))
    spread = _known(found.get("spread_ratio"))
    scale = reward_scale(summaries, reward_range) if scale is None else scale
    return {
        "group_std": _known(found.get("std_ratio")),
        "group_loo_std": _known(found.get("loo_ratio")),
        "group_mean": spread,
        "gpg": spread / gpg_scale(found),
        # Whitened advantages have a std of 1 and reach sqrt(N - 1) at most, however sparse their rewards.
        "batch": max(summaries.get("post_norm", {}).get("std", math.nan), abs_max / batch_base(summaries)),
        "none": abs_max / scale,
    }


#: The kinds whose bounds an unknown step takes the loosest of (``group_loo_std`` and ``gpg`` are never
#: looser than both group bounds together).
_LOOSEST_OF = ("group_std", "group_mean", "batch", "none")


def infer(evidence: np.ndarray | Mapping[str, float] | None, summaries: Mapping[str, Mapping[str, float]]) -> str:
    """The kind the data fit, from the groups' peaks and the post-norm statistics; ``unknown`` when they fit
    several or none.

    * ``group_std``: every group's |A| within ``G / sqrt(G - 1)``, groups of equal rewards at 0;
    * ``group_mean``: every group's |A| between half its reward spread and the whole (a baseline inside
      the group's rewards reaches at least half the spread), groups of equal rewards at 0;
    * ``batch``: the valid values' mean within 0.05 of 0 and their std within 0.05 of 1.

    Example:
        >>> evidence = np.array([0.29, 0.875, 0.875, 0.5, 0.0, 12.0, 40.0, 128.0])
        >>> infer(evidence, {})  # binary rewards at scale 1, no std: both group bounds hold
        'unknown'
        >>> evidence[:4] = [5.8, 0.875, 5.8, 0.5]  # the same at scale 20: |A| 17.5
        >>> infer(evidence, {})
        'group_mean'
    """
    found = _evidence(evidence)
    fits = []
    # Groups of equal rewards must have |A| at 0 (their identity, -inf: there are none).
    if found.get("judged_groups", 0.0) >= 1 and found["equal_ratio"] <= 1.0:
        if found["std_ratio"] <= 1.0 + _TOLERANCE:
            fits.append("group_std")
        if found["spread_ratio"] <= 1.0 + _TOLERANCE and found["spread_ratio_low"] >= 0.5 - _TOLERANCE:
            fits.append("group_mean")
    post = summaries.get("post_norm", {})
    if (post.get("count", 0.0) >= 2 and abs(post.get("mean", math.nan)) <= _WHITENED_TOLERANCE
            and abs(post.get("std", math.nan) - 1.0) <= _WHITENED_TOLERANCE):
        fits.append("batch")
    return fits[0] if len(fits) == 1 else UNKNOWN


@dataclass(frozen=True)
class Verdict:
    """How a step's advantages were normalized and how far they went past their bound."""

    kind: str  #: the kind the record reports: one of :data:`KINDS`, ``unknown`` or ``mixed``
    source: str | None  #: ``declared``, ``inferred``, or ``None`` without advantages
    observed: str | None  #: what the data look like (:func:`infer`), ``None`` without advantages
    ratio: float  #: ``advantages/bound_ratio``
    bound_kind: str | None  #: whose bound gave the ratio (for ``unknown`` and ``mixed``, the loosest)
    scale: float = 1.0  #: GPG's batch factor
    batch_base: float = math.nan
    reward_scale: float = math.nan

    def contradicted(self, factor: float) -> bool:
        """A declared kind whose bound the step breaks while the data plainly fit another kind."""
        return (self.source == "declared" and self.kind in KINDS and self.observed not in (None, UNKNOWN, self.kind)
                and self.ratio > factor)

    def group_ratios(self, peak: np.ndarray, size: np.ndarray, finite: np.ndarray, low: np.ndarray,
                     high: np.ndarray) -> np.ndarray:
        """Groups' peaks over their bounds under this step's kind (the loosest of all for unknown steps)."""
        values = (peak, size, finite, low, high)
        if self.kind in KINDS and self.kind != "group_loo_std":
            base = self.batch_base if self.kind == "batch" else self.reward_scale
            return group_ratios(self.kind, *values, scale=self.scale if self.kind == "gpg" else 1.0, base=base)
        candidates = [group_ratios(kind, *values, base=base)
                      for kind, base in (("group_std", math.nan), ("group_mean", math.nan),
                                         ("batch", self.batch_base), ("none", self.reward_scale))]
        return np.fmin.reduce(candidates)


def judge(declared: Sequence[str | None], evidence: np.ndarray | None,
          summaries: Mapping[str, Mapping[str, float]], reward_range: tuple[float, float] | None) -> Verdict:
    """A step's :class:`Verdict` from its calls' declared kinds (``None``: not declared) and merged evidence.

    The declared kind judges the step when every call declared the same; with none declared, the
    inferred one; calls that disagree make the step ``mixed``, judged as ``unknown`` is: by the
    loosest bound of all kinds, or not at all without a reward scale (its advantages could then be in
    any unit).
    """
    found = _evidence(evidence)
    post = summaries.get("post_norm")
    observed = infer(found, summaries) if post is not None else None
    kinds = set(declared)
    if len(kinds) > 1:
        kind, source = MIXED, ("declared" if None not in kinds else "inferred")
    elif kinds and None not in kinds:
        kind, source = kinds.pop(), "declared"
    else:
        kind, source = (observed or UNKNOWN), ("inferred" if post is not None else None)
    scale = reward_scale(summaries, reward_range)
    ratios = step_ratios(found, summaries, reward_range, scale)
    if kind in KINDS:
        bound_kind, ratio = kind, ratios[kind]
    elif math.isnan(ratios["none"]):
        bound_kind, ratio = None, math.nan
    else:
        judged = [(ratios[k], k) for k in _LOOSEST_OF if not math.isnan(ratios[k])]
        ratio, bound_kind = min(judged)
    return Verdict(kind=kind, source=source, observed=observed, ratio=ratio, bound_kind=bound_kind,
                   scale=gpg_scale(found), batch_base=batch_base(summaries), reward_scale=scale)
