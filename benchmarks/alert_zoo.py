"""The estimator zoo's table (docs/alerts.md): every real estimator, healthy at every reward scale and broken.

For each estimator of verl, TRL, SkyRL, AReaL, OpenRLHF and NeMo-RL (tests/zoo.py): the normalization advmon
records for it, the false alarms (warning or critical) of its healthy runs, how close
they came to the bound alert (worst ``advantages/bound_ratio``), and for each fault in
how many steps after its onset an alert flagged it.

    python benchmarks/alert_zoo.py [--quick] [--nemo-rl PATH] [--estimator NAME ...]

``--quick`` runs ``make test``'s grid (16 prompts x 8 at every scale and reward kind, two
runs of 64 x 16, faults at one scale each); without it every size, scale and reward kind,
faults at every scale. ``--nemo-rl PATH`` loads NeMo-RL's real estimators from a checkout
of NVIDIA-NeMo/RL (else tests/nemo_like.py's re-implementations).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.zoo import ESTIMATORS, FAULTS, REWARDS, SCALES, SIZES, fault_cases, healthy_cases, quick_cases, run_case  # noqa: E402


def table(names: list[str], quick: bool) -> str:
    started = time.perf_counter()
    lines = [
        "| estimator | kind | healthy runs | false alarms | worst bound ratio | "
        + " | ".join(FAULTS) + " |",
        "|---|---|---|---|---|" + "---|" * len(FAULTS),
    ]
    totals = {"runs": 0, "false": 0, "faults": 0, "caught": 0}
    for name in names:
        estimator = ESTIMATORS[name]
        healthy, faulty = quick_cases(name) if quick else (
            healthy_cases(name),
            [case for scale in SCALES for rewards in REWARDS for case in fault_cases(name, scale, rewards)])
        outcomes = [run_case(case) for case in healthy]
        false = [f"{o.case.rewards} x{o.case.scale:g} {o.case.prompts}x{o.case.group}: {a.alert}@{a.fired_step}"
                 for o in outcomes for a in o.false_alarms()]
        said = sorted({w for o in outcomes for w in o.warnings})
        kinds = sorted({str(k) for o in outcomes for k in o.kinds})
        worst = max(o.worst_ratio() for o in outcomes)
        cells = []
        for fault in FAULTS:
            runs = [run_case(case) for case in faulty if case.fault == fault]
            if not runs:
                cells.append("n/a")
                continue
            delays = [o.caught_after() for o in runs]
            early = [a for o in runs for a in o.false_alarms()]
            hits = [d for d in delays if d is not None and d <= 10]
            cell = f"{len(hits)}/{len(runs)}"
            if hits:
                cell += f" ({statistics.median(hits):g}, {max(hits)})"
            if early:
                cell += f"; {len(early)} before onset"
            cells.append(cell)
            totals["faults"] += len(runs)
            totals["caught"] += len(hits)
        totals["runs"] += len(outcomes)
        totals["false"] += len(false)
        alarms = str(len(false)) if not false else f"{len(false)}: {'; '.join(false[:3])}"
        if said:
            alarms += f" (warned: {said[0][:80]})"
        lines.append(f"| {name} | {', '.join(kinds)} | {len(outcomes)} | {alarms} | {worst:.3g} | "
                     + " | ".join(cells) + " |")
    source = os.environ.get("ADVMON_NEMO_RL")
    header = (f"{totals['runs']} healthy runs, {totals['false']} false alarms; {totals['caught']}/{totals['faults']} "
              f"faults flagged within 10 steps of onset; NeMo-RL: {'real, from ' + source if source else 'tests/nemo_like.py'}; "
              f"{time.perf_counter() - started:.0f} s")
    cells = "fault cells: flagged/runs (median, max steps after onset)"
    return "\n".join([header, "", cells, "", *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="make test's grid")
    parser.add_argument("--nemo-rl", metavar="PATH", help="a checkout of NVIDIA-NeMo/RL: its real estimators")
    parser.add_argument("--estimator", action="append", choices=sorted(ESTIMATORS), metavar="NAME")
    args = parser.parse_args(argv)
    if args.nemo_rl:
        os.environ["ADVMON_NEMO_RL"] = args.nemo_rl
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)  # verl's optional engines, TRL's notices
    print(table(args.estimator or list(ESTIMATORS), args.quick))
    print(f"\nsizes {SIZES}, reward scales {SCALES}, rewards {REWARDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
