"""``advmon report``: one self-contained HTML page (or one PNG) about a recorded run.

The page opens offline: styles inline, plots inline SVG, no script, no CDN. It
holds the run's header (steps, estimator, time span), the plots of
:data:`advmon.reports.plots.PANELS` with the spans where the alert catalog fired, a table
of the alerts with their first and last step and runbook links, a "where"
section (per-slice and per-reward-function plots, and the worst groups at each
alert's firing step, when the records have them), and the last/worst table of
``advmon summary``.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from advmon.alerts.evaluator import Occurrence, evaluate_records
from advmon.alerts.runbooks import runbook_html
from advmon.progress import Progress
from advmon.reports.plots import PANELS, Panel, draw_distribution, draw_panel, figure_to_svg, new_figure, where_panels
from advmon.rules import Thresholds, abs_limit, rule_named, runbook_link
from advmon.runs import Run

__all__ = ["PAGE_STYLE", "AlertRow", "alert_rows", "format_number", "write_page", "write_png", "write_report"]


@dataclass(frozen=True)
class AlertRow:
    """One alert of a run: how often it fired, from which step to which."""

    alert: str
    severity: str
    occurrences: int
    first_step: int
    last_step: int | None  # None: still firing at the end
    worst_value: float


def alert_rows(occurrences: Sequence[Occurrence]) -> list[AlertRow]:
    rows: dict[str, AlertRow] = {}
    for o in occurrences:
        last = o.resolved_step
        known = rows.get(o.alert)
        if known is None:
            rows[o.alert] = AlertRow(o.alert, o.severity, 1, o.fired_step, last, o.value)
            continue
        worst = max(known.worst_value, o.value, key=lambda v: abs(v) if math.isfinite(v) else -1)
        still = known.last_step is None or last is None
        rows[o.alert] = AlertRow(o.alert, o.severity, known.occurrences + 1, known.first_step,
                                 None if still else max(known.last_step, last), worst)
    order = {"critical": 0, "warning": 1, "info": 2}
    return sorted(rows.values(), key=lambda r: (order.get(r.severity, 3), r.first_step))


def alert_spans(occurrences: Sequence[Occurrence]) -> list[tuple[int, int | None, str]]:
    """Where critical and warning alerts were firing, as the plots shade them."""
    return [(o.fired_step, o.resolved_step, o.severity) for o in occurrences if o.severity != "info"]


def _figures(run: Run, occurrences: Sequence[Occurrence], progress: Progress,
             panels: Sequence[Panel] = PANELS) -> list[str]:
    import matplotlib.pyplot as plt

    spans = alert_spans(occurrences)
    svgs = []
    for panel in panels:
        figure, axes = new_figure()
        draw_panel(axes, panel, [(run.name, run.records)], spans)
        svgs.append(figure_to_svg(figure))
        plt.close(figure)
        progress.advance()
    return svgs


#: The pages' style sheet (the report's and the comparison's).
PAGE_STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 20px 24px; color: #222; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
.meta { color: #555; font-size: 14px; max-width: 75em; }
table { border-collapse: collapse; font-size: 13px; margin-top: 8px; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.id { white-space: nowrap; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
.critical { color: #b00020; font-weight: 600; } .warning { color: #a35200; font-weight: 600; } .info { color: #1f5fa0; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 16px 24px; }
figure.plot { margin: 0; }
.plot svg { width: 100%; height: auto; }
.ok { color: #2a7a2a; font-weight: 600; } .bad { color: #b00020; font-weight: 600; }
.runbook { max-width: 75em; }
"""


def _distribution_figures(run: Run, occurrences: Sequence[Occurrence], thresholds: Thresholds | None) -> list[str]:
    """Heatmaps of the post-norm (with the |A| bound the alerts use) and pre-norm histograms per step."""
    if not any(record.histograms for record in run.records):
        return []
    import matplotlib.pyplot as plt
    import numpy as np

    t = thresholds if thresholds is not None else Thresholds.with_overrides(None)
    steps = np.array([r.step for r in run.records], dtype=np.float64)
    bounds = np.array([abs_limit(r.metrics, t) for r in run.records])
    svgs = []
    for stage, limit in (("post_norm", (steps, bounds)), ("pre_norm", None)):
        figure, axes = new_figure()
        if draw_distribution(axes, run.records, limit, stage, alert_spans(occurrences)):
            svgs.append(figure_to_svg(figure))
        plt.close(figure)
    return svgs


def _distribution_section(svgs: Sequence[str]) -> str:
    if not svgs:
        return ""
    plots = "\n".join(f"<figure class='plot'>{svg}</figure>" for svg in svgs)
    return (
        "<h2>Distribution</h2>\n<p class='meta'>Each column is one step's advantages (the record's histogram, "
        "at most 64 bins); colour is the share of the step's values, on a log scale so that a handful of "
        "outliers still shows. Dashed: the |A| the bound alert allows. The strip above a picture: the steps where a "
        "critical (red) or warning (orange) alert was firing.</p>\n"
        f"<div class='plots'>\n{plots}\n</div>"
    )


def format_number(value: float | None) -> str:
    """A number as a table shows it: 4 significant digits, thousands separated, float noise around 0 as 0.

    Example:
        >>> [format_number(v) for v in (0.99999, 10612.4, -3183.6, 0.064287, 5.0, -1.96e-20, 2.5e-05, 5.08e8)]
        ['1', '10,612', '-3,184', '0.06429', '5', '0', '2.5e-05', '5.08e+08']
    """
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    magnitude = abs(value)
    if magnitude < 1e-12:
        return "0"
    if magnitude >= 1000:
        return f"{value:,.0f}" if magnitude < 1e6 else f"{value:.3g}"
    return f"{value:.4g}" if magnitude >= 1e-3 else f"{value:.2g}"


def _header(run: Run) -> str:
    first, last = run.records[0], run.records[-1]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(first.time)) if first.time > 0 else "unknown"
    return (
        f"<h1>advmon report: run {html.escape(run.name)}</h1>"
        f"<p class='meta'>{len(run.records)} records, steps {first.step}&ndash;{last.step}; "
        f"{_recorded_by(run.estimator)}{_normalization(run)}; started {when}, spanning "
        f"{_duration(last.time - first.time)}; source <code>{html.escape(run.source)}</code></p>"
    )


def _recorded_by(estimator: str) -> str:
    """The header's words for what recorded the run: a watched estimator, or ``monitor.observe`` calls."""
    if estimator == "observe":
        return "recorded through <code>monitor.observe</code> (no estimator watched)"
    return f"estimator <code>{html.escape(estimator)}</code>"


def _duration(seconds: float) -> str:
    """``under a second``, ``42 s``, ``3.5 min``, ``2.1 h``, ``3.2 days``."""
    if not seconds >= 1:
        return "under a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 48 * 3600 else f"{seconds / 86400:.1f} days"


def _normalization(run: Run) -> str:
    """The normalization kinds the bound alert judged the run by (docs/alerts.md), most records first."""
    counts = sorted(run.normalizations.items(), key=lambda item: -item[1])
    if not counts:
        return ""
    kinds = ", ".join(html.escape(label) + (f" in {count} records" if len(counts) > 1 else "") for label, count in counts)
    return f", normalization <code>{kinds}</code>"


def _alerts_table(rows: Sequence[AlertRow], runbook_base: str) -> str:
    if not rows:
        return "<p class='ok'>No alert of the catalog fired on this run.</p>"
    lines = ["<table><tr><th>alert</th><th>severity</th><th>fired</th><th>first step</th><th>last step</th>"
             "<th>worst value</th><th>summary</th><th>runbook</th></tr>"]
    for row in rows:
        rule = rule_named(row.alert)
        last = "still firing" if row.last_step is None else str(row.last_step)
        link = runbook_link(runbook_base, row.alert) or f"#runbook-{rule.runbook_anchor}"  # else: on this page
        lines.append(
            f"<tr><td class='id'>{row.alert}</td><td class='{row.severity}'>{row.severity}</td>"
            f"<td class='num'>{row.occurrences}x</td><td class='num'>{row.first_step}</td><td class='num'>{last}</td>"
            f"<td class='num'>{format_number(row.worst_value)}</td>"
            f"<td>{html.escape(rule.summary)}</td><td><a href='{html.escape(link)}'>runbook</a></td></tr>"
        )
    lines.append("</table>")
    return "\n".join(lines)


def _runbooks_section(occurrences: Sequence[Occurrence]) -> str:
    """The runbooks of the alerts that fired, on the page itself (advmon ships them): no link has to resolve."""
    alerts = list(dict.fromkeys(o.alert for o in occurrences))
    if not alerts:
        return ""
    sections = [f"<section id='runbook-{rule_named(alert).runbook_anchor}' class='runbook'><h3>{html.escape(alert)}</h3>\n"
                f"{runbook_html(alert)}</section>" for alert in alerts]
    return "<h2>Runbooks</h2>\n" + "\n".join(sections) + "\n"


def _summary_table(run: Run) -> str:
    from advmon.reports.terminal import TABLE, WORST_END, worst_step_text, worst_value

    last = run.records[-1]
    lines = ["<table><tr><th>metric</th><th>last</th><th>worst is the</th><th>worst</th><th>at step</th></tr>"]
    for key, end in TABLE:
        worst = worst_value(run.records, key, end)
        value, step = worst if worst else (math.nan, "-")
        lines.append(f"<tr><td><code>{key}</code></td>"
                     f"<td class='num'>{format_number(last.metrics.get(key, math.nan))}</td><td>{WORST_END[end]}</td>"
                     f"<td class='num'>{format_number(value)}</td>"
                     f"<td class='num'>{worst_step_text(run.records, key, step)}</td></tr>")
    lines.append("</table>")
    return "\n".join(lines)


#: Alert occurrences whose firing step the "where" section details (the earliest ones).
WHERE_OCCURRENCES = 12
#: Exemplar columns the report shows, and their headings.
_EXEMPLAR_COLUMNS = (
    ("group", "group"), ("reason", "reason"), ("slice", "slice"), ("size", "size"),
    ("reward_min", "reward min"), ("reward_max", "reward max"), ("reward_mean", "reward mean"),
    ("reward_nan_count", "NaN"), ("reward_inf_count", "Inf"), ("reward_function_nonfinite_count", "function NaN/Inf"),
    ("advantage_abs_max", "max |A|"), ("advantage_bound_ratio", "|A| / bound"),
    ("advantage_nonfinite_samples", "NaN/Inf A samples"),
)


#: The exemplar reasons (docs/drilldown.md) that explain each alert; an alert not named here shows every exemplar.
#: Zero-std and reward alerts have none: a group of equal rewards is not an exemplar, and listing the step's NaN
#: groups under "zero-std groups high" answered another question.
_EXEMPLARS_FOR: dict[str, frozenset[str]] = {
    "AdvmonNonFiniteRewards": frozenset({"nonfinite_rewards"}),
    "AdvmonRewardFunctionNonFinite": frozenset({"nonfinite_reward_functions"}),
    "AdvmonNonFiniteAdvantages": frozenset({"nonfinite_advantages"}),
    "AdvmonAdvantageBeyondBound": frozenset({"beyond_bound", "largest_abs_advantage"}),
    "AdvmonAdvantageScaleSpike": frozenset({"beyond_bound", "largest_abs_advantage"}),
    "AdvmonZeroStdGroupsHigh": frozenset(),
    "AdvmonSliceZeroStdHigh": frozenset(),
    "AdvmonAdvantageScaleCollapse": frozenset(),
    "AdvmonRewardCollapse": frozenset(),
}


def _exemplars_for(alert: str, exemplars: Sequence[dict]) -> list[dict]:
    """The exemplars that explain ``alert`` (all of them for an alert without a rule here)."""
    reasons = _EXEMPLARS_FOR.get(alert)
    return list(exemplars) if reasons is None else [e for e in exemplars if e.get("reason") in reasons]


def _where_section(run: Run, occurrences: Sequence[Occurrence], svgs: Sequence[str]) -> str:
    """Per-slice and per-function plots, and the worst groups at each alert's firing step."""
    parts = []
    if svgs:
        plots = "\n".join(f"<figure class='plot'>{svg}</figure>" for svg in svgs)
        parts.append(f"<div class='plots'>\n{plots}\n</div>")
    by_step = {record.step: record for record in run.records}
    shown = [o for o in occurrences if o.severity != "info"][:WHERE_OCCURRENCES]
    for occurrence in shown:
        record = by_step.get(occurrence.fired_step)
        exemplars = list(getattr(record, "exemplars", None) or []) if record is not None else []
        exemplars = _exemplars_for(occurrence.alert, exemplars)
        if not exemplars and not occurrence.where:
            continue
        labels = "".join(f" {html.escape(k)}={html.escape(v)}" for k, v in occurrence.labels)
        parts.append(f"<h3>{occurrence.alert}{labels} at step {occurrence.fired_step}</h3>")
        if occurrence.where:
            parts.append(f"<p>{html.escape(occurrence.where)}</p>")
        if exemplars:
            parts.append(_exemplar_table(exemplars))
    if not parts:
        return ""
    return ("<h2>Where</h2>\n<p class='meta'>Slices, reward functions, and the worst groups (exemplars) at each "
            "alert's firing step (docs/drilldown.md).</p>\n" + "\n".join(parts))


def _exemplar_table(exemplars: Sequence[dict]) -> str:
    lines = ["<table><tr>" + "".join(f"<th>{title}</th>" for _, title in _EXEMPLAR_COLUMNS) + "</tr>"]
    for entry in exemplars:
        cells = []
        for key, _ in _EXEMPLAR_COLUMNS:
            value = entry.get(key)
            if isinstance(value, float):
                cells.append(f"<td class='num'>{format_number(value)}</td>")
            elif isinstance(value, int):
                cells.append(f"<td class='num'>{value}</td>")
            else:
                kind = " class='id'" if key == "group" else ""
                cells.append(f"<td{kind}>{html.escape('-' if value is None else str(value))}</td>")
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def write_report(run: Run, out: Path, thresholds: Thresholds | None = None, runbook_base: str = "") -> Path:
    """Write the HTML report of ``run`` to ``out``."""
    drilldown = where_panels(run.records)
    with Progress(f"report {run.name}", total=len(PANELS) + len(drilldown) + 2) as progress:
        occurrences = evaluate_records(run.records, thresholds)
        progress.advance()
        svgs = _figures(run, occurrences, progress)
        distribution_svgs = _distribution_figures(run, occurrences, thresholds)
        progress.advance()
        where_svgs = _figures(run, occurrences, progress, drilldown)
    plots = "\n".join(f"<figure class='plot'>{svg}</figure>" for svg in svgs)
    shading = ("<p class='meta'>Shaded spans on the plots: where a critical (red) or warning (orange) alert was "
               "firing.</p>\n" if alert_spans(occurrences) else "")
    body = (
        f"{_header(run)}\n<h2>Alerts</h2>\n{_alerts_table(alert_rows(occurrences), runbook_base)}\n{shading}"
        f"<h2>Over steps</h2>\n<div class='plots'>\n{plots}\n</div>\n"
        f"{_distribution_section(distribution_svgs)}\n"
        f"{_where_section(run, occurrences, where_svgs)}\n"
        f"<h2>Last and worst values</h2>\n{_summary_table(run)}\n"
        f"{_runbooks_section(occurrences)}"
    )
    return write_page(out, f"advmon report: {run.name}", PAGE_STYLE, body)


def write_page(out: Path, title: str, style: str, body: str) -> Path:
    """A self-contained HTML page (``title`` is escaped, ``body`` is HTML) written to ``out``."""
    page = (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{style}</style></head><body>\n{body}</body></html>\n"
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def write_png(run: Run, out: Path, thresholds: Thresholds | None = None) -> Path:
    """One overview image of the run (the plots in a 3 x 2 grid, alerts in the title), for a chat or an issue."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    occurrences = evaluate_records(run.records, thresholds)
    rows = alert_rows(occurrences)
    spans = alert_spans(occurrences)
    # Constrained layout sizes the title's band to the title's lines: no blank band above the plots.
    figure, grid = plt.subplots(3, 2, figsize=(15, 12), dpi=90, layout="constrained")
    for axes, panel in zip(grid.flat, PANELS):
        draw_panel(axes, panel, [(run.name, run.records)], spans)
    fired = [f"{r.alert} ({r.severity}) from step {r.first_step}" for r in rows[:3]]
    fired = fired or ["no alert of the catalog fired"]
    if len(rows) > 3:
        fired.append(f"and {len(rows) - 3} more alert{'s' if len(rows) > 4 else ''} (the HTML report lists them all)")
    figure.suptitle("\n".join([f"advmon: run {run.name}, steps {run.steps[0]}-{run.steps[-1]}", *fired]), fontsize=11,
                    x=0.01, ha="left")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)
    return out
