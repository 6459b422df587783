"""Only global rank 0 reports: two processes with torch.distributed (gloo, CPU)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

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
