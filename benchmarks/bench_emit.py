"""What emission costs the training thread, and how many records the real sinks take.

1. A sink that takes 100 ms per record: the median time a watched call takes
   with it, minus the median with no sink at all (the statistics themselves),
   interleaved in one run. Goal: under 1 ms.
2. All real sinks at once (JSONL, Prometheus scrape endpoint, offline W&B, MLflow
   on sqlite): records per second sustained from the first record to the moment
   every sink has taken the last one.

3. The training thread's cost per record with JSONL, W&B (offline), MLflow (a local
   ``mlflow server``) and Prometheus all enabled, against JSONL alone: blocks of
   records alternate between the two monitors (ABAB), medians per record. Goal:
   within 1.2x.
4. MLflow draining a backlog to a local ``mlflow server`` (sqlite store): records/s.
   Goal: >= 1,000. And what the server itself takes: one ``log_batch`` of 1,000
   metrics, shaped as advmon's records (47 keys x 21 steps) and two other ways.
5. The store without the server: MLflow's own ``SqlAlchemyStore.log_batch`` called
   in-process (no HTTP), on sqlite, and with ``--postgres`` also on a throwaway
   PostgreSQL cluster (needs the Debian ``postgresql`` package, ``psycopg2-binary``
   and root, which starts it as the ``postgres`` user on a free loopback port). This
   is the ceiling for any MLflow client on these machines.

Usage: python benchmarks/bench_emit.py [--calls N] [--records N] [--postgres]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

import advmon


class SlowSink(advmon.Sink):
    """A backend that takes 100 ms per record."""

    name = "slow"

    def write(self, record):
        time.sleep(0.1)


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 1000, (64, 16), generator=g).repeat_interleave(8, dim=0)
    rewards = torch.randint(0, 2, (512,), generator=g).float()
    mask = (torch.arange(256) < torch.randint(1, 257, (512, 1), generator=g)).float()
    return prompts, rewards, mask


def grpo(prompt_ids, rewards, mask):
    groups = rewards.view(-1, 8)
    advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)
    return advantages.reshape(-1, 1).expand(mask.shape)


def training_thread_cost(calls: int) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", advmon.AdvmonWarning)  # no JSONL on purpose
        bare = advmon.Monitor("bench-bare", sinks=[])
        slow = advmon.Monitor("bench-slow", sinks=[SlowSink()], queue_size=calls + 10)
    watched = {"bare": bare.watch(grpo), "slow": slow.watch(grpo)}
    inputs = batch()
    times: dict[str, list[float]] = {"bare": [], "slow": []}
    for name in watched:
        watched[name](*inputs)  # warm up
    for _ in range(calls):
        for name, fn in watched.items():  # interleaved: both see the same machine noise
            start = time.perf_counter()
            fn(*inputs)
            times[name].append(time.perf_counter() - start)
    bare_median, slow_median = (statistics.median(times[n]) for n in ("bare", "slow"))
    queued = sum(len(w._queue) for w in slow._delivery.workers)
    bare.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", advmon.AdvmonWarning)  # the slow sink's backlog, on purpose
        slow.close(timeout=0.5)
    added = slow_median - bare_median
    return [
        f"training thread, {calls} watched calls each (B=512, T=256), interleaved:",
        f"  no sink                          median {bare_median * 1e3:7.3f} ms  (the statistics)",
        f"  a 100 ms/record sink             median {slow_median * 1e3:7.3f} ms  ({queued} records still queued)",
        f"  added by emission                       {added * 1e3:7.3f} ms  (goal < 1 ms: {'met' if added < 1e-3 else 'NOT met'})",
    ]


SINK_NAMES = ("jsonl", "prometheus", "wandb (offline)", "mlflow (sqlite)")


def _real_sink(name: str, workdir: Path) -> advmon.Sink:
    from advmon.sinks.mlflow import MlflowSink
    from advmon.sinks.prometheus import PrometheusSink
    from advmon.sinks.wandb import WandbSink

    if name == "jsonl":
        return advmon.JsonlSink(workdir / "run.jsonl")
    if name == "prometheus":
        return PrometheusSink(port=0)
    if name.startswith("wandb"):
        return WandbSink(project="advmon-bench", dir=str(workdir))
    return MlflowSink(f"sqlite:///{workdir / 'mlflow.db'}")


def _throughput(run: str, sinks: list, records: int) -> tuple[float, float]:
    """(records/s produced on the training thread, records/s delivered to every sink)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", advmon.AdvmonWarning)  # a lone sink without JSONL, on purpose
        monitor = advmon.Monitor(run, sinks=sinks, queue_size=records + 10)
    rewards = torch.randint(0, 2, (512,)).float()
    monitor.observe(rewards=rewards, group_size=8)  # start runs and servers outside the timing
    monitor.flush(timeout=120)
    started = time.perf_counter()
    for _ in range(records):
        monitor.observe(rewards=rewards, advantages=rewards - rewards.mean(), group_size=8)
    produced = time.perf_counter() - started
    monitor.flush(timeout=600)
    delivered = time.perf_counter() - started
    monitor.close()
    return records / produced, records / delivered


def real_sinks_throughput(records: int) -> list[str]:
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    lines = [f"real sinks, {records} records each (B=512 rewards and advantages, 47 keys), records/s:"]
    lines.append(f"  {'sink':28} {'produced':>9} {'delivered':>10}")
    for name in SINK_NAMES:
        sink = _real_sink(name, Path(tempfile.mkdtemp(prefix="advmon-bench-")))
        produced, delivered = _throughput(f"bench-{name.split()[0]}", [sink], records)
        lines.append(f"  {name:28} {produced:9.0f} {delivered:10.0f}")
    workdir = Path(tempfile.mkdtemp(prefix="advmon-bench-"))
    produced, delivered = _throughput("bench-all", [_real_sink(name, workdir) for name in SINK_NAMES], records)
    lines.append(f"  {'all four at once':28} {produced:9.0f} {delivered:10.0f}")
    return lines


def _free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def mlflow_server(workdir: Path):
    """A real ``mlflow server`` on 127.0.0.1 with a sqlite store; yields its URL."""
    port = _free_port()
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    process = subprocess.Popen(
        [mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}", "--default-artifact-root", str(workdir / "a")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.5)
    try:
        yield url
    finally:
        os.killpg(process.pid, 15)
        process.wait()


def _record_inputs():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 2, (512,), generator=g).float()
    return rewards, rewards - rewards.mean()


def all_sinks_training_cost(records: int, url: str) -> list[str]:
    """Per-record cost on the training thread: all four sinks against JSONL alone."""
    from advmon.sinks.mlflow import MlflowSink
    from advmon.sinks.prometheus import PrometheusSink
    from advmon.sinks.wandb import WandbSink

    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    workdir = Path(tempfile.mkdtemp(prefix="advmon-bench-"))
    jsonl_only = advmon.Monitor("bench-jsonl", sinks=[advmon.JsonlSink(workdir / "a.jsonl")], queue_size=records + 10)
    everything = advmon.Monitor(
        "bench-everything",
        sinks=[advmon.JsonlSink(workdir / "b.jsonl"), WandbSink(project="advmon-bench", dir=str(workdir)),
               MlflowSink(url), PrometheusSink(port=0)],
        queue_size=records + 10,
    )
    rewards, advantages = _record_inputs()
    for monitor in (jsonl_only, everything):  # runs, servers and files start outside the timing
        monitor.observe(rewards=rewards, advantages=advantages, group_size=8)
        monitor.flush(timeout=120)
    times: dict[str, list[float]] = {"jsonl": [], "all": []}
    block = 20
    for _ in range(max(1, records // (2 * block))):
        for name, monitor in (("jsonl", jsonl_only), ("all", everything)):
            for _ in range(block):
                start = time.perf_counter()
                monitor.observe(rewards=rewards, advantages=advantages, group_size=8)
                times[name].append(time.perf_counter() - start)
    jsonl_only.close()
    everything.close(timeout=120)
    medians = {name: statistics.median(values) for name, values in times.items()}
    means = {name: statistics.fmean(values) for name, values in times.items()}
    ratio = medians["all"] / medians["jsonl"]
    return [
        f"training thread per record, {len(times['all'])} records each, blocks of {block} alternating:",
        f"  JSONL only                  median {medians['jsonl'] * 1e3:6.3f} ms   mean {means['jsonl'] * 1e3:6.3f} ms",
        f"  JSONL+W&B+MLflow+Prometheus median {medians['all'] * 1e3:6.3f} ms   mean {means['all'] * 1e3:6.3f} ms",
        f"  ratio of medians {ratio:.2f}x (goal <= 1.2x: {'met' if ratio <= 1.2 else 'NOT met'}); "
        f"ratio of means {means['all'] / means['jsonl']:.2f}x",
    ]


def mlflow_server_drain(records: int, url: str) -> list[str]:
    from advmon.sinks.mlflow import MlflowSink

    produced, delivered = _throughput("bench-mlflow-server", [MlflowSink(url)], records)
    return [f"MLflow to a local mlflow server: {delivered:.0f} records/s delivered "
            f"(goal >= 1000: {'met' if delivered >= 1000 else 'NOT met'}; produced at {produced:.0f}/s)"]


def mlflow_server_write_rate(url: str, repeats: int = 5) -> list[str]:
    """The server's own limit: metrics/s for 1,000-metric ``log_batch`` calls of three shapes."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(url)
    run_id = client.create_run(client.get_experiment_by_name("Default").experiment_id).info.run_id
    lines = [f"the mlflow server itself, 1,000-metric log_batch calls, median of {repeats}:"]
    for shape, (keys, steps) in enumerate(((47, 21), (1000, 1), (10, 100))):
        seconds = []
        for repeat in range(repeats):  # new steps in every call: a backlog of fresh records, never a rewrite
            first_step = (shape * repeats + repeat) * steps
            metrics = [Metric(f"k{k}", 1.0, 0, first_step + s) for s in range(steps) for k in range(keys)][:1000]
            started = time.perf_counter()
            client.log_batch(run_id, metrics=metrics)
            seconds.append(time.perf_counter() - started)
        lines.append(_rate_line(keys, steps, statistics.median(seconds)))
    return lines


def _rate_line(keys: int, steps: int, seconds: float) -> str:
    records = f"  = {1000 / seconds / keys:5.0f} records/s" if keys == 47 else ""
    return f"  {keys:4d} keys x {steps:3d} steps  {seconds * 1e3:7.1f} ms per call  {1000 / seconds:7.0f} metrics/s" + records


def store_write_rate(uri: str, repeats: int = 5) -> list[str]:
    """MLflow's store called in-process (no server, no HTTP): metrics/s for 1,000-metric batches."""
    from mlflow.entities import Metric
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(uri, tempfile.mkdtemp(prefix="advmon-artifacts-"))
    experiment = store.get_experiment_by_name("Default").experiment_id
    run_id = store.create_run(experiment, "bench", int(time.time() * 1000), [], "bench").info.run_id
    lines = [f"the {uri.split(':')[0]} store in-process (no server), 1,000-metric log_batch calls, median of {repeats}:"]
    for shape, (keys, steps) in enumerate(((47, 21), (1000, 1))):
        seconds = []
        for repeat in range(repeats):  # new steps in every call: a backlog of fresh records, never a rewrite
            first_step = (shape * repeats + repeat) * steps
            metrics = [Metric(f"k{k}", 1.0, 0, first_step + s) for s in range(steps) for k in range(keys)][:1000]
            started = time.perf_counter()
            store.log_batch(run_id, metrics=metrics, params=[], tags=[])
            seconds.append(time.perf_counter() - started)
        lines.append(_rate_line(keys, steps, statistics.median(seconds)))
    return lines


@contextmanager
def throwaway_postgres():
    """A PostgreSQL cluster in a temporary directory on a free loopback port; yields its SQLAlchemy URI."""
    import glob
    import shutil

    import psycopg2  # noqa: F401  (the driver MLflow's store needs; fail before starting anything)

    binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not binaries:
        raise SystemExit("--postgres needs the Debian postgresql package (apt-get install postgresql)")
    bin_dir = Path(binaries[-1])
    root = Path(tempfile.mkdtemp(prefix="advmon-pg-"))
    shutil.chown(root, "postgres")
    port = _free_port()

    def as_postgres(*command: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True)

    started = False
    try:
        # Trust authentication: a throwaway database on loopback that lives for seconds.
        as_postgres(str(bin_dir / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", "postgres")
        as_postgres(str(bin_dir / "pg_ctl"), "-D", str(root / "data"), "-w", "-l", str(root / "log"), "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start")
        started = True
        as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "mlflow")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/mlflow"
    finally:
        if started:
            as_postgres(str(bin_dir / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--postgres", action="store_true", help="also time the store on a throwaway PostgreSQL")
    args = parser.parse_args()
    print(f"bench_emit: torch {torch.__version__}, {torch.get_num_threads()} threads, medians")
    print("\n".join(training_thread_cost(args.calls)))
    print("\n".join(real_sinks_throughput(args.records)))
    with mlflow_server(Path(tempfile.mkdtemp(prefix="advmon-mlflow-"))) as url:
        print("\n".join(all_sinks_training_cost(args.records, url)))
        print("\n".join(mlflow_server_drain(max(args.records, 1000), url)))
        print("\n".join(mlflow_server_write_rate(url)))
    print("\n".join(store_write_rate(f"sqlite:///{tempfile.mkdtemp(prefix='advmon-store-')}/mlflow.db")))
    if args.postgres:
        with throwaway_postgres() as uri:
            print("\n".join(store_write_rate(uri)))


if __name__ == "__main__":
    main()
