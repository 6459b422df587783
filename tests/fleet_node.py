"""One node of a simulated fleet, in a process of its own: several runs' trainers, each with advmon's scrape endpoint.

``python -m tests.fleet_node RUN [RUN ...]`` starts one :class:`advmon.Monitor` per run, each with a
:class:`~advmon.sinks.prometheus.PrometheusSink` on a free port of 127.0.0.1 (a trainer process of its own would
have one), prints ``{"run": port, ...}`` as one JSON line, and steps every run once a second with a GRPO
batch (binary rewards, group-normalized advantages). A run named on several nodes is one run spread over
ranks: each node's monitor records its own shard (``all_ranks=True``), under the same ``run`` label.

Commands on stdin, each answered ``ok``: ``fault RUN`` (from the next step on, 3 of the run's 64 rewards are
NaN; the estimator zeroes their advantages, so only the reward alert has a reason to fire), ``heal RUN``,
``quit``.
"""

from __future__ import annotations

import json
import sys
import threading
import zlib

import numpy as np
import torch

import advmon
from advmon.sinks.prometheus import PrometheusSink

GROUP = 8
SAMPLES = 64
STEP_SECONDS = 1.0


def grpo_step(monitor: advmon.Monitor, rng: np.random.Generator, nan_rewards: int) -> None:
    """One step's rewards and advantages, observed; NaN rewards get a zero advantage (masked out of the loss)."""
    rewards = (rng.random(SAMPLES) < 0.5).astype(np.float32)
    rewards[:nan_rewards] = np.nan
    groups = rewards.reshape(-1, GROUP)
    std = np.nanstd(groups, axis=1, ddof=1, keepdims=True)
    advantages = np.nan_to_num((groups - np.nanmean(groups, axis=1, keepdims=True)) / (std + 1e-6))
    adv = torch.from_numpy(advantages.reshape(-1, 1).astype(np.float32)).expand(SAMPLES, 16)
    monitor.observe(rewards=torch.from_numpy(rewards), advantages=adv, mask=torch.ones(SAMPLES, 16), group_size=GROUP)


def main(runs: list[str]) -> int:
    monitors = {run: advmon.Monitor(run, sinks=[PrometheusSink(port=0)], all_ranks=True) for run in runs}
    print(json.dumps({run: monitor.sinks[0].port for run, monitor in monitors.items()}), flush=True)
    faulty: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def train() -> None:
        rngs = {run: np.random.default_rng(zlib.crc32(run.encode())) for run in runs}
        step = 0
        while not stop.wait(STEP_SECONDS):
            for run, monitor in monitors.items():
                with lock:
                    nan_rewards = 3 if run in faulty else 0
                with monitor.step(step):
                    grpo_step(monitor, rngs[run], nan_rewards)
            step += 1

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    for line in sys.stdin:
        command, _, run = line.strip().partition(" ")
        if command == "quit":
            break
        with lock:
            if command == "fault":
                faulty.add(run)
            elif command == "heal":
                faulty.discard(run)
        print("ok", flush=True)
    stop.set()
    trainer.join(30)
    for monitor in monitors.values():
        monitor.close()
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
