"""Only global rank 0 reports: two processes with torch.distributed (gloo, CPU)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .reference import REWARD_KEYS, assert_stats_close, derived_pre_norm, group_keys, group_stats, value_stats
from .services import free_port


def _worker(rank: int, world: int, port: int, workdir: str, all_ranks: bool) -> None:
    os.chdir(workdir)
    os.environ.pop("RANK", None)  # the rank must come from torch.distributed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        import advmon

        monitor = advmon.Monitor("dist", all_ranks=all_ranks)
        assert monitor.rank == rank
        monitor.observe(rewards=torch.tensor([float(rank), 1.0]))
        monitor.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(tmp_path, all_ranks: bool) -> list[str]:
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path), all_ranks), nprocs=2, join=True)
    return sorted(p.name for p in (tmp_path / "advmon-runs").iterdir())


def test_rank_zero_reports_alone(tmp_path):
    assert _run(tmp_path, all_ranks=False) == ["dist.jsonl"]


def test_every_rank_reports_when_asked(tmp_path):
    import advmon

    assert _run(tmp_path, all_ranks=True) == ["dist.jsonl", "dist.rank1.jsonl"]
    (record,) = advmon.read_jsonl(tmp_path / "advmon-runs" / "dist.rank1.jsonl")
    assert record.metrics["rewards/min"] == 1.0


# --------------------------------------------------------------------------- reduce="ranks"


def _shard_batch(step: int, world: int, rank: int | None):
    """A step's batch (groups of 4, token mask), or one rank's contiguous shard of it."""
    generator = torch.Generator().manual_seed(step)
    prompts, group, tokens = 8 * world, 4, 9000  # every chunk's dense output is sketched (> 65,536 tokens)
    rewards = (torch.rand(prompts * group, generator=generator) < 0.5).float()
    rewards[5] = float("nan")
    lengths = torch.randint(tokens // 2, tokens + 1, (prompts * group,), generator=generator)
    mask = (torch.arange(tokens) < lengths[:, None]).float()
    ids = torch.arange(prompts).repeat_interleave(group)
    if rank is None:
        return ids, rewards, mask
    rows = slice(rank * len(rewards) // world, (rank + 1) * len(rewards) // world)
    return ids[rows], rewards[rows], mask[rows]


def _estimator(prompt_ids, rewards, mask):
    groups = rewards.view(-1, 4)
    centered = (groups - groups.nanmean(dim=1, keepdim=True)).reshape(-1, 1)
    return centered * mask  # dense (not an expand view), so large parts take the sketched path


def _reduce_worker(rank: int, world: int, port: int, workdir: str) -> None:
    os.chdir(workdir)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        import advmon

        monitor = advmon.Monitor("ranks", reduce="ranks", reward_range=(0.0, 1.0))
        watched = monitor.watch(_estimator)
        for step in range(2):
            ids, rewards, mask = _shard_batch(step, world, rank)
            with monitor.step(step):
                half = len(rewards) // 2 // 4 * 4  # two chunks per rank and step
                watched(ids[:half], rewards[:half], mask[:half])
                watched(ids[half:], rewards[half:], mask[half:])
        with monitor.step(2):  # a step where only rank 0 calls: the others still take part
            if rank == 0:
                ids, rewards, mask = _shard_batch(2, world, 0)
                watched(ids, rewards, mask)
        monitor.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _single_process_records(world: int, tmp_path) -> list:
    import advmon

    from .conftest import ListSink

    sink = ListSink()
    records = sink.records
    monitor = advmon.Monitor("single", sinks=[sink], reward_range=(0.0, 1.0))
    watched = monitor.watch(_estimator)
    for step in range(2):
        with monitor.step(step):
            watched(*_shard_batch(step, world, None))
    with monitor.step(2):
        watched(*_shard_batch(2, world, 0))
    monitor.close()
    return records


import pytest  # noqa: E402


@pytest.mark.parametrize("world", [2, 4])
def test_reduce_ranks_equals_one_process_on_the_whole_batch(tmp_path, world):
    import math

    import advmon

    mp.spawn(_reduce_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    assert sorted(p.name for p in (tmp_path / "advmon-runs").iterdir()) == ["ranks.jsonl"]  # rank 0 alone writes
    merged = advmon.read_jsonl(tmp_path / "advmon-runs" / "ranks.jsonl")
    single = _single_process_records(world, tmp_path)
    assert [r.step for r in merged] == [0, 1, 2]
    for got, expected in zip(merged, single):
        assert got.metrics["advantages/post_norm/count"] > 65_536  # each chunk (>= 16 rows x 4,500 tokens) is sketched
        for key, value in expected.metrics.items():
            if key.startswith("advmon/"):
                continue
            other = got.metrics[key]
            if math.isnan(value):
                assert math.isnan(other), key
            elif key.endswith(("count", "p01", "p10", "p50", "p90", "p99", "min", "max")) or key.startswith("groups/"):
                assert other == value, key  # counts, extrema, percentiles and groups: exactly
            else:
                assert other == pytest.approx(value, rel=1e-12, abs=1e-12), key
    # And both are right: the merged record against NumPy on the whole batch (rank 0's shard alone at step 2).
    for got in merged:
        ids, rewards, mask = _shard_batch(got.step, world, None if got.step < 2 else 0)
        keys = group_keys(ids.numpy())
        advantages = _estimator(ids, rewards, mask).numpy()
        reward_stats = value_stats(rewards.numpy())
        assert_stats_close(got.metrics, {k: reward_stats[k] for k in REWARD_KEYS}, "rewards/")
        assert_stats_close(got.metrics, value_stats(derived_pre_norm(rewards.numpy(), keys)), "advantages/pre_norm/")
        assert_stats_close(got.metrics, value_stats(advantages, mask.numpy()), "advantages/post_norm/",
                           exact_percentiles=False)
        for key, value in group_stats(rewards.numpy(), keys, reward_range=(0.0, 1.0)).items():
            assert got.metrics[key] == value or math.isnan(value) and math.isnan(got.metrics[key]), key
