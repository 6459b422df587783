"""Matplotlib figures of recorded runs, for ``advmon report`` and ``advmon compare``.

Plots are drawn over steps; a long run is reduced to at most ``MAX_POINTS``
buckets per line (the mean of a bucket for means, its min/max for extremes), so a
100k-step run draws as fast and as small as a short one. Alerts are marked as
shaded spans (critical red, warning orange, info blue). Every line, band and span
has a legend entry, below the plot so that it never covers data; values that span
orders of magnitude get a symmetric-log axis whose ticks (0 and powers of ten) never
overlap.

Example:
    >>> from advmon.record import Record
    >>> records = [Record("r", s, 0.0, "e", None, {"rewards/mean": s / 10}) for s in range(5)]
    >>> steps, values = series(records, "rewards/mean")
    >>> steps.tolist(), values.tolist()
    ([0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 0.1, 0.2, 0.3, 0.4])
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_POINTS", "PANELS", "Distribution", "Panel", "choose_scale", "distribution", "draw_distribution",
           "draw_panel", "figure_to_svg", "new_figure", "place_legend", "series", "tick_text", "use_symlog",
           "where_panels"]

MAX_POINTS = 2000
SEVERITY_COLORS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}


def series(records: Sequence[Any], key: str, reduce: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of ``key`` (``nan`` where missing), reduced to at most ``MAX_POINTS`` buckets."""
    steps = np.fromiter((r.step for r in records), dtype=np.float64, count=len(records))
    values = np.fromiter((_number(r.metrics.get(key)) for r in records), dtype=np.float64, count=len(records))
    if len(steps) <= MAX_POINTS:
        return steps, values
    starts = np.linspace(0, len(steps), MAX_POINTS + 1).astype(np.int64)[:-1]
    sizes = np.diff(np.append(starts, len(steps)))
    bucket_steps = np.add.reduceat(steps, starts) / sizes
    finite = np.isfinite(values)
    if reduce == "mean":
        totals = np.add.reduceat(np.where(finite, values, 0.0), starts)
        counts = np.add.reduceat(finite.astype(np.float64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            return bucket_steps, np.where(counts > 0, totals / counts, np.nan)
    pick = np.fmin if reduce == "min" else np.fmax  # fmin/fmax skip NaN
    return bucket_steps, pick.reduceat(np.where(finite, values, np.nan), starts)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


@dataclass(frozen=True)
class Line:
    key: str
    label: str
    reduce: str = "mean"
    style: str = "-"
    color: int | None = None  #: matplotlib's ``C<n>`` colour; default: the line's position in its panel


@dataclass(frozen=True)
class Panel:
    """One plot: lines, an optional band (``mean ± std`` or ``p10..p90``), a y label."""

    title: str
    lines: Sequence[Line]
    band: tuple[str, str] | None = None  # (center key, std key) -> mean ± std
    band_keys: tuple[str, str] | None = None  # (low key, high key)
    ylabel: str = ""
    percent: bool = False

    @property
    def band_label(self) -> str:
        """What the shaded band is, for the legend."""
        if self.band is not None:
            return "mean ± std"
        if self.band_keys is not None:
            return "–".join(key.rsplit("/", 1)[-1].replace("p0", "p") for key in self.band_keys)
        return ""


PANELS: tuple[Panel, ...] = (
    Panel("Post-norm advantages: mean ± std, min, max",
          [Line("advantages/post_norm/mean", "mean"), Line("advantages/post_norm/min", "min", "min", ":"),
           Line("advantages/post_norm/max", "max", "max", ":")],
          band=("advantages/post_norm/mean", "advantages/post_norm/std")),
    Panel("Post-norm advantages: percentiles",
          [Line("advantages/post_norm/p01", "p1", style=":"), Line("advantages/post_norm/p50", "p50"),
           Line("advantages/post_norm/p99", "p99", style=":")],
          band_keys=("advantages/post_norm/p10", "advantages/post_norm/p90")),
    Panel("Pre-norm advantages: mean ± std, min, max",
          [Line("advantages/pre_norm/mean", "mean"), Line("advantages/pre_norm/min", "min", "min", ":"),
           Line("advantages/pre_norm/max", "max", "max", ":")],
          band=("advantages/pre_norm/mean", "advantages/pre_norm/std")),
    Panel("Groups: zero-std, all-fail, all-pass",
          [Line("groups/zero_std_fraction", "zero-std"), Line("groups/all_low_fraction", "all fail", style="--"),
           Line("groups/all_high_fraction", "all pass", style="--")],
          percent=True),
    Panel("Rewards: mean ± std, min, max",
          [Line("rewards/mean", "mean"), Line("rewards/min", "min", "min", ":"), Line("rewards/max", "max", "max", ":")],
          band=("rewards/mean", "rewards/std")),
    Panel("Non-finite values per step",
          [Line("rewards/nan_count", "reward NaN", "max"), Line("rewards/inf_count", "reward Inf", "max"),
           Line("advantages/post_norm/nan_count", "post-norm NaN", "max"),
           Line("advantages/post_norm/inf_count", "post-norm Inf", "max")]),
)


def labels_in(records: Sequence[Any], family: str, key: str) -> list[str]:
    """The ``<label>``s of ``<family>/<label>/<key>`` keys over the records, in order of appearance.

    Example:
        >>> class R:
        ...     metrics = {"slices/gsm8k/rewards/count": 8.0, "rewards/count": 16.0, "rewards/format/count": 16.0}
        >>> labels_in([R()], "slices", "rewards/count"), labels_in([R()], "rewards", "count")
        (['gsm8k'], ['format'])
    """
    suffix = "/" + key
    found: dict[str, None] = {}
    for record in records:
        for name in record.metrics:
            if name.startswith(family + "/") and name.endswith(suffix):
                label = name[len(family) + 1 : -len(suffix)]
                if label and "/" not in label:
                    found.setdefault(label)
    return list(found)


def where_panels(records: Sequence[Any]) -> list[Panel]:
    """The drill-down's plots over steps: one line per slice, one per reward function (none without them)."""
    slices = labels_in(records, "slices", "rewards/count")
    functions = labels_in(records, "rewards", "count")
    panels = []
    if slices:
        def per_slice(key: str, reduce: str = "mean") -> list[Line]:
            return [Line(f"slices/{label}/{key}", label, reduce) for label in slices]

        panels += [
            Panel("By slice: reward mean", per_slice("rewards/mean")),
            Panel("By slice: zero-std groups", per_slice("groups/zero_std_fraction"), percent=True),
            Panel("By slice: NaN/Inf rewards per step",
                  per_slice("rewards/nan_count", "max") + [
                      Line(f"slices/{label}/rewards/function_nonfinite_count", f"{label} (reward functions)", "max",
                           "--", index) for index, label in enumerate(slices)]),
            Panel("By slice: largest |post-norm advantage|", per_slice("advantages/post_norm/abs_max", "max")),
        ]
    if functions:
        panels += [
            Panel("By reward function: mean", [Line(f"rewards/{name}/mean", name) for name in functions]),
            Panel("By reward function: NaN/Inf scores per step",
                  [Line(f"rewards/{name}/nan_count", f"{name} NaN", "max", "-", index)
                   for index, name in enumerate(functions)]
                  + [Line(f"rewards/{name}/inf_count", f"{name} Inf", "max", "--", index)
                     for index, name in enumerate(functions)]),
        ]
    return panels


def draw_panel(axes: Any, panel: Panel, runs: Sequence[tuple[str, Sequence[Any]]],
               spans: Sequence[tuple[int, int | None, str]] = (), marker: int | None = None) -> bool:
    """Draw ``panel`` for one run or several (``[(label, records)]``); return whether anything had data."""
    drawn = False
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    drawn_values = []  # the lines' (a band lies between lines: it does not decide the scale)
    for index, (label, records) in enumerate(runs):
        prefix = f"{label} " if len(runs) > 1 else ""
        for line_index, line in enumerate(panel.lines):
            steps, values = series(records, line.key, line.reduce)
            if not np.isfinite(values).any():
                continue
            color = colors[index % len(colors)] if len(runs) > 1 else f"C{_color_of(line, line_index)}"
            axes.plot(steps, values, line.style, color=color, linewidth=1.1, label=prefix + line.label)
            drawn_values.append(values)
            drawn = True
        band = _band(records, panel)
        if band is not None:
            steps, low, high = band
            color = colors[index % len(colors)] if len(runs) > 1 else "C0"
            axes.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0, label=prefix + panel.band_label)
    steps = [r.step for _, records in runs for r in records]
    if drawn:
        _shade_alerts(axes, spans, max(steps, default=0), first_step=min(steps, default=0))
    elif steps:
        axes.set_xlim(min(steps), max(steps) if max(steps) > min(steps) else min(steps) + 1)  # the run's steps
    if marker is not None:
        axes.axvline(marker, color="black", linestyle="--", linewidth=1, label=f"step {marker}")
    axes.set_title(panel.title, fontsize=10, loc="left")
    _step_axis(axes)
    axes.tick_params(labelsize=8)
    if drawn:
        choose_scale(axes, np.concatenate(drawn_values), percent=panel.percent)
        place_legend(axes)
    else:
        axes.text(0.5, 0.5, f"no data: this run recorded no {_family(panel)}", ha="center", va="center",
                  transform=axes.transAxes, color="#555", fontsize=9)
        axes.set_yticks([])
    return drawn


def _color_of(line: Line, position: int) -> int:
    return position if line.color is None else line.color


def _family(panel: Panel) -> str:
    """What a panel's keys have in common, as a person reads it: ``advantages/pre_norm/*``."""
    keys = [line.key for line in panel.lines]
    common = os.path.commonprefix(keys)
    common = common[: common.rfind("/") + 1]
    return f"{common}*" if common else ", ".join(keys)


def _band(records: Sequence[Any], panel: Panel) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    if panel.band is not None:
        steps, center = series(records, panel.band[0])
        _, spread = series(records, panel.band[1])
        low, high = center - spread, center + spread
    elif panel.band_keys is not None:
        steps, low = series(records, panel.band_keys[0])
        _, high = series(records, panel.band_keys[1])
    else:
        return None
    if not (np.isfinite(low).any() and np.isfinite(high).any()):
        return None
    return steps, low, high


def place_legend(axes: Any) -> None:
    """The legend under the plot (below the step axis), so that it never covers a line."""
    handles, labels = axes.get_legend_handles_labels()
    if not handles:
        return
    axes.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=_columns(axes, labels),
                frameon=False, borderaxespad=4.2, handlelength=2.2, columnspacing=1.5)


def _columns(axes: Any, labels: Sequence[str], fontsize: float = 7.0) -> int:
    """As many legend columns (up to 4) as fit under the plot: a wider legend would widen the figure and shrink
    the plot beside the others on the page. Widths are estimated (a character is about 0.6 em)."""
    width_em = axes.get_position().width * axes.figure.get_figwidth() * 72.0 / fontsize
    for columns in range(min(4, len(labels)), 1, -1):
        rows = math.ceil(len(labels) / columns)
        widest = [max(len(label) for label in labels[c * rows : (c + 1) * rows] or [""]) for c in range(columns)]
        if sum(0.6 * w + 2.2 + 0.8 + 1.5 for w in widest) <= width_em:
            return columns
    return 1


#: Below this, a value is floating-point noise around 0 (the mean of normalized advantages, 1e-20).
FLOAT_NOISE = 1e-12


def choose_scale(axes: Any, values: np.ndarray, percent: bool = False) -> None:
    """The y axis a person can read ``values`` on.

    Symmetric-log when a few values dwarf the bulk (an |A| of 7,428 beside unit-scale
    data: over 100 times the median of the non-zero |values|, or of 1 for counts), linear
    up to the power of ten nearest the bulk; whole-number ticks for counts (a count of 0
    throughout reads 0, not -0.04); a unit axis around 0 for values that are 0 up to float
    noise (not 1e-19 magnified to fill the plot); whole percentages for shares that span
    10% or more.
    """
    finite = np.abs(values[np.isfinite(values)])
    if not finite.size:
        return
    if percent:
        from matplotlib.ticker import PercentFormatter

        spread = float(np.nanmax(values) - np.nanmin(values))
        axes.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0 if spread >= 0.1 else None))
        return
    counts = bool(np.all(finite == np.round(finite)))
    if not counts and finite.max() < FLOAT_NOISE:
        axes.set_ylim(-1.0, 1.0)
        return
    bulk = 1.0 if counts else float(np.median(finite[finite > 0]))
    if finite.max() > 100 * bulk:
        use_symlog(axes, 10.0 ** round(math.log10(bulk)))
    elif counts:
        from matplotlib.ticker import MaxNLocator

        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        if finite.max() == 0:
            axes.set_ylim(-0.1, 1.0)


def use_symlog(axes: Any, linthresh: float, labelsize: float = 8.0) -> None:
    """A symmetric-log y axis with ticks at 0 and powers of ten only, thinned where two labels would touch."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    axes.set_yscale("symlog", linthresh=linthresh)
    axes.autoscale(axis="y")  # margins on the new scale (limits fixed earlier, by axvspan, have the linear ones)
    target = axes.yaxis
    target.set_major_locator(_symlog_locator(linthresh, labelsize))
    target.set_major_formatter(FuncFormatter(lambda value, _: tick_text(value)))
    target.set_minor_locator(NullLocator())


def tick_text(value: float) -> str:
    """A tick label as a person writes it: ``0``, ``0.5``, ``-1,000``, ``10⁶`` (as TeX), never ``10^0``.

    Example:
        >>> [tick_text(v) for v in (0.0, 0.01, -1.0, 1000.0, -1e6, 2.5e-5)]
        ['0', '0.01', '-1', '1,000', '$-10^{6}$', '2.5e-05']
    """
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e5:
        return f"{value:,.6g}"
    exponent = round(math.log10(magnitude))
    if math.isclose(magnitude, 10.0 ** exponent):
        return f"${'-' if value < 0 else ''}10^{{{exponent}}}$"
    return f"{value:.2g}"


def _symlog_locator(linthresh: float, labelsize: float) -> Any:
    """Major ticks of a symmetric-log axis: 0, then +-10^k from the largest down; a tick whose label would touch a
    kept one (closer than 1.5 label heights, measured at the axes' drawn size when it is drawn) is left out."""
    from matplotlib.ticker import Locator

    class SymlogTicks(Locator):
        def __call__(self) -> list[float]:
            low, high = self.axis.get_view_interval()
            return self.tick_values(low, high)

        def tick_values(self, vmin: float, vmax: float) -> list[float]:
            low, high = min(vmin, vmax), max(vmin, vmax)
            largest = max(abs(low), abs(high), linthresh)
            candidates = [0.0] if low <= 0 <= high else []
            for exponent in range(math.ceil(math.log10(largest)), math.floor(math.log10(linthresh)) - 1, -1):
                candidates += [v for v in (10.0 ** exponent, -(10.0 ** exponent)) if low <= v <= high]
            return sorted(self._thinned(candidates))

        def _thinned(self, candidates: list[float]) -> list[float]:
            axis = getattr(self, "axis", None)
            if axis is None or axis.axes is None or not candidates:
                return candidates
            axes = axis.axes  # a y axis: where each value lands on screen, in pixels
            positions = axes.transData.transform([(axes.get_xlim()[0], v) for v in candidates])[:, 1]
            gap = 1.5 * labelsize * axes.figure.dpi / 72.0
            kept: list[tuple[float, float]] = []
            for value, position in zip(candidates, positions):
                if all(abs(position - other) >= gap for _, other in kept):
                    kept.append((value, position))
            return [value for value, _ in kept]

    return SymlogTicks()


#: Columns (groups of steps) and value rows of a distribution picture.
DISTRIBUTION_COLUMNS = 400
DISTRIBUTION_ROWS = 160


@dataclass(frozen=True)
class Distribution:
    """A stage's histograms over steps on one grid: ``share[i, j]`` of column ``i``'s values lie in row ``j``."""

    step_edges: np.ndarray  #: ``columns + 1`` edges on the step axis
    value_edges: np.ndarray  #: ``rows + 1`` edges on the value axis
    share: np.ndarray  #: ``[columns, rows]``, each column summing to 1 (``nan`` where a column has no histogram)
    linthresh: float | None  #: the symmetric-log scale's linear range, or ``None`` for a linear axis


def distribution(records: Sequence[Any], stage: str = "post_norm", columns: int = DISTRIBUTION_COLUMNS,
                 rows: int = DISTRIBUTION_ROWS) -> Distribution | None:
    """The records' ``stage`` histograms resampled onto one grid (``None`` without any histogram).

    Each record's bins are spread over the grid's rows as if values were uniform
    inside a bin (the cumulative count, interpolated at the rows' edges): counts are
    kept, nothing is invented outside a bin. Consecutive records share a column when
    there are more than ``columns``. Values far beyond the bulk (|A| in the thousands
    beside unit-scale data, the outliers the picture is for) get a symmetric-log axis
    whose linear range holds the typical step's p01..p99.

    Example:
        >>> from advmon.record import Histogram
        >>> from advmon.record import Record
        >>> histogram = Histogram((-1.0, -0.5, 0.0, 0.5, 1.0), (1.0, 0.0, 0.0, 3.0))
        >>> records = [Record("r", s, 0.0, "e", None, {}, histograms={"post_norm": histogram}) for s in range(3)]
        >>> d = distribution(records, rows=4)
        >>> d.value_edges.tolist(), d.share[0].tolist(), d.linthresh
        ([-1.0, -0.5, 0.0, 0.5, 1.0], [0.25, 0.0, 0.0, 0.75], None)
    """
    found = sorted(((r.step, r.histograms[stage], r.metrics) for r in records if stage in getattr(r, "histograms", {})),
                   key=lambda item: item[0])
    if not found:
        return None
    low = min(h.edges[0] for _, h, _ in found)
    high = max(h.edges[-1] for _, h, _ in found)
    linthresh = _linear_range(found, stage, max(abs(low), abs(high)))
    value_edges = _value_edges(low, high, rows, linthresh)
    per_record = np.array([_resampled(h, value_edges) for _, h, _ in found])
    steps = np.array([step for step, _, _ in found], dtype=np.float64)
    starts = np.linspace(0, len(found), min(columns, len(found)) + 1).astype(np.int64)
    counts = np.add.reduceat(per_record, starts[:-1], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = counts / counts.sum(axis=1, keepdims=True)
    half = np.diff(steps).min() / 2 if len(steps) > 1 else 0.5
    step_edges = np.append(steps[starts[:-1]] - half, steps[-1] + half)
    return Distribution(step_edges, value_edges, share, linthresh)


def _linear_range(found: Sequence[tuple[int, Any, Any]], stage: str, extreme: float) -> float | None:
    """The typical step's largest |p01|, |p99|, when the extremes are over 20 times it (else ``None``)."""
    typical = [max(abs(_number(m.get(f"advantages/{stage}/p01"))), abs(_number(m.get(f"advantages/{stage}/p99"))))
               for _, _, m in found]
    typical = [t for t in typical if math.isfinite(t) and t > 0]
    if not typical:
        return None
    scale = float(np.median(typical))
    return scale if extreme > 20 * scale else None


def _value_edges(low: float, high: float, rows: int, linthresh: float | None) -> np.ndarray:
    if linthresh is None:
        return np.linspace(low, high, rows + 1)
    from matplotlib.scale import SymmetricalLogTransform

    transform = SymmetricalLogTransform(10, linthresh, 1.0)
    ends = transform.transform(np.array([low, high]))
    return transform.inverted().transform(np.linspace(ends[0], ends[1], rows + 1))


def _resampled(histogram: Any, edges: np.ndarray) -> np.ndarray:
    """The histogram's counts per row of ``edges`` (uniform inside each bin)."""
    bin_edges = np.array(histogram.edges)
    cumulative = np.concatenate([[0.0], np.cumsum(histogram.counts)])
    counts = np.diff(np.interp(edges, bin_edges, cumulative))
    # A row edge an ulp inside a bin (bins end on round values like 0.75, rows on a linspace) splits off a
    # 1e-16 share that would stretch the colour scale to it: shares of a billionth of a value are rounding.
    counts[np.abs(counts) < 1e-9] = 0.0
    return counts


def draw_distribution(axes: Any, records: Sequence[Any], bounds: tuple[np.ndarray, np.ndarray] | None = None,
                      stage: str = "post_norm", spans: Sequence[tuple[int, int | None, str]] = ()) -> bool:
    """A heatmap of ``stage``'s distribution per step (log colour: a handful of outliers still shows),
    with ``bounds`` (steps, |A| bound per step) drawn at plus and minus; return whether there was data."""
    from matplotlib.colors import LogNorm

    found = distribution(records, stage)
    axes.set_title(f"{stage.replace('_', '-').capitalize()} advantages: distribution per step", fontsize=10, loc="left")
    _step_axis(axes)
    axes.tick_params(labelsize=8)
    if found is None:
        axes.text(0.5, 0.5, "no data: this run's records carry no histograms (docs/distributions.md)", ha="center",
                  va="center", transform=axes.transAxes, color="#555", fontsize=9)
        return False
    share = np.where(found.share > 0, found.share, np.nan)  # empty cells stay blank
    smallest = np.nanmin(share) if np.isfinite(share).any() else 1e-6
    mesh = axes.pcolormesh(found.step_edges, found.value_edges, share.T, cmap="viridis", shading="flat",
                           norm=LogNorm(vmin=min(smallest, 1e-3), vmax=1.0), rasterized=True)
    colorbar = axes.figure.colorbar(mesh, ax=axes, pad=0.01)
    colorbar.set_label("share of the step's values", fontsize=7)
    colorbar.ax.tick_params(labelsize=7)
    if found.linthresh is not None:
        use_symlog(axes, found.linthresh)
    _limits_with_margin(axes, found.value_edges[0], found.value_edges[-1])
    if bounds is not None:
        _draw_bound(axes, *bounds)
    _shade_alerts(axes, spans, found.step_edges[-1], strip=True)  # a strip above: the picture's colours stay true
    axes.set_title(axes.get_title(loc="left"), fontsize=10, loc="left", pad=10)
    place_legend(axes)
    return True


def _draw_bound(axes: Any, steps: np.ndarray, bound: np.ndarray) -> None:
    """The |A| bound at plus and minus, one line through the steps that have one (steps without a bound drew it
    as isolated boxes); where it lies beyond the value axis, the legend says how far rather than losing it."""
    steps, bound = np.asarray(steps, dtype=float), np.asarray(bound, dtype=float)
    keep = np.isfinite(bound)
    if not keep.any():
        return
    steps, bound = steps[keep], bound[keep]
    top = axes.get_ylim()[1]
    label = "|A| bound"
    if bound.min() > top:
        label = f"|A| bound (above the axis: {tick_text(float(bound.min()))} and more)"
    from matplotlib import patheffects

    outline = [patheffects.withStroke(linewidth=2.6, foreground="white")]  # seen over the heatmap's own colours
    for sign in (1, -1):
        axes.step(steps, sign * bound, where="mid", color="#d62728", linestyle="--", linewidth=1.2,
                  path_effects=outline, label=label if sign == 1 else None)
    axes.set_ylim(*axes.get_ylim())  # the bound never widens the axis chosen for the values


def _limits_with_margin(axes: Any, low: float, high: float, margin: float = 0.03) -> None:
    """``low..high`` and a margin (on the axis' own scale), so that the extreme rows do not sit on the frame."""
    scale = axes.yaxis.get_transform()
    ends = scale.transform(np.array([low, high]))
    pad = margin * (ends[1] - ends[0])
    axes.set_ylim(*scale.inverted().transform(np.array([ends[0] - pad, ends[1] + pad])))


def _shade_alerts(axes: Any, spans: Sequence[tuple[int, int | None, str]], last_step: float,
                  strip: bool = False, first_step: float | None = None) -> None:
    """Where an alert was firing (to ``last_step`` while it still is), in its severity's colour, one legend entry
    per severity; overlapping spans of one severity are merged (they would darken each other). ``strip``: a band
    just above the plot, for pictures whose own colours a shading would change.

    A span over (nearly) the whole run (an alert firing from step 0 on) would shade every point alike and say
    nothing: it goes in the band above instead, with a line where it started."""
    merged: dict[str, list[list[float]]] = {}
    for fired, resolved, severity in sorted(spans, key=lambda span: span[0]):
        end = resolved if resolved is not None else last_step
        known = merged.setdefault(severity, [])
        if known and fired <= known[-1][1]:
            known[-1][1] = max(known[-1][1], end)
        else:
            known.append([fired, end])
    order = [severity for severity in ("info", "warning", "critical") if severity in merged]
    extent = last_step - (first_step if first_step is not None else last_step)
    for row, severity in enumerate(order + [s for s in merged if s not in order]):
        for number, (start, end) in enumerate(merged[severity]):
            label = None if number else f"{severity} alert firing"
            whole_run = not strip and extent > 0 and end - start >= 0.9 * extent
            if whole_run:
                axes.axvline(start, color=SEVERITY_COLORS.get(severity, "grey"), linewidth=1.2, alpha=0.9,
                             label=f"{severity} alert fired at step {start:g}")
                label = None
            if strip or whole_run:  # one row per severity, the most severe on top
                axes.axvspan(start, end, ymin=1.005 + 0.02 * row, ymax=1.022 + 0.02 * row, clip_on=False,
                             color=SEVERITY_COLORS.get(severity, "grey"), alpha=0.8, linewidth=0, label=label)
            else:
                axes.axvspan(start, end, color=SEVERITY_COLORS.get(severity, "grey"), alpha=0.12, linewidth=0,
                             label=label)


def _step_axis(axes: Any) -> None:
    """Label the x axis "step" with whole-number ticks only (a 2-step run had ticks at 0.25, 0.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    axes.set_xlabel("step", fontsize=8)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def new_figure(width: float = 7.5, height: float = 3.4) -> tuple[Any, Any]:
    """A figure with one axes, laid out inside its own size: every plot of a page gets the same size (a cropped
    figure would be as wide as its tick labels and title happen to be, and the page would scale each differently)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=100, layout="constrained")


def figure_to_svg(figure: Any) -> str:
    """The figure as inline SVG text (no XML header), for a self-contained HTML page."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]
