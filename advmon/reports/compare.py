"""``advmon compare``: do two runs of one recipe diverge, where, and in which statistic first?

Method (``docs/compare.md``): the runs are aligned by step (the steps both
recorded), and two values of one step closer than the statistic's own rounding
(:data:`ROUNDING` times the largest |value| behind it) are one value. Each slice both runs recorded (``slices/<label>/...``) is compared
the same way, statistic by statistic, and the slice that diverges first is named. For each statistic and each step ``t``, the values of the last
``window`` common steps of run A are compared with those of run B by a
Mann-Whitney rank test: ``z`` measures how far A's values sit above or below B's
*relative to the spread both runs show inside that window*, so each run's own
step-to-step noise sets the bar, and a slow trend both runs share cancels out.
Ranks make one huge value (an |A| of 7,000 among values near 1) count as one
value, not as a scale change. A statistic diverges where ``|z| >= z_threshold``
holds for ``persistence`` consecutive steps; its first divergence is the first
step of that stretch. The runs diverge when any statistic does.

With ``window=20`` the largest possible ``|z|`` is 5.4 (the two windows fully
separated); the default threshold 4.0 (two-sided p ~ 6e-5) needs an almost full
separation, kept for 3 steps.

Example:
    >>> import numpy as np
    >>> a = np.zeros(40); b = np.concatenate([np.zeros(20), np.ones(20)])
    >>> a[::2] += 0.01; b[1::2] += 0.01   # a little noise in both
    >>> z = rolling_rank_z(a, b, window=10)
    >>> int(np.argmax(np.abs(z) >= 3.5))   # the first window end with strong evidence, 8 steps after the shift
    28
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from advmon.progress import Progress
from advmon.record import abs_max
from advmon.runs import Run, RunSourceError

__all__ = [
    "COMPARED_KEYS",
    "SLICE_KEYS",
    "Comparison",
    "StatisticVerdict",
    "compare_runs",
    "rolling_rank_z",
    "within_rounding",
    "slice_of",
    "write_comparison_html",
]

#: The statistics compared, in the order they are reported.
COMPARED_KEYS = (
    "advantages/post_norm/mean",
    "advantages/post_norm/std",
    "advantages/post_norm/abs_mean",
    "advantages/post_norm/min",
    "advantages/post_norm/max",
    "advantages/post_norm/p01",
    "advantages/post_norm/p50",
    "advantages/post_norm/p99",
    "advantages/post_norm/nan_count",
    "advantages/post_norm/inf_count",
    "advantages/pre_norm/mean",
    "advantages/pre_norm/std",
    "groups/zero_std_fraction",
    "groups/all_low_fraction",
    "groups/all_high_fraction",
    "rewards/mean",
    "rewards/std",
    "rewards/nan_count",
    "rewards/inf_count",
)
#: Each slice's statistics compared (``slices/<label>/<key>``), for the slices both runs recorded.
SLICE_KEYS = (
    "rewards/mean",
    "rewards/nan_count",
    "groups/zero_std_fraction",
    "advantages/post_norm/mean",
    "advantages/post_norm/abs_max",
)
_CHUNK = 8192
#: Two runs' values of a statistic at one step closer than this many float64 rounding units of the largest
#: |value| behind it are one value (``docs/compare.md``, "Rounding"): advmon sums in float64, so a mean of
#: values near 1 that is 0 in one run can be 1e-17 in the other, and ranks would call that a divergence.
ROUNDING_UNITS = 64
ROUNDING = ROUNDING_UNITS * float(np.finfo(np.float64).eps)  # 1.42e-14


def rolling_rank_z(a: np.ndarray, b: np.ndarray, window: int) -> np.ndarray:
    """Mann-Whitney ``z`` of A's last ``window`` values against B's, at every step (``nan`` before a full window).

    NaN values are left out of their window; a window with fewer than
    ``window // 2`` values on either side gives ``nan``. Ties count one half.
    """
    n = len(a)
    z = np.full(n, np.nan)
    if n < window:
        return z
    from numpy.lib.stride_tricks import sliding_window_view

    windows_a, windows_b = sliding_window_view(a, window), sliding_window_view(b, window)
    for start in range(0, len(windows_a), _CHUNK):
        wa, wb = windows_a[start : start + _CHUNK], windows_b[start : start + _CHUNK]
        valid_a, valid_b = np.isfinite(wa), np.isfinite(wb)
        left, right = wa[:, :, None], wb[:, None, :]
        pairs = valid_a[:, :, None] & valid_b[:, None, :]
        greater = ((left > right) & pairs).sum(axis=(1, 2))
        ties = ((left == right) & pairs).sum(axis=(1, 2))
        n1, n2 = valid_a.sum(axis=1).astype(np.float64), valid_b.sum(axis=1).astype(np.float64)
        u = greater + 0.5 * ties
        with np.errstate(invalid="ignore", divide="ignore"):
            sigma = np.sqrt(n1 * n2 * (n1 + n2 + 1) / 12.0)
            scores = (u - n1 * n2 / 2.0) / sigma
        enough = (n1 >= window // 2) & (n2 >= window // 2)
        z[start + window - 1 : start + window - 1 + len(wa)] = np.where(enough, scores, np.nan)
    return z


#: Why a statistic diverged (the earliest of these decides its first step).
REASONS = {
    "non_finite": "NaN/Inf in one run only",
    "magnitude": "orders of magnitude apart",
    "from_start": "different from the start",
    "rank": "rank test",
}


@dataclass
class StatisticVerdict:
    """One statistic: whether and where it diverged, why, and how strongly."""

    key: str
    diverged: bool
    first_step: int | None
    max_abs_z: float
    mean_a: float  # over the whole common range
    mean_b: float
    reason: str | None = None  #: a key of :data:`REASONS`

    def to_dict(self) -> dict[str, Any]:
        return {
            "statistic": self.key,
            "diverged": self.diverged,
            "first_step": self.first_step,
            "reason": self.reason,
            "max_abs_z": _json_number(self.max_abs_z),
            "mean_a": _json_number(self.mean_a),
            "mean_b": _json_number(self.mean_b),
        }


def _json_number(value: float) -> float | None:
    return round(float(value), 6) if math.isfinite(value) else None


@dataclass
class Comparison:
    run_a: Run
    run_b: Run
    steps: np.ndarray
    statistics: list[StatisticVerdict]
    window: int
    z_threshold: float
    persistence: int
    series: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    #: Per-slice statistics (``slices/<label>/...``) of the slices both runs recorded.
    slices: list[StatisticVerdict] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return any(s.diverged for s in (*self.statistics, *self.slices))

    @property
    def first_slice(self) -> tuple[str, int, list[str]] | None:
        """The slice that diverges first: its label, step and the statistics that diverged there."""
        diverged = sorted((s for s in self.slices if s.diverged), key=lambda s: (s.first_step, -s.max_abs_z))
        if not diverged:
            return None
        label = slice_of(diverged[0].key)
        first = diverged[0].first_step
        return label, first, [s.key for s in diverged if s.first_step == first and slice_of(s.key) == label]

    @property
    def first_divergence(self) -> int | None:
        steps = [s.first_step for s in self.statistics if s.first_step is not None]
        return min(steps) if steps else None

    def diverged_in_order(self) -> list[StatisticVerdict]:
        return sorted((s for s in self.statistics if s.diverged), key=lambda s: (s.first_step, -s.max_abs_z))

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": "diverged" if self.diverged else "equivalent",
            "first_divergence_step": self.first_divergence,
            "first_statistics": [s.key for s in self.diverged_in_order() if s.first_step == self.first_divergence],
            "run_a": {"name": self.run_a.name, "source": self.run_a.source},
            "run_b": {"name": self.run_b.name, "source": self.run_b.source},
            "common_steps": int(len(self.steps)),
            "method": {"test": "rolling Mann-Whitney z over aligned steps", "window": self.window,
                       "z_threshold": self.z_threshold, "persistence": self.persistence},
            "statistics": [s.to_dict() for s in self.statistics],
            "first_slice": None if self.first_slice is None else {
                "slice": self.first_slice[0], "step": self.first_slice[1], "statistics": self.first_slice[2]},
            "slice_statistics": [s.to_dict() for s in self.slices],
        }

    def to_text(self) -> str:
        a, b = self.run_a, self.run_b
        lines = [
            f"compare {a.name} ({a.source}) with {b.name} ({b.source}): {len(self.steps)} common steps "
            f"({int(self.steps[0])}-{int(self.steps[-1])}), windows of {self.window}, |z| >= {self.z_threshold:g} "
            f"for {self.persistence} steps"
        ]
        if self.diverged:
            first = [s for s in self.diverged_in_order() if s.first_step == self.first_divergence]
            if first:
                lines.append(f"diverged: first divergence at step {self.first_divergence} "
                             f"({', '.join(s.key for s in first)})")
            else:
                lines.append("diverged: in a slice only; the run-wide statistics stayed within their noise")
        else:
            strongest = max(self.statistics, key=lambda s: s.max_abs_z if math.isfinite(s.max_abs_z) else -1, default=None)
            detail = f"; largest |z| {strongest.max_abs_z:.2f} on {strongest.key}" if strongest else ""
            lines.append(f"equivalent: no statistic diverged beyond the runs' own noise{detail}")
        ordered = self.diverged_in_order() + [s for s in self.statistics if not s.diverged]
        width = max([len("statistic"), *(len(s.key) for s in ordered)])  # columns line up whatever the keys
        lines.append(f"  {'statistic':{width}} {'verdict':10} {'first step':>10} {'max |z|':>8} {'mean A':>12} "
                     f"{'mean B':>12}  why")
        for s in ordered:
            verdict = "DIVERGED" if s.diverged else "same"
            first = "-" if s.first_step is None else str(s.first_step)
            why = REASONS[s.reason] if s.reason else ""
            lines.append(f"  {s.key:{width}} {verdict:10} {first:>10} {_fmt(s.max_abs_z):>8} {_fmt(s.mean_a):>12} "
                         f"{_fmt(s.mean_b):>12}  {why}".rstrip())
        if self.slices:
            found = self.first_slice
            if found is None:
                labels = sorted({slice_of(s.key) for s in self.slices})
                lines.append(f"slices ({', '.join(labels)}): none diverged")
            else:
                label, step, keys = found
                lines.append(f"slices: {label} diverges first, at step {step} ({', '.join(keys)})")
            diverged = sorted((s for s in self.slices if s.diverged), key=lambda s: (s.first_step, -s.max_abs_z))
            width = max([0, *(len(s.key) for s in diverged)])
            for s in diverged:
                lines.append(f"  {s.key:{width}} DIVERGED at step {s.first_step:>6} max |z| {_fmt(s.max_abs_z)}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _fmt(value: float) -> str:
    """4 significant digits; float noise around 0 (a mean of -2e-20) reads 0.

    Example:
        >>> _fmt(-1.962e-20), _fmt(1861.37), _fmt(math.nan)
        ('0', '1861', '-')
    """
    if not math.isfinite(value):
        return "-"
    return "0" if abs(value) < 1e-12 else f"{value:.4g}"


def slice_of(key: str) -> str:
    """``slices/<label>/...`` -> ``<label>``.

    Example:
        >>> slice_of("slices/gsm8k/rewards/mean")
        'gsm8k'
    """
    return key.split("/")[1]


def _common_slices(run_a: Run, run_b: Run) -> list[str]:
    """The slice labels both runs recorded, in run A's order of appearance."""
    def labels(run: Run) -> dict[str, None]:
        found: dict[str, None] = {}
        for record in run.records:
            for key in record.metrics:
                if key.startswith("slices/") and key.endswith("/rewards/count"):
                    found.setdefault(key[len("slices/") : -len("/rewards/count")])
        return found

    theirs = labels(run_b)
    return [label for label in labels(run_a) if label in theirs and "/" not in label]


def _aligned(run_a: Run, run_b: Run) -> tuple[np.ndarray, dict[int, Any], dict[int, Any]]:
    by_step_a = {r.step: r for r in run_a.records}
    by_step_b = {r.step: r for r in run_b.records}
    common = np.array(sorted(set(by_step_a) & set(by_step_b)), dtype=np.int64)
    if common.size == 0:
        raise RunSourceError(f"runs {run_a.name} and {run_b.name} have no step in common")
    return common, by_step_a, by_step_b


def compare_runs(run_a: Run, run_b: Run, window: int = 20, z_threshold: float = 4.0, persistence: int = 3) -> Comparison:
    """Compare two runs statistic by statistic (see the module doc for the method)."""
    if window < 4 or persistence < 1 or not z_threshold > 0:
        raise RunSourceError(f"window must be >= 4, persistence >= 1 and z > 0 (got {window}, {persistence}, {z_threshold})")
    steps, by_a, by_b = _aligned(run_a, run_b)
    if len(steps) < window:
        raise RunSourceError(f"runs {run_a.name} and {run_b.name} share {len(steps)} steps; a window needs {window}")
    slice_keys = [f"slices/{label}/{key}" for label in _common_slices(run_a, run_b) for key in SLICE_KEYS]
    verdicts, slices, series = [], [], {}
    with Progress(f"compare {run_a.name} {run_b.name}", total=len(COMPARED_KEYS) + len(slice_keys)) as progress:
        for key in (*COMPARED_KEYS, *slice_keys):
            a = np.array([_value(by_a[s], key) for s in steps])
            b = np.array([_value(by_b[s], key) for s in steps])
            progress.advance()
            if not (np.isfinite(a).any() and np.isfinite(b).any()):
                continue  # a statistic neither run (or only one) has
            scale = np.array([max(_scale(by_a[s], key), _scale(by_b[s], key)) for s in steps])
            b_seen = within_rounding(a, b, scale)
            z = rolling_rank_z(a, b_seen, window)
            first, reason = _first_divergence(key, a, b_seen, z, window, z_threshold, persistence)
            with np.errstate(all="ignore"):
                max_z = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else math.nan
            verdict = StatisticVerdict(key, first is not None, None if first is None else int(steps[first]),
                                       max_z, _mean(a), _mean(b), reason)
            (slices if key.startswith("slices/") else verdicts).append(verdict)
            series[key] = (steps, a, b)
    return Comparison(run_a, run_b, steps, verdicts, window, z_threshold, persistence, series, slices)


def _first_divergence(key: str, a: np.ndarray, b: np.ndarray, z: np.ndarray, window: int, z_threshold: float,
                      persistence: int) -> tuple[int | None, str | None]:
    """The index of a statistic's first divergence and why: the earliest of

    * ``non_finite``: a NaN/Inf count that is positive in one run and 0 in the other, at the first step;
    * ``magnitude``: a value more than 10x the other run's largest |value| over all common steps, at its
      step (ranks make one such value count as one value; a person sees 7,428 beside 6);
    * ``rank``: the rank test's persistent ``|z|``; when that holds from the first full window the runs
      differ from the start, reported at the first common step (``from_start``), not ``window`` steps late.
    """
    found: list[tuple[int, str]] = []
    if key.endswith(("nan_count", "inf_count")):
        present_a, present_b = a > 0, b > 0  # a NaN count (not recorded) is neither
        known = np.isfinite(a) & np.isfinite(b)
        differ = np.flatnonzero(known & (present_a != present_b))
        if differ.size:
            found.append((int(differ[0]), "non_finite"))
    for this, other in ((a, b), (b, a)):
        largest = np.nanmax(np.abs(other)) if np.isfinite(other).any() else math.nan
        if largest > 0:  # against a run that is 0 throughout, "10x" says nothing
            with np.errstate(invalid="ignore"):
                beyond = np.flatnonzero(np.abs(this) > 10 * largest)
            if beyond.size:
                found.append((int(beyond[0]), "magnitude"))
    ranked = _first_persistent(np.abs(z) >= z_threshold, persistence)
    if ranked is not None:
        found.append((0, "from_start") if ranked == window - 1 else (ranked, "rank"))
    return min(found) if found else (None, None)


def within_rounding(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``b`` with each value that differs from ``a``'s at its step by no more than the statistic's own rounding
    (:data:`ROUNDING` times ``scale``, the largest |value| behind it, or the values themselves) replaced by ``a``'s.

    Example:
        >>> within_rounding(np.array([0.0, 0.0, 1.0]), np.array([1.6e-17, 1e-9, 1.0 + 2e-16]), np.ones(3))
        array([0.e+00, 1.e-09, 1.e+00])
    """
    with np.errstate(invalid="ignore"):
        bound = ROUNDING * np.fmax(np.fmax(np.abs(scale), np.abs(a)), np.abs(b))
        same = np.abs(a - b) <= bound
    return np.where(same, a, b)


def _scale(record: Any, key: str) -> float:
    """The largest |value| behind a statistic at one record (what its rounding is relative to); ``nan`` if unknown.

    Example:
        >>> from advmon.record import Record
        >>> record = Record("r", 0, 0.0, "e", None, {"advantages/pre_norm/min": -3.0, "advantages/pre_norm/max": 2.0})
        >>> _scale(record, "advantages/pre_norm/mean"), _scale(record, "groups/zero_std_fraction")
        (3.0, 1.0)
    """
    metrics = record.metrics
    parts = key.split("/")
    prefix = "/".join(parts[:2]) + "/" if parts[0] == "slices" else ""
    rest = parts[2:] if prefix else parts
    if rest[0] == "advantages" and len(rest) > 1:
        found = _value(record, f"{prefix}advantages/{rest[1]}/abs_max")
        return found if math.isfinite(found) else abs_max(metrics, rest[1])
    if rest[0] == "rewards":
        ends = [abs(_value(record, f"rewards/{end}")) for end in ("min", "max")]  # a slice's are within the run's
        finite = [end for end in ends if math.isfinite(end)]
        return max(finite) if finite else math.nan
    return 1.0 if rest[-1].endswith("fraction") else math.nan


def _value(record: Any, key: str) -> float:
    value = record.metrics.get(key)
    return math.nan if value is None else float(value)


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def _first_persistent(flags: np.ndarray, persistence: int) -> int | None:
    """Index of the first of ``persistence`` consecutive True values."""
    run = 0
    for index, flag in enumerate(flags):
        run = run + 1 if flag else 0
        if run >= persistence:
            return index - persistence + 1
    return None


def write_comparison_html(comparison: Comparison, out: Path) -> Path:
    """The verdict, a table per statistic and overlay plots of every compared statistic (first divergence marked);
    one self-contained HTML page. A statistic constant and equal in both runs (no Inf anywhere) is named, not drawn."""
    import html

    from advmon.reports.html_page import PAGE_STYLE, format_number, write_page

    a, b = comparison.run_a, comparison.run_b
    diverged, same = comparison.diverged_in_order(), [s for s in comparison.statistics if not s.diverged]
    sliced = sorted((s for s in comparison.slices if s.diverged), key=lambda s: (s.first_step, -s.max_abs_z))
    figures, flat = [], {}
    for verdict in diverged + sliced + same:
        steps, va, vb = comparison.series[verdict.key]
        value = _same_constant(va, vb)
        if value is not None and not verdict.diverged:
            flat.setdefault(value, []).append(verdict.key)
            continue
        figures.append(f"<figure class='plot'>{_overlay_svg(verdict, steps, va, vb, a.name, b.name)}</figure>")
    not_drawn = "".join(
        f"<p class='meta'>Not drawn: {', '.join(f'<code>{html.escape(k)}</code>' for k in keys)}: "
        f"{format_number(value)} in both runs at every step.</p>\n" for value, keys in flat.items())
    body = (
        f"<h1>advmon compare: {html.escape(a.name)} vs {html.escape(b.name)}</h1>\n"
        f"<p class='meta'>A: {html.escape(a.name)} (<code>{html.escape(a.source)}</code>), B: {html.escape(b.name)} "
        f"(<code>{html.escape(b.source)}</code>); {len(comparison.steps)} common steps ({int(comparison.steps[0])}"
        f"&ndash;{int(comparison.steps[-1])}); rank test over windows of {comparison.window} steps, "
        f"|z| &ge; {comparison.z_threshold:g} for {comparison.persistence} steps (docs/compare.md).</p>\n"
        f"{_verdict_html(comparison)}\n<h2>Statistics</h2>\n{_verdict_table(diverged + same)}\n"
        f"{_slices_html(comparison)}"
        f"<h2>Over steps</h2>\n{not_drawn}<div class='plots'>{''.join(figures)}</div>\n"
    )
    return write_page(out, f"advmon compare: {a.name} vs {b.name}", PAGE_STYLE, body)


def _same_constant(a: np.ndarray, b: np.ndarray) -> float | None:
    """The value both series hold at every step, if they do (a flat line drawn twice says less than a sentence)."""
    values = np.concatenate([a, b])
    if not np.isfinite(values).all() or values.min() != values.max():
        return None
    return float(values[0])


def _overlay_svg(verdict: StatisticVerdict, steps: np.ndarray, va: np.ndarray, vb: np.ndarray, a: str, b: str) -> str:
    import matplotlib.pyplot as plt

    from advmon.reports.plots import choose_scale, figure_to_svg, new_figure, place_legend

    figure, axes = new_figure()
    axes.plot(steps, va, linewidth=2.4, color="#1f77b4", alpha=0.8, label=f"A: {a}")  # wider: seen under an equal B
    axes.plot(steps, vb, linewidth=1.1, color="#ff7f0e", label=f"B: {b}")
    if verdict.first_step is not None:
        axes.axvline(verdict.first_step, color="black", linestyle="--", linewidth=1,
                     label=f"first divergence (step {verdict.first_step})")
    if verdict.diverged:
        state = f"diverged from step {verdict.first_step}: {REASONS[verdict.reason] if verdict.reason else 'rank test'}"
    else:
        state = "same"
    axes.set_title(f"{verdict.key}\n{state}; largest |z| {_fmt(verdict.max_abs_z)}", fontsize=10, loc="left")
    axes.set_xlabel("step", fontsize=8)
    axes.tick_params(labelsize=8)
    choose_scale(axes, np.concatenate([va, vb]), percent=verdict.key.endswith("_fraction"))
    place_legend(axes)
    svg = figure_to_svg(figure)
    plt.close(figure)
    return svg


def _verdict_html(comparison: Comparison) -> str:
    import html

    if not comparison.diverged:
        strongest = max(comparison.statistics, key=lambda s: s.max_abs_z if math.isfinite(s.max_abs_z) else -1,
                        default=None)
        detail = f" (largest |z| {_fmt(strongest.max_abs_z)}, on {html.escape(strongest.key)})" if strongest else ""
        return f"<p class='ok'>Equivalent: no statistic diverged beyond the runs' own noise{detail}.</p>"
    first = [s.key for s in comparison.diverged_in_order() if s.first_step == comparison.first_divergence]
    if not first:
        return "<p class='bad'>Diverged in a slice only; the run-wide statistics stayed within their noise.</p>"
    return (f"<p class='bad'>Diverged: first divergence at step {comparison.first_divergence} "
            f"({', '.join(html.escape(k) for k in first)}).</p>")


def _verdict_table(verdicts: list[StatisticVerdict]) -> str:
    from advmon.reports.html_page import format_number

    lines = ["<table><tr><th>statistic</th><th>verdict</th><th>first step</th><th>why</th><th>largest |z|</th>"
             "<th>mean A</th><th>mean B</th></tr>"]
    for s in verdicts:
        verdict = "<td class='bad'>diverged</td>" if s.diverged else "<td>same</td>"
        first = "-" if s.first_step is None else str(s.first_step)
        lines.append(f"<tr><td><code>{s.key}</code></td>{verdict}<td class='num'>{first}</td>"
                     f"<td>{REASONS[s.reason] if s.reason else ''}</td><td class='num'>{_fmt(s.max_abs_z)}</td>"
                     f"<td class='num'>{format_number(s.mean_a)}</td>"
                     f"<td class='num'>{format_number(s.mean_b)}</td></tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _slices_html(comparison: Comparison) -> str:
    import html

    if not comparison.slices:
        return ""
    found = comparison.first_slice
    if found is None:
        labels = ", ".join(html.escape(label) for label in sorted({slice_of(s.key) for s in comparison.slices}))
        return f"<h2>Slices</h2>\n<p class='ok'>No slice diverged ({labels}).</p>\n"
    label, step, _ = found
    diverged = sorted((s for s in comparison.slices if s.diverged), key=lambda s: (s.first_step, -s.max_abs_z))
    return (f"<h2>Slices</h2>\n<p class='bad'>{html.escape(label)} diverges first, at step {step}.</p>\n"
            f"{_verdict_table(diverged)}\n")
