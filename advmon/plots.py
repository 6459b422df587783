"""Matplotlib figures of recorded runs, for ``advmon report`` and ``advmon compare``.

Plots are drawn over steps; a long run is reduced to at most ``MAX_POINTS``
buckets per line (the mean of a bucket for means, its min/max for extremes), so a
100k-step run draws as fast and as small as a short one. Alerts are marked as
shaded spans (critical red, warning orange, info blue).

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_POINTS", "PANELS", "Distribution", "Panel", "distribution", "draw_distribution", "draw_panel",
           "figure_to_svg", "series", "where_panels"]

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


@dataclass(frozen=True)
class Panel:
    """One plot: lines, an optional band (``mean ± std`` or ``p10..p90``), a y label."""

    title: str
    lines: Sequence[Line]
    band: tuple[str, str] | None = None  # (center key, std key) -> mean ± std
    band_keys: tuple[str, str] | None = None  # (low key, high key)
    ylabel: str = ""
    percent: bool = False


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
                      Line(f"slices/{label}/rewards/function_nonfinite_count", f"{label} (reward functions)", "max", "--")
                      for label in slices]),
            Panel("By slice: largest |post-norm advantage|", per_slice("advantages/post_norm/abs_max", "max")),
        ]
    if functions:
        panels += [
            Panel("By reward function: mean", [Line(f"rewards/{name}/mean", name) for name in functions]),
            Panel("By reward function: NaN/Inf scores per step",
                  [Line(f"rewards/{name}/nan_count", f"{name} NaN", "max") for name in functions]
                  + [Line(f"rewards/{name}/inf_count", f"{name} Inf", "max", "--") for name in functions]),
        ]
    return panels


def draw_panel(axes: Any, panel: Panel, runs: Sequence[tuple[str, Sequence[Any]]],
               spans: Sequence[tuple[int, int | None, str]] = (), marker: int | None = None) -> bool:
    """Draw ``panel`` for one run or several (``[(label, records)]``); return whether anything had data."""
    drawn = False
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for index, (label, records) in enumerate(runs):
        prefix = f"{label} " if len(runs) > 1 else ""
        for line_index, line in enumerate(panel.lines):
            steps, values = series(records, line.key, line.reduce)
            if not np.isfinite(values).any():
                continue
            color = colors[index % len(colors)] if len(runs) > 1 else f"C{line_index}"
            axes.plot(steps, values, line.style, color=color, linewidth=1.1, label=prefix + line.label)
            drawn = True
        band = _band(records, panel)
        if band is not None:
            steps, low, high = band
            color = colors[index % len(colors)] if len(runs) > 1 else "C0"
            axes.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
    _shade_alerts(axes, spans, max((r.step for _, records in runs for r in records), default=0))
    if marker is not None:
        axes.axvline(marker, color="black", linestyle="--", linewidth=1)
    axes.set_title(panel.title, fontsize=10, loc="left")
    axes.set_xlabel("step", fontsize=8)
    axes.tick_params(labelsize=8)
    if drawn:
        _scale(axes)
        axes.legend(fontsize=7, loc="best", ncol=2, framealpha=0.7)
        if panel.percent:
            from matplotlib.ticker import PercentFormatter

            axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    else:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes, color="grey")
    return drawn


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


def _scale(axes: Any) -> None:
    """Symmetric-log y when a few values dwarf the rest (|A| in the thousands next to unit-scale data)."""
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=np.float64) for line in axes.get_lines()])
    finite = np.abs(values[np.isfinite(values)])
    if finite.size and finite.max() > 100 * max(np.percentile(finite, 90), 1e-12):
        axes.set_yscale("symlog", linthresh=max(np.percentile(finite, 90), finite.max() * 1e-3))


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
        >>> from advmon.histograms import Histogram
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
    return np.diff(np.interp(edges, bin_edges, cumulative))


def draw_distribution(axes: Any, records: Sequence[Any], bounds: tuple[np.ndarray, np.ndarray] | None = None,
                      stage: str = "post_norm", spans: Sequence[tuple[int, int | None, str]] = ()) -> bool:
    """A heatmap of ``stage``'s distribution per step (log colour: a handful of outliers still shows),
    with ``bounds`` (steps, |A| bound per step) drawn at plus and minus; return whether there was data."""
    from matplotlib.colors import LogNorm

    found = distribution(records, stage)
    axes.set_title(f"{stage.replace('_', '-').capitalize()} advantages: distribution per step", fontsize=10, loc="left")
    axes.set_xlabel("step", fontsize=8)
    axes.tick_params(labelsize=8)
    if found is None:
        axes.text(0.5, 0.5, "no histograms", ha="center", va="center", transform=axes.transAxes, color="grey")
        return False
    share = np.where(found.share > 0, found.share, np.nan)  # empty cells stay blank
    smallest = np.nanmin(share) if np.isfinite(share).any() else 1e-6
    mesh = axes.pcolormesh(found.step_edges, found.value_edges, share.T, cmap="viridis", shading="flat",
                           norm=LogNorm(vmin=min(smallest, 1e-3), vmax=1.0), rasterized=True)
    colorbar = axes.figure.colorbar(mesh, ax=axes, pad=0.01)
    colorbar.set_label("share of the step's values", fontsize=7)
    colorbar.ax.tick_params(labelsize=7)
    if found.linthresh is not None:
        axes.set_yscale("symlog", linthresh=found.linthresh)
    axes.set_ylim(found.value_edges[0], found.value_edges[-1])
    if bounds is not None:
        steps, bound = bounds
        for sign in (1, -1):
            axes.step(steps, sign * bound, where="mid", color="#d62728", linestyle="--", linewidth=1,
                      label="|A| bound" if sign == 1 else None)
        axes.legend(fontsize=7, loc="upper left", framealpha=0.7)
    _shade_alerts(axes, spans, found.step_edges[-1])
    return True


def _shade_alerts(axes: Any, spans: Sequence[tuple[int, int | None, str]], last_step: float) -> None:
    """Where an alert was firing (to ``last_step`` while it still is), in its severity's colour."""
    for fired, resolved, severity in spans:
        axes.axvspan(fired, resolved if resolved is not None else last_step, color=SEVERITY_COLORS.get(severity, "grey"),
                     alpha=0.12, linewidth=0)


def figure_to_svg(figure: Any) -> str:
    """The figure as inline SVG text (no XML header), for a self-contained HTML page."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]
