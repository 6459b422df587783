"""The two boards: advantage health for on-call, and run comparison.

Every number a panel colours by (the zero-std share, the group bound, the stale
time) is read from the alert catalog's thresholds, so the board turns red where
the alert fires: one source, never two copies of a number.
"""

from __future__ import annotations

from advmon.dashboards.build import (
    Board,
    BoardContext,
    Column,
    PanelSpec,
    Query,
    Row,
    ThresholdStep,
    ValueText,
    Variable,
)
from advmon.rules import (
    JOB_ZERO_STD,
    POST_MEAN_MEDIAN,
    PRE_STD_MEDIAN,
    REWARD_MEAN_MEDIAN,
    RUN_ABS_MAX,
    RUN_BOUND_RATIO,
    RUN_LAST_UPDATE,
    RUN_NONFINITE,
    RUN_STEP,
    RUN_ZERO_STD,
    PromContext,
    dashboard_link,
    format_duration,
    Thresholds,
    format_number,
    runbook_link,
)

__all__ = ["compare_board", "fleet_board", "health_board"]

HEALTH_UID = "advmon-health"
COMPARE_UID = "advmon-compare"
FLEET_UID = "advmon-fleet"
RUN_LABELS = "job, instance, run"


def _selector(context: BoardContext, *matchers: str) -> str:
    base = context.selector.strip().strip("{}").strip()
    return ",".join(m for m in (base, *matchers) if m)


class _Metrics:
    """Metric selectors restricted to the board's variables."""

    def __init__(self, context: BoardContext, *matchers: str) -> None:
        self.ctx = PromContext(selector=_selector(context, *matchers))

    def __call__(self, name: str, **labels: str) -> str:
        return self.ctx.metric(name, **labels)


def _runbook(runbook_base: str, alert: str) -> tuple[str, str]:
    return (f"Runbook: {alert}", runbook_link(runbook_base, alert))


def health_board(context: BoardContext, thresholds: Thresholds, runbook_base: str = "") -> Board:
    """The on-call board: per selected run, is the estimator healthy, what fires, why."""
    m = _Metrics(context, 'job=~"$job"', 'run=~"$run"')
    t = thresholds
    abs_max = f'max without (stage) ({m("advmon_advantage_abs_max", stage="post_norm")})'
    bound_ratio = m("advmon_advantage_bound_ratio")
    # The |A| at which the bound alert fires: bound_factor x |A| / (|A| over its normalization's bound).
    bound = f"({format_number(t['bound_factor'])} * {abs_max} / on ({RUN_LABELS}) {bound_ratio})"
    alerts = m("ALERTS", alertstate="firing", alertname="Advmon.*").replace('alertname="', 'alertname=~"')
    red_from = lambda value: (ThresholdStep("green"), ThresholdStep("red", value))  # noqa: E731
    now = Row(
        "Now",
        [
            PanelSpec(
                "Firing advmon alerts",
                "Advmon alerts firing now for the selected runs (Prometheus ALERTS). Anything above 0: open the "
                "runbook of the alert named in the 'Alerts' annotations and the panels below.",
                "none", [Query(f"count({alerts}) or vector(0)", "firing")], kind="stat", width=4, height=5,
                thresholds=red_from(1), links=[("Runbooks", runbook_base)],
            ),
            PanelSpec(
                "NaN/Inf values, last hour",
                "NaN and Inf rewards and advantages counted in the last hour. Any: AdvmonNonFiniteRewards or "
                "AdvmonNonFiniteAdvantages fires; check the reward function first.",
                "none", [Query(f'round(sum(increase({m("advmon_nonfinite_values_total")}[1h]))) or vector(0)', "NaN/Inf")],
                kind="stat", width=4, height=5, thresholds=red_from(1),
                links=[_runbook(runbook_base, "AdvmonNonFiniteRewards"), _runbook(runbook_base, "AdvmonNonFiniteAdvantages")],
            ),
            PanelSpec(
                "Zero-std group ratio",
                "Share of groups whose rewards are all equal (no learning signal), worst selected run, last "
                f"step. Red from {t['zero_std_ratio']:g}, AdvmonZeroStdGroupsHigh's threshold.",
                "percentunit", [Query(f'max({m("advmon_zero_std_group_ratio")})', "zero-std")], kind="stat",
                width=4, height=5, thresholds=red_from(t["zero_std_ratio"]),
                links=[_runbook(runbook_base, "AdvmonZeroStdGroupsHigh")],
            ),
            PanelSpec(
                "Post-norm |A| max vs bound",
                "Largest |advantage| of the last step, worst selected run, as a multiple of the bound of the "
                "estimator's normalization (G/sqrt(G-1) for a group std, the group's reward spread for a group mean, "
                "the Gaussian tail for batch whitening): the number AdvmonAdvantageBeyondBound's message gives "
                "('|advantage| reached Nx what its normalization allows'). Healthy runs stay at or below 1; red from "
                f"{t['bound_factor']:g} (bound_factor), where the alert fires. A multiple, not a percent: a "
                "float32 std cancellation reads in the thousands.",
                "none", [Query(f"max({bound_ratio})", "|A| / bound")],
                kind="stat", width=4, height=5, thresholds=red_from(t["bound_factor"]),
                links=[_runbook(runbook_base, "AdvmonAdvantageBeyondBound")],
            ),
            PanelSpec(
                "Seconds since the last record",
                f"Time since the most stale selected run last reported. Red from {t['stale_seconds']:g} s "
                "(AdvmonRunHung).",
                "s", [Query(f'time() - min({m("advmon_last_update_timestamp_seconds")})', "age")], kind="stat",
                width=4, height=5, thresholds=red_from(t["stale_seconds"]),
                links=[_runbook(runbook_base, "AdvmonRunHung")],
            ),
            PanelSpec(
                "Current step",
                "The latest training step advmon recorded (largest over the selected runs).",
                "none", [Query(f'max({m("advmon_step")})', "step")], kind="stat", width=4, height=5,
            ),
        ],
    )

    def stage_band(stage: str, extra: list[Query]) -> list[Query]:
        mean, std = m("advmon_advantage_mean", stage=stage), m("advmon_advantage_std", stage=stage)
        return [
            Query(mean, "{{run}} mean"),
            Query(f"{mean} + on ({RUN_LABELS}, stage) {std}", "{{run}} mean + std"),
            Query(f"{mean} - on ({RUN_LABELS}, stage) {std}", "{{run}} mean - std"),
            *extra,
        ]

    advantages = Row(
        "Advantages",
        [
            PanelSpec(
                "Post-norm mean ± std",
                "What the estimator returned, per step: mean and one std either side, with the run's trailing "
                "median of the mean. A healthy GRPO token-weighted mean sits a little below 0; moving more than "
                f"{t['mean_drift']:g} trailing stds from its median fires AdvmonPostNormMeanDrift.",
                "none", stage_band("post_norm", [Query(m(POST_MEAN_MEDIAN), "{{run}} trailing median")]),
                fill_below_to=".*std$", links=[_runbook(runbook_base, "AdvmonPostNormMeanDrift")],
            ),
            PanelSpec(
                "Pre-norm mean ± std",
                "Before normalization (tapped, or reward minus its group mean). A collapsing reward model shrinks "
                f"this std while post-norm looks normal: below {t['scale_collapse_ratio']:g} x its trailing median "
                f"fires AdvmonAdvantageScaleCollapse, above {t['scale_spike_ratio']:g} x AdvmonAdvantageScaleSpike.",
                "none", stage_band("pre_norm", [Query(m(PRE_STD_MEDIAN), "{{run}} std trailing median")]),
                fill_below_to=".*std$", links=[_runbook(runbook_base, "AdvmonAdvantageScaleCollapse")],
            ),
            PanelSpec(
                "Post-norm min / max and the bound",
                "Extremes of the returned advantages against the |A| at which AdvmonAdvantageBeyondBound fires "
                "(dashed: bound_factor x the bound of the estimator's normalization). Beyond it the grouping, the std "
                "or the scale is wrong (float32 cancellation, an epsilon instead of a zero-std guard, a x100 bug).",
                "none",
                [
                    Query(m("advmon_advantage_max", stage="post_norm"), "{{run}} max"),
                    Query(m("advmon_advantage_min", stage="post_norm"), "{{run}} min"),
                    Query(bound, "{{run}} bound"),
                    Query(f"-{bound}", "{{run}} -bound"),
                ],
                fill_below_to=".*bound$", links=[_runbook(runbook_base, "AdvmonAdvantageBeyondBound")],
            ),
            PanelSpec(
                "Post-norm percentiles",
                "p1, p10, p50, p90, p99 of the returned advantages (exact, or within 0.8% of the true value for "
                "large batches, at any range). Tails that widen while the median holds mean a few groups dominate the update.",
                "none", [Query(m("advmon_advantage_percentile", stage="post_norm"), "{{run}} p{{percentile}}")],
            ),
        ],
    )
    groups = Row(
        "Groups and rewards",
        [
            PanelSpec(
                "Zero-std, all-fail and all-pass groups",
                "Shares of groups with all-equal rewards, and of those all failing / all passing (with a reward "
                f"range). Healthy binary-reward GRPO: 25-45% zero-std, growing with skill; dashed line at "
                f"{t['zero_std_ratio']:g}.",
                "percentunit",
                [
                    Query(m("advmon_zero_std_group_ratio"), "{{run}} zero-std"),
                    Query(m("advmon_group_all_fail_ratio"), "{{run}} all fail"),
                    Query(m("advmon_group_all_pass_ratio"), "{{run}} all pass"),
                ],
                thresholds=(ThresholdStep("green"), ThresholdStep("red", t["zero_std_ratio"])),
                links=[_runbook(runbook_base, "AdvmonZeroStdGroupsHigh")],
            ),
            PanelSpec(
                "Rewards: mean, min, max",
                "Per-sequence rewards of each step, with the trailing median of the mean. A fall of more than "
                f"{t['reward_drop_stds']:g} reward stds below it fires AdvmonRewardCollapse.",
                "none",
                [
                    Query(m("advmon_reward_mean"), "{{run}} mean"),
                    Query(m("advmon_reward_min"), "{{run}} min"),
                    Query(m("advmon_reward_max"), "{{run}} max"),
                    Query(m(REWARD_MEAN_MEDIAN), "{{run}} trailing median"),
                ],
                links=[_runbook(runbook_base, "AdvmonRewardCollapse")],
            ),
            PanelSpec(
                "NaN/Inf values",
                "Non-finite rewards and advantages per interval, by stage and kind. Any at all is critical. The "
                "dots are exemplars: hover one for the worst group (and its slice) of the step that counted "
                "(Prometheus returns the exemplars of the counter inside the query; its running total is not drawn).",
                "none",
                [Query(f'sum by (run, stage, kind) (increase({m("advmon_nonfinite_values_total")}[$__rate_interval]))',
                       "{{run}} {{stage}} {{kind}}", exemplar=True)],
                thresholds=red_from(1), links=[_runbook(runbook_base, "AdvmonNonFiniteRewards")],
            ),
            PanelSpec(
                "Groups per step and the largest group",
                "How many prompt groups each step had and the size of the largest (the G of the bound).",
                "none",
                [Query(m("advmon_groups"), "{{run}} groups"), Query(m("advmon_group_max_size"), "{{run}} largest group")],
            ),
        ],
    )
    sliced = _Metrics(context, 'job=~"$job"', 'run=~"$run"', 'slice=~"$slice"')
    slices = Row(
        "Slices and reward functions",
        [
            PanelSpec(
                "Slice $slice",
                "One copy per selected slice (data source, task; the `slice` variable): its zero-std share, reward "
                f"mean, NaN/Inf rewards and, on the right axis, largest |post-norm advantage| per step. Zero-std above "
                f"{t['zero_std_ratio']:g} while the run stays below fires AdvmonSliceZeroStdHigh. At most "
                "max_slices slices per run; later ones are summed in 'other'.",
                "none",
                [
                    Query(sliced("advmon_slice_zero_std_group_ratio"), "{{run}} zero-std share"),
                    Query(sliced("advmon_slice_reward_mean"), "{{run}} reward mean"),
                    Query(f'sum without (kind) ({sliced("advmon_slice_reward_nonfinite")})', "{{run}} NaN/Inf rewards"),
                    Query(sliced("advmon_slice_advantage_abs_max"), "{{run}} max |A|"),
                ],
                width=6, repeat="slice", links=[_runbook(runbook_base, "AdvmonSliceZeroStdHigh")],
                right_axis=(".*max \\|A\\|$", "max |A|"),
            ),
            PanelSpec(
                "Reward functions: mean and NaN/Inf scores",
                "Each reward function's (or GDPO component's) mean, and its NaN/Inf scores per step (a function that "
                "returned None). Any NaN while the summed reward is finite fires AdvmonRewardFunctionNonFinite.",
                "none",
                [
                    Query(m("advmon_reward_function_mean"), "{{run}} {{function}} mean"),
                    Query(f'sum without (kind) ({m("advmon_reward_function_nonfinite")})', "{{run}} {{function}} NaN/Inf"),
                ],
                width=24, links=[_runbook(runbook_base, "AdvmonRewardFunctionNonFinite")],
            ),
        ],
    )
    health = Row(
        "advmon's own health",
        [
            PanelSpec(
                "Records per minute",
                "Records advmon emitted per minute; flat at zero while training runs means the estimator is not "
                "watched, or the process is stuck.",
                "none", [Query(f'rate({m("advmon_updates_total")}[$__rate_interval]) * 60', "{{run}}")], width=6,
            ),
            PanelSpec(
                "Sink errors and dropped records",
                "Records a sink failed to take after retries, and records dropped from a full queue. Replay them "
                "from the JSONL file with `advmon replay`.",
                "none",
                [
                    Query(f'increase({m("advmon_sink_errors_total")}[$__rate_interval])', "{{run}} {{sink}} errors"),
                    Query(f'increase({m("advmon_dropped_records_total")}[$__rate_interval])', "{{run}} {{sink}} dropped"),
                ],
                width=6, links=[_runbook(runbook_base, "AdvmonSinkErrors"), _runbook(runbook_base, "AdvmonDroppedRecords")],
            ),
            PanelSpec(
                "Delivery endpoints up",
                "1 while Prometheus reaches each Pushgateway it scrapes and each trainer endpoint that served advmon "
                "series in the last hour, 0 while it cannot. A Pushgateway at 0: pushed runs' series are gone "
                "until it is back, and no run-state alert pages for them (the gateway's own push times vanish "
                "too, which AdvmonRunCrashed reads as deleted groups); training is unaffected and every record "
                "is in its JSONL file (`advmon replay FILE --to pushgateway:URL`). A trainer endpoint at 0 is a "
                "process gone: see AdvmonRunCrashed.",
                "none",
                [
                    Query("up and on (job, instance) last_over_time(pushgateway_build_info[1h])",
                          "Pushgateway {{instance}}"),
                    Query(f'up and on (job, instance) last_over_time({m("advmon_updates_total")}[1h])',
                          "endpoint {{job}} {{instance}}"),
                ],
                width=6, links=[_runbook(runbook_base, "AdvmonRunCrashed")],
            ),
            PanelSpec(
                "advmon internal errors",
                "Problems advmon met recording a call (mask shape, missing rewards...): the training log has one "
                "AdvmonWarning per kind.",
                "none", [Query(f'increase({m("advmon_internal_errors_total")}[$__rate_interval])', "{{run}}")],
                width=6, links=[_runbook(runbook_base, "AdvmonInternalErrors")],
            ),
        ],
    )
    return Board(
        title="advmon: advantage health",
        uid=HEALTH_UID,
        description="Per run: is the advantage estimator healthy, which advmon alerts fire and why.",
        rows=[now, advantages, groups, slices, health],
        variables=[
            Variable("job", "Job", _label_values(context, "job"), multi=True, include_all=True),
            Variable("run", "Run", _label_values(context, "run", 'job=~"$job"'), multi=True, include_all=True),
            Variable("slice", "Slice", _label_values(context, "slice", 'job=~"$job"', 'run=~"$run"',
                                                     metric="advmon_slice_rewards"), multi=True, include_all=True),
        ],
        annotations=[_alert_annotation(context)],
        links=[("Runbooks", runbook_base), ("Compare runs", f"/d/{COMPARE_UID}")],
    )


def _label_values(context: BoardContext, label: str, *matchers: str, metric: str = "advmon_updates_total") -> str:
    """A variable's query: the values of ``label`` on a metric (advmon's always-present counter by default)."""
    return f"label_values({PromContext(selector=_selector(context, *matchers)).metric(metric)}, {label})"


def _alert_annotation(context: BoardContext) -> dict:
    selector = _selector(context, 'alertstate="firing"', 'alertname=~"Advmon.*"', 'run=~"$run"')
    return {
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "enable": True,
        "expr": f"ALERTS{{{selector}}}",
        "iconColor": "red",
        "name": "Alerts",
        "step": "60s",
        "titleFormat": "{{alertname}}",
        "textFormat": "{{run}} ({{severity}})",
        "useValueForTime": False,
    }


_COMPARED = (
    ("Post-norm mean", "advmon_advantage_mean", {"stage": "post_norm"}, "none"),
    ("Post-norm std", "advmon_advantage_std", {"stage": "post_norm"}, "none"),
    ("Post-norm |A| max", "advmon_advantage_abs_max", {"stage": "post_norm"}, "none"),
    ("Post-norm p99", "advmon_advantage_percentile", {"stage": "post_norm", "percentile": "99"}, "none"),
    ("Pre-norm std", "advmon_advantage_std", {"stage": "pre_norm"}, "none"),
    ("Zero-std group ratio", "advmon_zero_std_group_ratio", {}, "percentunit"),
    ("Reward mean", "advmon_reward_mean", {}, "none"),
)


def compare_board(context: BoardContext, thresholds: Thresholds, runbook_base: str = "") -> Board:
    """Two runs of one recipe (TP=1 vs TP=2, before vs after), overlaid, with their difference."""
    a = _Metrics(context, 'job=~"$job"', 'run="$run_a"')
    b = _Metrics(context, 'job=~"$job"', 'run="$run_b"')
    rows = []
    steps = PanelSpec(
        "Training step of each run",
        "advmon_step of both runs over time. Prometheus lines series up by time, not by step: when run A "
        "started earlier, type 'offset 2h' (how much earlier) into 'Shift run A' so equal steps overlap.",
        "none",
        [Query(f"{a('advmon_step')} $shift_a", "A: {{run}}"), Query(b("advmon_step"), "B: {{run}}")],
        width=24, height=6,
    )
    rows.append(Row("Alignment", [steps]))
    for title, name, labels, unit in _COMPARED:
        series_a, series_b = f"{a(name, **labels)} $shift_a", b(name, **labels)
        overlay = PanelSpec(
            f"{title}: A and B",
            f"{title} of run A ($run_a, '$shift_a') and run B ($run_b).",
            unit, [Query(series_a, "A: {{run}}"), Query(series_b, "B: {{run}}")],
        )
        difference = PanelSpec(
            f"{title}: A - B",
            f"Difference of {title.lower()} between the runs at the same (shifted) time. A difference that "
            "grows beyond both runs' own step-to-step noise is a divergence: `advmon compare` tests it on the files.",
            unit, [Query(f"({series_a}) - ignoring ({RUN_LABELS}) ({series_b})", "A - B")],
        )
        rows.append(Row(title, [overlay, difference]))
    runs = _label_values(context, "run", 'job=~"$job"')
    return Board(
        title="advmon: compare runs",
        uid=COMPARE_UID,
        description="Two runs of one recipe overlaid, with their difference, statistic by statistic.",
        rows=rows,
        variables=[
            Variable("job", "Job", _label_values(context, "job"), multi=True, include_all=True),
            Variable("run_a", "Run A", runs),
            Variable("run_b", "Run B", runs),
            # A PromQL offset clause ("offset 2h") or nothing: Prometheus 2.x refuses "offset 0s".
            Variable("shift_a", "Shift run A", kind="textbox", default=""),
        ],
        links=[("Runbooks", runbook_base), ("Advantage health", f"/d/{HEALTH_UID}")],
    )


#: The fleet table's State column: (code, text, colour); the Severity column's, worst first.
STATES = (ValueText(0, "running", "green"), ValueText(1, "finished", "blue"), ValueText(2, "hung", "orange"),
          ValueText(3, "crashed", "red"))
SEVERITY_RANKS = (ValueText(3, "critical", "red"), ValueText(2, "warning", "orange"), ValueText(1, "info", "yellow"),
                  ValueText(0, "none", "green"), ValueText(-1, "finished", "blue"))
NO_RUNS = "No advmon run matches this selection: check the job variable and the board's selector"


def fleet_board(context: BoardContext, thresholds: Thresholds, runbook_base: str = "") -> Board:
    """Every run of the selected jobs in one table, worst first: state, worst alert, step, staleness, signals.

    The columns read the fleet recording rules (:func:`advmon.rules.fleet_recording_rules`: a run's figures
    over its ranks) and Prometheus's ``ALERTS``, looking back ``crash_memory_seconds`` so that a crashed run
    keeps its last values; each run links to its health board around its last record.
    """
    t = thresholds
    memory = format_duration(t["crash_memory_seconds"])
    m = _Metrics(context, 'job=~"$job"')
    recorded = PromContext(selector=_selector(context, 'job=~"$job"'), ray_prefix=False).metric
    by = "by (job, run)"

    def last(record: str, **labels: str) -> str:
        return f"max {by} (last_over_time({recorded(record, **labels)}[{memory}]))"

    finished = f"last_over_time({m('advmon_run_finished')}[{memory}])"
    firing = lambda **labels: m("ALERTS", alertstate="firing", **labels)  # noqa: E731
    state = (f"3 * max {by} ({firing(alertname='AdvmonRunCrashed')}) or 2 * max {by} ({firing(alertname='AdvmonRunHung')})"
             f" or max {by} ({finished} == 1) or 0 * max {by} ({finished})")
    advmon_alerts = {severity: firing(severity=severity).replace("}", ',alertname=~"Advmon.*"}')
                     for severity in ("critical", "warning", "info")}
    ranked = " or ".join(f"{rank} * max by (job, run, alertname) ({advmon_alerts[severity]})"
                         for rank, severity in ((3, "critical"), (2, "warning"), (1, "info")))
    severity = f"max {by} ({ranked}) or -1 * max {by} ({finished} == 1) or 0 * max {by} ({finished})"
    link = dashboard_link(f"/d/{HEALTH_UID}", "${__data.fields.run}", "${__data.fields.last_record_ms}")
    link = link.replace("?var-run=", "?var-job=${__data.fields.job}&var-run=")
    red_from = lambda value: (ThresholdStep("green"), ThresholdStep("red", value))  # noqa: E731
    table = PanelSpec(
        "Runs, worst first",
        "One row a run (its ranks together): its state (running; finished: closed cleanly; crashed: gone without "
        "closing; hung: alive without records), its worst firing advmon alert, its last step, the seconds since "
        f"its last record (red from {t['stale_seconds']:g} s), its zero-std group ratio (red from "
        f"{t['zero_std_ratio']:g}), its largest |A| and |A| as a multiple of its normalization's bound (red from "
        f"{t['bound_factor']:g}, where the bound alert fires), and its NaN/Inf rewards and advantages of the last "
        "hour. Sorted by the worst alert's severity; a finished run last. The run's name opens its health board "
        f"on the hour around its last record. Crashed runs keep their last values for {memory}.",
        "none",
        [
            Query(state, "state"),
            Query(f"topk {by} (1, {ranked})", "worst alert"),
            Query(severity, "severity"),
            Query(last(RUN_STEP), "step"),
            Query(f"time() - {last(RUN_LAST_UPDATE)}", "since last record"),
            Query(last(RUN_ZERO_STD), "zero-std"),
            Query(last(RUN_ABS_MAX, stage="post_norm"), "|A| max"),
            Query(last(RUN_BOUND_RATIO), "|A| / bound"),
            Query(f'round(sum {by} ({recorded(RUN_NONFINITE)}) and on (job, run) '
                  f'sum {by} ({recorded(RUN_NONFINITE, stage="reward")} or {recorded(RUN_NONFINITE, stage="post_norm")}))',
                  "NaN/Inf"),
            Query(f"1000 * {last(RUN_LAST_UPDATE)}", "last record"),
        ],
        kind="table", width=24, height=20,
        columns=[
            Column("run", label="run", link=("Health board of this run, around its last record", link)),
            Column("job", label="job"),
            Column("State", texts=STATES),
            Column("Worst alert", label="alertname"),
            Column("Worst alert value", hidden=True),
            Column("Severity", texts=SEVERITY_RANKS),
            Column("Step", decimals=0),
            Column("Since last record", unit="s", thresholds=red_from(t["stale_seconds"]), decimals=0),
            Column("Zero-std ratio", unit="percentunit", thresholds=red_from(t["zero_std_ratio"])),
            Column("|A| max"),
            Column("|A| / bound", thresholds=red_from(t["bound_factor"]), decimals=2),
            Column("NaN/Inf, last hour", thresholds=red_from(1), decimals=0),
            Column("last_record_ms", hidden=True),
        ],
        sort_by="Severity",
        no_data=NO_RUNS,
        links=[("Runbooks", runbook_base)],
    )
    runs = PanelSpec(
        "Runs",
        "How many runs the selection holds (seen in the last "
        f"{memory}). 0 means the job variable or the board's selector matches no advmon run: the table below "
        "is then empty for that reason, not because all is well.",
        "none", [Query(f"count(max {by} ({finished})) or vector(0)", "runs")], kind="stat", width=6, height=4,
        texts=(ValueText(0, NO_RUNS, "red"),), thresholds=(ThresholdStep("red"), ThresholdStep("green", 1)),
    )
    states = [
        PanelSpec(
            title, f"Runs {meaning} now ({rule}).", "none", [Query(f"count(({state}) == {code}) or vector(0)", title)],
            kind="stat", width=3, height=4, thresholds=colour,
        )
        for title, meaning, rule, code, colour in (
            ("Crashed", "gone without closing", "AdvmonRunCrashed", 3, red_from(1)),
            ("Hung", "alive without records", "AdvmonRunHung", 2, red_from(1)),
            ("Running", "alive and recording", "no state alert", 0, (ThresholdStep("green"),)),
            ("Finished", "closed cleanly", "never an alert", 1, (ThresholdStep("blue"),)),
        )
    ]
    fleet_ratio = PanelSpec(
        "Zero-std ratio of the live runs",
        "Zero-std groups of all live runs over their groups with two finite rewards or more, per job "
        f"({JOB_ZERO_STD}: a sum over a sum, never a mean of the runs' ratios).",
        "percentunit", [Query(PromContext(selector=_selector(context, 'job=~"$job"'), ray_prefix=False).metric(JOB_ZERO_STD),
                              "{{job}}")],
        kind="stat", width=6, height=4, thresholds=red_from(t["zero_std_ratio"]),
    )
    return Board(
        title="advmon: fleet",
        uid=FLEET_UID,
        description="Every advmon run of the selected jobs in one table, worst first, each linked to its health board.",
        rows=[Row("Fleet", [runs, *states, fleet_ratio]), Row("Runs", [table])],
        variables=[Variable("job", "Job", _label_values(context, "job", metric="advmon_run_finished"), multi=True,
                            include_all=True)],
        links=[("Runbooks", runbook_base), ("Advantage health", f"/d/{HEALTH_UID}")],
        time_from="now-1h",
    )
