"""``advmon demo``: two simulated GRPO math runs, one stable and one going wrong.

A small GRPO estimator (leave-one-out baseline, std normalization, float32 like
NeMo-RL's) is watched with the public decorator. Each step is computed in two
chunks inside ``monitor.step(n)``, as NeMo-RL's single controller does.

* ``tp1`` learns steadily.
* ``tp2`` goes wrong the way TP-sensitive runs do: its std is computed in one
  float32 pass (``E[x^2] - E[x]^2``, the reduction order TP changes), so groups
  that are identical but for one sample get a std of ~1e-4 instead of 0 and
  advantages in the thousands; the policy collapses, so more and more groups
  answer identically (zero std, no learning signal); late on the reward model
  returns NaN.

Rewards are graded 1.0 (correct), 0.3 (well-formatted but wrong) or 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from advmon.errors import AdvmonConfigError
from advmon.hooks import scored_by, sliced_by
from advmon.monitor import Monitor
from advmon.reports.terminal import format_summary
from advmon.sinks.jsonl import JsonlSink, read_jsonl

__all__ = ["DemoConfig", "grpo_advantages", "run_demo", "serve_demo"]

GROUP_SIZE = 8
PROMPTS_PER_STEP = 48
MAX_TOKENS = 192


@dataclass(frozen=True)
class DemoConfig:
    steps: int = 60
    seed: int = 0
    out: Path = Path("advmon-runs")


def grpo_advantages(
    prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, one_pass_std: bool = False
) -> torch.Tensor:
    """GRPO advantages with a leave-one-out baseline and std normalization, in float32.

    Groups are contiguous blocks of ``GROUP_SIZE`` rows. With ``one_pass_std`` the
    std of the other samples comes from ``E[x^2] - E[x]^2``, which cancels
    catastrophically in float32 when they are (nearly) equal: the numerics of
    ``tp2``. Otherwise it is the two-pass std, exactly 0 for equal rewards. A
    NaN reward turns its whole group NaN. Returns a zero-stride ``[B, T]`` expand
    view, padding not zeroed, as NeMo-RL does.
    """
    groups = rewards.view(-1, GROUP_SIZE)
    others = groups[:, _OTHERS]  # [groups, G, G-1]: every sample's peers
    baseline = others.mean(dim=-1)
    if one_pass_std:
        count = GROUP_SIZE - 1
        variance = (others.square().mean(dim=-1) - baseline.square()) * count / (count - 1)
        std = variance.sqrt().nan_to_num(0.0)
    else:
        std = others.std(dim=-1)
    advantages = (groups - baseline).reshape(-1, 1)
    std = std.reshape(-1, 1)
    spread = std > 0
    advantages[spread] = advantages[spread] / (std[spread] + 1e-6)
    return advantages.expand(mask.shape)


_OTHERS = torch.tensor([[j for j in range(GROUP_SIZE) if j != i] for i in range(GROUP_SIZE)])


def _simulate_rewards(generator: torch.Generator, step: int, steps: int, unstable: bool) -> torch.Tensor:
    progress = step / max(steps - 1, 1)
    difficulty = torch.randn(PROMPTS_PER_STEP, generator=generator)
    skill = -0.6 + 1.2 * progress
    p_correct = torch.sigmoid(skill - difficulty).repeat_interleave(GROUP_SIZE)
    draws = torch.rand(p_correct.shape, generator=generator)
    formatted = torch.rand(p_correct.shape, generator=generator) < 0.7
    rewards = torch.where(draws < p_correct, 1.0, torch.where(formatted, 0.3, 0.0))
    if not unstable or progress < 0.35:
        return rewards
    groups = rewards.view(PROMPTS_PER_STEP, GROUP_SIZE)
    # Collapse: more and more groups answer identically ...
    collapse = min(0.9, 0.2 + 1.2 * (progress - 0.35))
    collapsed = torch.rand(PROMPTS_PER_STEP, generator=generator) < collapse
    groups[collapsed] = groups[collapsed, :1]
    # ... and some are all "formatted but wrong" save one empty answer.
    near = (~collapsed) & (torch.rand(PROMPTS_PER_STEP, generator=generator) < 0.25)
    groups[near] = 0.3
    odd_one = torch.randint(GROUP_SIZE, (PROMPTS_PER_STEP,), generator=generator)
    groups[near, odd_one[near]] = 0.0
    if progress > 0.85:
        # The reward model starts returning NaN for a few samples.
        broken = torch.rand(rewards.shape, generator=generator) < 0.01
        rewards[broken] = math.nan
    return rewards


def _batch(generator: torch.Generator, step: int, steps: int, unstable: bool):
    rewards = _simulate_rewards(generator, step, steps, unstable)
    prompts = torch.randint(0, 32000, (PROMPTS_PER_STEP, 16), generator=generator)
    prompt_ids = prompts.repeat_interleave(GROUP_SIZE, dim=0)
    lengths = torch.randint(8, MAX_TOKENS + 1, rewards.shape, generator=generator)
    mask = (torch.arange(MAX_TOKENS) < lengths.unsqueeze(-1)).float()
    return prompt_ids, rewards, mask


def simulate_run(run: str, config: DemoConfig, unstable: bool) -> Path:
    """Write one simulated run's records to ``<out>/<run>.jsonl`` and return the path."""
    path = config.out / f"{run}.jsonl"
    path.unlink(missing_ok=True)  # the demo owns this file: start it afresh each time
    with Monitor(run, sinks=[JsonlSink(path)], reward_range=(0.0, 1.0)) as monitor:
        for _ in run_steps(monitor, config, unstable):
            pass
    return path


def run_steps(monitor: Monitor, config: DemoConfig, unstable: bool):
    """Drive one simulated run through ``monitor``, yielding after each step."""
    generator = torch.Generator().manual_seed(config.seed * 2 + int(unstable))

    def compute_advantage(prompt_ids, rewards, mask):
        return grpo_advantages(prompt_ids, rewards, mask, one_pass_std=unstable)

    compute_advantage.__qualname__ = "compute_advantage"  # the records name advmon.demo.compute_advantage
    # NeMo-RL's normalization: each sample divided by its peers' std.
    compute_advantage = monitor.watch(normalization="group_loo_std")(compute_advantage)

    half = PROMPTS_PER_STEP // 2 * GROUP_SIZE
    # Two data sources, as a data mix has: every third prompt is competition math.
    sources = ["competition_math" if i % 3 == 0 else "gsm8k" for i in range(PROMPTS_PER_STEP) for _ in range(GROUP_SIZE)]
    for step in range(config.steps):
        prompt_ids, rewards, mask = _batch(generator, step, config.steps, unstable)
        with monitor.step(step):
            # Two chunks per step, the way a streaming controller calls it.
            for chunk in (slice(0, half), slice(half, None)):
                with sliced_by(sources[chunk]), scored_by({"correctness": rewards[chunk]}):
                    compute_advantage(prompt_ids[chunk], rewards[chunk], mask[chunk])
        yield step


def run_demo(config: DemoConfig, say: Callable[[str], None] | None = None) -> str:
    """Simulate ``tp1`` and ``tp2`` and return the terminal summary; ``say`` gets each section as soon as it is
    ready (the header before any work's progress), the CLI's way of printing it."""
    if config.steps < 1:
        raise ValueError(f"steps must be at least 1, got {config.steps}")
    runs = {"tp1": False, "tp2": True}
    sections: list[str] = []

    def add(section: str) -> None:
        sections.append(section)
        if say is not None:
            say(section)

    add(f"advmon demo: GRPO math recipe, {len(runs)} runs x {config.steps} steps "
        f"({PROMPTS_PER_STEP} prompts x {GROUP_SIZE} samples, seed {config.seed})")
    for run, unstable in runs.items():
        path = simulate_run(run, config, unstable)
        records = read_jsonl(path)
        section = _alerts_section(records)
        add(format_summary(run, records, str(path)) + ("\n" + section if section else ""))
    add(f"Alerts: the catalog of advmon/rules.py, evaluated as `advmon alerts check {config.out}` does;\n"
        "`advmon alerts generate` writes the same rules for Prometheus and Alertmanager (alerts/).")
    try:
        add(_report_and_comparison(config))
    except ModuleNotFoundError as exc:  # plots need matplotlib: the summaries stand on their own
        add(f"(no HTML report: {exc.name} is missing; pip install 'advmon[dashboards]')")
    return "\n\n".join(sections)


def _report_and_comparison(config: DemoConfig) -> str:
    """The HTML report of ``tp2`` and the comparison of ``tp1`` with ``tp2``, written beside the runs."""
    from advmon.reports.compare import compare_runs, write_comparison_html
    from advmon.reports.html_page import write_report
    from advmon.runs import read_run

    tp1, tp2 = (read_run(config.out / f"{run}.jsonl") for run in ("tp1", "tp2"))
    report = write_report(tp2, config.out / "report-tp2.html")
    if len(tp1.records) < 20:
        return f"Report: open {report} in a browser (too few steps to compare the runs)."
    comparison = compare_runs(tp1, tp2)
    page = write_comparison_html(comparison, config.out / "compare-tp1-tp2.html")
    first = comparison.diverged_in_order()[:3]
    verdict = (
        f"tp1 vs tp2: first divergence at step {comparison.first_divergence} "
        f"({', '.join(s.key for s in first)})" if comparison.diverged else "tp1 vs tp2: equivalent"
    )
    return (
        f"{verdict}\n"
        f"Open in a browser: {report} (the tp2 report) and {page} (the comparison).\n"
        f"Same from the command line: advmon report {config.out / 'tp2.jsonl'}; "
        f"advmon compare {config.out / 'tp1.jsonl'} {config.out / 'tp2.jsonl'}"
    )


def _alerts_section(records: list) -> str:
    """Each alert once, with every span it fired over and where it first fired (the summary's "instability
    signs" above already say what each is and when it first fired: not said again here); nothing when no alert
    fired, which the signs already say."""
    from advmon.alerts.evaluator import evaluate_records

    occurrences = evaluate_records(records)
    if not occurrences:
        return ""
    lines = ["  alerts over the run (fired -> resolved at each firing; where: the first time each fired):"]
    by_alert: dict[str, list] = {}
    for o in occurrences:
        by_alert.setdefault(o.alert, []).append(o)
    for alert, fired in by_alert.items():
        spans = ", ".join(f"{o.fired_step}->{'still firing' if o.resolved_step is None else o.resolved_step}"
                          for o in fired)
        lines.append(f"    {alert} ({fired[0].severity}, {len(fired)}x): {spans}")
        if fired[0].where:
            lines.append(f"        where: {fired[0].where}")
    return "\n".join(lines)


def serve_demo(config: DemoConfig, host: str = "127.0.0.1", port: int = 9464, step_seconds: float = 5.0,
               announce=print, stop=None) -> None:
    """Expose ``tp1`` and ``tp2`` on one Prometheus endpoint, a step every ``step_seconds``, until interrupted.

    Point a Prometheus at it (the scrape config is printed) with advmon's rules
    (``alerts/``) and Grafana with ``dashboards/``, and watch the boards fill.
    ``stop`` (a ``threading.Event``) ends it from another thread; Ctrl-C from a terminal.

    Raises:
        AdvmonConfigError: prometheus_client is not installed (it comes with ``advmon[prometheus]``).
    """
    import threading

    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ModuleNotFoundError:
        raise AdvmonConfigError(
            "advmon demo --serve needs prometheus_client, which is not installed: pip install 'advmon[prometheus]'"
        ) from None

    from advmon.sinks.prometheus import PrometheusSink

    registry = CollectorRegistry(auto_describe=False)
    server, _ = start_http_server(port, addr=host, registry=registry)
    endpoint = f"{host}:{server.server_port}"
    announce(
        f"advmon demo: serving tp1 and tp2 on http://{endpoint}/metrics, one step every {step_seconds:g} s "
        "(Ctrl-C to stop). Add to prometheus.yml:\n\n"
        "rule_files:\n  - /path/to/advmon/alerts/advmon-rules.yml\n"
        f"scrape_configs:\n  - job_name: advmon-demo\n    scrape_interval: {max(1, int(step_seconds))}s\n"
        f"    static_configs:\n      - targets: ['{endpoint}']\n\n"
        f"and generate rules for this pace: advmon alerts generate --interval {max(1, int(step_seconds))}s\n"
    )
    monitors = [Monitor(run, sinks=[PrometheusSink(registry=registry)], reward_range=(0.0, 1.0)) for run in ("tp1", "tp2")]
    runs = [run_steps(m, config, unstable) for m, unstable in zip(monitors, (False, True))]
    stop = stop if stop is not None else threading.Event()
    try:
        for steps in zip(*runs):
            announce(f"step {steps[0]}")
            if stop.wait(step_seconds):
                return
        announce("all steps done; still serving the last values (Ctrl-C to stop)")
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for monitor in monitors:
            monitor.close()
        server.shutdown()
        server.server_close()  # else Ctrl-C ends with "unclosed <socket.socket ...>" on stderr
