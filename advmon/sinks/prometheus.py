"""Prometheus: a scrape endpoint or a Pushgateway, through one custom collector.

The metric names below are the contract the generated dashboards and alerts use.
Every series carries a non-empty ``run`` label: a sink serves nothing before it belongs to a run (made
before its Monitor, it is taken over at ``attach``). Gauges show the latest record; counters
accumulate over records and exist at 0 from the start, so that ``increase()``
sees the first increment.

Every metric, with its type and labels, is in :data:`METRICS`, the one list: docs/sinks.md's table is held
to it, and it to what the collector serves, by tests/test_contracts.py. ``advmon_zero_std_groups`` and
``advmon_comparable_groups`` are the group ratios' numerator and denominator (a fleet's ratio is a sum over a sum).

A run's state (docs/alerts.md, "Run state"), exposed from the start: ``advmon_run_finished``
(0 while the run runs, 1 once its monitor closed cleanly) and
``advmon_heartbeat_timestamp_seconds`` (when advmon last showed the run alive: the time of
this scrape, or of this push; the Pushgateway sink pushes at least every
``heartbeat_seconds`` even without records). The last record's time is not a sign of
life: a hung run is alive without records, a crashed one is gone without finishing.

Drill-down (docs/drilldown.md): the ``advmon_slice_*`` and ``advmon_reward_function_*`` gauges, for the
slices and reward functions of the last record. Their cardinality is bounded: at most
``Monitor(max_slices=16)`` slices plus ``other`` per run, and the reward functions a trainer has; a name longer than 64
characters is cut to its start and a hash (docs/fleet.md has the series budget). The non-finite counters
carry an OpenMetrics exemplar naming the worst group of the latest step that added
to them (``group``, and ``slice`` when known), for Prometheus's exemplar storage.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from advmon.errors import closing_on_error
from advmon.record import Record, abs_max
from advmon.redact import redact_url, remember_secret, split_credentials
from advmon.sinks.base import Sink, require

__all__ = ["METRICS", "AdvmonCollector", "PrometheusSink", "PushgatewaySink"]

STAGES = ("pre_norm", "post_norm")
PERCENTILES = (("1", "p01"), ("10", "p10"), ("50", "p50"), ("90", "p90"), ("99", "p99"))
_NONFINITE_STAGES = (("reward", "rewards"), ("pre_norm", "advantages/pre_norm"), ("post_norm", "advantages/post_norm"))

#: Every metric advmon serves: its name as exposed -> (type, labels besides ``run``). The contract dashboards and
#: alerts read; docs/sinks.md's table and the collector are held to it (tests/test_contracts.py).
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{f"advmon_advantage_{stat}": ("gauge", ("stage",)) for stat in ("mean", "std", "min", "max", "abs_mean")},
    "advmon_advantage_percentile": ("gauge", ("stage", "percentile")),
    "advmon_advantage_abs_max": ("gauge", ("stage",)),
    "advmon_advantage_bound_ratio": ("gauge", ()),
    "advmon_normalization_info": ("gauge", ("kind", "source", "observed")),
    **{f"advmon_reward_{stat}": ("gauge", ()) for stat in ("mean", "std", "min", "max")},
    "advmon_zero_std_group_ratio": ("gauge", ()),
    "advmon_groups": ("gauge", ()),
    "advmon_comparable_groups": ("gauge", ()),
    "advmon_zero_std_groups": ("gauge", ()),
    "advmon_group_max_size": ("gauge", ()),
    "advmon_group_bound_size": ("gauge", ()),
    "advmon_group_all_fail_ratio": ("gauge", ()),
    "advmon_group_all_pass_ratio": ("gauge", ()),
    "advmon_step": ("gauge", ()),
    "advmon_last_update_timestamp_seconds": ("gauge", ()),
    "advmon_run_finished": ("gauge", ()),
    "advmon_heartbeat_timestamp_seconds": ("gauge", ()),
    "advmon_nonfinite_values_total": ("counter", ("stage", "kind")),
    **{name: ("gauge", ("slice",)) for name in (
        "advmon_slice_rewards", "advmon_slice_reward_mean", "advmon_slice_zero_std_group_ratio",
        "advmon_slice_advantage_mean", "advmon_slice_advantage_abs_max")},
    "advmon_slice_reward_nonfinite": ("gauge", ("slice", "kind")),
    "advmon_reward_function_mean": ("gauge", ("function",)),
    "advmon_reward_function_nonfinite": ("gauge", ("function", "kind")),
    "advmon_updates_total": ("counter", ()),
    "advmon_internal_errors_total": ("counter", ()),
    "advmon_sink_errors_total": ("counter", ("sink",)),
    "advmon_dropped_records_total": ("counter", ("sink",)),
}


class AdvmonCollector:
    """A prometheus-client collector over the latest record of one run; nothing until it has a run's name.

    Example:
        >>> from prometheus_client import CollectorRegistry, generate_latest
        >>> collector = AdvmonCollector("run-a", sink_names=["jsonl"])
        >>> registry = CollectorRegistry()
        >>> registry.register(collector)
        >>> b'advmon_updates_total{run="run-a"} 0.0' in generate_latest(registry)
        True
    """

    def __init__(self, run: str, sink_names: Sequence[str] = ()) -> None:
        self.run = run
        self._lock = threading.Lock()
        self._latest: Record | None = None
        self._nonfinite = {(stage, kind): 0.0 for stage, _ in _NONFINITE_STAGES for kind in ("nan", "inf")}
        self._updates = 0.0
        self._sinks = dict.fromkeys(sink_names)  # ordered set of sink names
        #: (stage, kind) -> (exemplar labels, value, time): the worst group of the latest step that counted there.
        self._exemplars: dict[tuple[str, str], tuple[dict[str, str], float, float]] = {}
        self._finished = False

    def finish(self) -> None:
        """Mark the run finished (its monitor closed cleanly): ``advmon_run_finished`` becomes 1."""
        with self._lock:
            self._finished = True

    def continue_from(self, counters: dict[tuple[str, tuple], float]) -> None:
        """Add counts already published for this run (a continued run) to the accumulated counters."""
        with self._lock:
            self._updates += counters.get(("advmon_updates", ()), 0.0)
            for (stage, kind) in self._nonfinite:
                key = ("advmon_nonfinite_values", (("kind", kind), ("stage", stage)))
                self._nonfinite[(stage, kind)] += counters.get(key, 0.0)

    def set_sink_names(self, names: Sequence[str]) -> None:
        with self._lock:
            self._sinks.update(dict.fromkeys(names))

    def update(self, record: Record) -> None:
        with self._lock:
            self._latest = record
            self._updates += 1
            for (stage, kind), value in self._nonfinite.items():
                prefix = dict(_NONFINITE_STAGES)[stage]
                count = record.metrics.get(f"{prefix}/{kind}_count", math.nan)
                if math.isfinite(count):
                    self._nonfinite[(stage, kind)] = value + count
                    worst = _worst_group(record, stage, kind) if count > 0 else None
                    if worst is not None:
                        self._exemplars[(stage, kind)] = (worst, count, record.time)
            for key in record.metrics:
                for family in ("advmon/sink_errors/", "advmon/dropped_records/"):
                    if key.startswith(family):
                        self._sinks.setdefault(key[len(family) :])

    def describe(self) -> Iterator[Any]:
        return iter(())  # families depend on the record: let the registry call collect()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            record, nonfinite, updates, sinks = self._latest, dict(self._nonfinite), self._updates, list(self._sinks)
            exemplars, finished = dict(self._exemplars), self._finished
        run = self.run
        if not run:
            # Not a run's yet (a sink made before its Monitor): a series with run="" would be a run that
            # never was, and vanishing unfinished once the monitor takes the sink over, it would page as crashed.
            return
        metrics = record.metrics if record is not None else {}

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Any:
            return CounterMetricFamily(name, doc, labels=["run", *labels])

        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Any:
            return GaugeMetricFamily(name, doc, labels=["run", *labels])

        from prometheus_client.samples import Exemplar

        family = counter("advmon_nonfinite_values", "NaN and Inf values seen, by stage and kind", ["stage", "kind"])
        for (stage, kind), value in nonfinite.items():
            found = exemplars.get((stage, kind))
            exemplar = Exemplar(found[0], found[1], found[2]) if found is not None else None
            family.add_metric([run, stage, kind], value, exemplar=exemplar)
        yield family
        family = counter("advmon_updates", "Records advmon emitted for this run")
        family.add_metric([run], updates)
        yield family
        family = counter("advmon_internal_errors", "Problems advmon met (see advmon/internal_errors)")
        family.add_metric([run], metrics.get("advmon/internal_errors", 0.0))
        yield family
        for name, key, doc in (
            ("advmon_sink_errors", "advmon/sink_errors", "Records a sink failed to take after retries"),
            ("advmon_dropped_records", "advmon/dropped_records", "Records dropped because a sink's queue was full"),
        ):
            family = counter(name, doc, ["sink"])
            for sink in sinks:
                family.add_metric([run, sink], metrics.get(f"{key}/{sink}", 0.0))
            yield family
        family = gauge("advmon_run_finished", "1 once the run's monitor closed cleanly, 0 while it runs")
        family.add_metric([run], 1.0 if finished else 0.0)
        yield family
        family = gauge("advmon_heartbeat_timestamp_seconds",
                       "Unix time advmon last showed the run alive (this scrape, or this push)")
        family.add_metric([run], time.time())
        yield family
        if record is None:
            return
        for stat in ("mean", "std", "min", "max", "abs_mean"):
            family = gauge(f"advmon_advantage_{stat}", f"Advantage {stat.replace('_', ' ')} of the last step", ["stage"])
            for stage in STAGES:
                family.add_metric([run, stage], metrics.get(f"advantages/{stage}/{stat}", math.nan))
            yield family
        family = gauge("advmon_advantage_abs_max", "Largest |advantage| of the last step", ["stage"])
        for stage in STAGES:
            family.add_metric([run, stage], abs_max(metrics, stage))
        yield family
        family = gauge("advmon_advantage_bound_ratio",
                       "Largest |advantage| of the last step over what its normalization allows (bound_factor fires)")
        family.add_metric([run], metrics.get("advantages/bound_ratio", math.nan))
        yield family
        if record.normalization is not None:
            family = gauge("advmon_normalization_info", "How the last step's advantages were normalized: its kind "
                           "(declared or inferred) and what its data look like", ["kind", "source", "observed"])
            family.add_metric([run, record.normalization, record.normalization_source or "",
                               record.normalization_observed or ""], 1.0)
            yield family
        family = gauge("advmon_advantage_percentile", "Advantage percentiles of the last step", ["stage", "percentile"])
        for stage in STAGES:
            for label, key in PERCENTILES:
                family.add_metric([run, stage, label], metrics.get(f"advantages/{stage}/{key}", math.nan))
        yield family
        for stat in ("mean", "std", "min", "max"):
            family = gauge(f"advmon_reward_{stat}", f"Reward {stat} per sequence in the last step")
            family.add_metric([run], metrics.get(f"rewards/{stat}", math.nan))
            yield family
        for name, key, doc in (
            ("advmon_zero_std_group_ratio", "groups/zero_std_fraction", "Fraction of groups whose rewards are all equal"),
            ("advmon_groups", "groups/count", "Prompt groups in the last step"),
            ("advmon_comparable_groups", "groups/comparable_count",
             "Groups with two finite rewards or more in the last step: the denominator of the group ratios"),
            ("advmon_zero_std_groups", "groups/zero_std_count", "Groups whose rewards are all equal in the last step"),
            ("advmon_group_max_size", "groups/max_size", "Samples in the largest prompt group of the last step"),
            ("advmon_group_bound_size", "groups/bound_size",
             "The G of the group bound G/sqrt(G-1) where the last step was judged by it (0: another bound)"),
            ("advmon_group_all_fail_ratio", "groups/all_low_fraction", "Fraction of groups whose rewards are all <= the low end"),
            ("advmon_group_all_pass_ratio", "groups/all_high_fraction", "Fraction of groups whose rewards are all >= the high end"),
        ):
            family = gauge(name, doc)
            family.add_metric([run], metrics.get(key, math.nan))
            yield family
        yield from _drilldown_families(run, metrics, gauge)
        family = gauge("advmon_step", "Training step of the last record")
        family.add_metric([run], float(record.step))
        yield family
        family = gauge("advmon_last_update_timestamp_seconds", "Unix time of the last record")
        family.add_metric([run], record.time)
        yield family


#: (gauge, record key under slices/<label>/, help)
_SLICE_GAUGES = (
    ("advmon_slice_rewards", "rewards/count", "Sequences of the slice in the last step"),
    ("advmon_slice_reward_mean", "rewards/mean", "Mean finite reward of the slice in the last step"),
    ("advmon_slice_zero_std_group_ratio", "groups/zero_std_fraction",
     "Fraction of the slice's groups whose rewards are all equal"),
    ("advmon_slice_advantage_mean", "advantages/post_norm/mean", "Mean post-norm advantage of the slice"),
    ("advmon_slice_advantage_abs_max", "advantages/post_norm/abs_max", "Largest |post-norm advantage| of the slice"),
)
#: OpenMetrics allows 128 characters of exemplar label names and values together.
_EXEMPLAR_LABEL_CHARACTERS = 128


def _labelled(metrics: dict[str, float], family: str, keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{label: {key: value}}`` of the record's ``<family>/<label>/<key>`` metrics."""
    found: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if not key.startswith(family + "/"):
            continue
        label, _, rest = key[len(family) + 1 :].partition("/")
        if rest in keys:
            found.setdefault(_bounded_label(label), {})[rest] = value
    return found


#: Characters of a ``slice`` or ``function`` label value. The names come from the trainer's data (a data
#: source, a reward function): bounded in number by ``max_slices``, but not in length, and a receiver
#: with a label length limit (Mimir, ``label_value_length_limit``) refuses a series or a scrape beyond it.
_MAX_LABEL_VALUE = 64


def _bounded_label(value: str) -> str:
    """``value`` itself up to :data:`_MAX_LABEL_VALUE` characters; else its start, ``~`` and 8 hex digits of its
    hash, so that two long names with one start stay two series.

    Example:
        >>> _bounded_label("openai_gsm8k"), len(_bounded_label("x" * 500)), _bounded_label("x" * 500)[-9]
        ('openai_gsm8k', 64, '~')
    """
    if len(value) <= _MAX_LABEL_VALUE:
        return value
    import hashlib

    digest = hashlib.blake2b(value.encode(errors="replace"), digest_size=4).hexdigest()
    return f"{value[: _MAX_LABEL_VALUE - 9]}~{digest}"


def _drilldown_families(run: str, metrics: dict[str, float], gauge: Any) -> Iterator[Any]:
    slices = _labelled(metrics, "slices", [key for _, key, _ in _SLICE_GAUGES] + ["rewards/nan_count", "rewards/inf_count"])
    if slices:
        for name, key, doc in _SLICE_GAUGES:
            family = gauge(name, doc, ["slice"])
            for label, values in sorted(slices.items()):
                family.add_metric([run, label], values.get(key, math.nan))
            yield family
        family = gauge("advmon_slice_reward_nonfinite", "NaN and Inf rewards of the slice in the last step",
                       ["slice", "kind"])
        for label, values in sorted(slices.items()):
            for kind in ("nan", "inf"):
                family.add_metric([run, label, kind], values.get(f"rewards/{kind}_count", math.nan))
        yield family
    functions = _labelled(metrics, "rewards", ["mean", "nan_count", "inf_count"])
    if functions:
        family = gauge("advmon_reward_function_mean", "Mean finite reward of each reward function", ["function"])
        for name, values in sorted(functions.items()):
            family.add_metric([run, name], values.get("mean", math.nan))
        yield family
        family = gauge("advmon_reward_function_nonfinite",
                       "NaN (a function that returned None) and Inf rewards of each function in the last step",
                       ["function", "kind"])
        for name, values in sorted(functions.items()):
            for kind in ("nan", "inf"):
                family.add_metric([run, name, kind], values.get(f"{kind}_count", math.nan))
        yield family


def _worst_group(record: Record, stage: str, kind: str) -> dict[str, str] | None:
    """Exemplar labels naming the record's worst group behind a stage's non-finite values."""
    for entry in record.exemplars:
        if stage == "reward":
            hit = entry.get(f"reward_{kind}_count", 0) > 0
        elif stage == "post_norm":
            hit = entry.get("advantage_nonfinite_samples", 0) > 0
        else:
            hit = entry.get("reason") in ("nonfinite_rewards", "nonfinite_advantages")
        if hit:
            labels = {"group": str(entry["group"])}
            if entry.get("slice") is not None:
                labels["slice"] = str(entry["slice"])
            return _within_exemplar_limit(labels)
    return None


def _within_exemplar_limit(labels: dict[str, str]) -> dict[str, str]:
    """Shorten the group key so that the labels fit OpenMetrics's 128 characters."""
    others = sum(len(k) + len(v) for k, v in labels.items() if k != "group")
    room = _EXEMPLAR_LABEL_CHARACTERS - others - len("group")
    if len(labels["group"]) > room:
        labels["group"] = labels["group"][: max(room - 1, 1)] + "~"
    return labels


class _CollectorSink(Sink):
    """A sink whose state is an :class:`AdvmonCollector` in a registry."""

    def __init__(self, run: str, registry: Any = None) -> None:
        self._client = require("prometheus_client", "prometheus")
        self.collector = AdvmonCollector(run)
        self.registry = registry if registry is not None else self._client.CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._failed = False

    def attach(self, run: str, sink_names: Sequence[str]) -> None:
        """Called by the monitor: the run label and the sinks whose counters start at 0."""
        self.collector.run = run
        self.collector.set_sink_names(sink_names)

    def run_failed(self) -> None:
        """Called by the monitor before :meth:`close` when an exception is closing the run (the close may then
        run on another thread, which cannot see it): the run is left unfinished, as a crashed one."""
        self._failed = True


class _Exporter:
    """One HTTP endpoint of a process, shared by the monitors that ask for its address.

    Its registry holds one collector that merges the monitors' families by name: two
    collectors each yielding ``advmon_updates_total`` would expose the family twice,
    which Prometheus refuses ("second TYPE line").

    It also notes when a scraper (a request with Prometheus's
    ``X-Prometheus-Scrape-Timeout-Seconds`` header: Prometheus, its agent, vmagent) has
    read the endpoint, so a closing run can wait until its finished state was scraped.
    """

    def __init__(self, server: Any, registry: Any) -> None:
        self.server = server
        self.registry = registry
        self.members: list[AdvmonCollector] = []
        registry.register(self)
        self._scraped = threading.Condition()
        self._scrape_starts: list[float] = []  # monotonic start of the last two scrapes whose answer went out

    @classmethod
    def serve(cls, host: str, port: int, registry: Any) -> _Exporter:
        """Serve ``registry`` on ``host:port`` from a daemon thread (prometheus-client's WSGI app and server)."""
        import socket
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:  # a request log line per scrape is noise in a trainer's log
                pass

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        exporter: _Exporter | None = None
        app = make_wsgi_app(registry)

        def counted(environ: dict, start_response: Any) -> Any:
            started = time.monotonic()
            body = app(environ, start_response)
            if exporter is None or "HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS" not in environ:
                return body
            return _AfterResponse(body, lambda: exporter.scraped(started))

        server = make_server(host, port, counted, Server, handler_class=Quiet)
        exporter = cls(server, registry)
        threading.Thread(target=server.serve_forever, name="advmon-prometheus-endpoint", daemon=True).start()
        return exporter

    def scraped(self, started: float) -> None:
        """A scrape that started at ``started`` (monotonic) has been answered."""
        with self._scraped:
            self._scrape_starts = [*self._scrape_starts, started][-2:]
            self._scraped.notify_all()

    def await_scrape_after(self, moment: float, longest: float) -> bool:
        """Wait until a scrape that started after ``moment`` was answered: at most ``longest`` seconds, and,
        once two scrapes were seen, no later than two scrape intervals and a second after the last one (a
        scraper that went away is not waited for). ``True`` if one was, or if no scraper ever came (nothing
        to tell)."""
        with self._scraped:
            if not self._scrape_starts:
                return True
            deadline = time.monotonic() + longest
            if len(self._scrape_starts) == 2:
                interval = self._scrape_starts[1] - self._scrape_starts[0]
                deadline = min(deadline, self._scrape_starts[1] + 2 * interval + 1.0)
            while self._scrape_starts[-1] <= moment:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._scraped.wait(remaining)
            return True

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        merged: dict[str, Any] = {}
        for member in list(self.members):
            for family in member.collect():
                known = merged.get(family.name)
                if known is None:
                    merged[family.name] = family
                else:
                    known.samples.extend(family.samples)
        return iter(merged.values())


class _AfterResponse:
    """A WSGI body that calls ``done`` once the server has written it (WSGI calls ``close()`` then)."""

    def __init__(self, body: Any, done: Any) -> None:
        self._body = body
        self._done = done

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        self._done()


#: The process's endpoints by (host, port): a train and an eval monitor on one address share one.
_EXPORTERS: dict[tuple[str, int], _Exporter] = {}
_EXPORTERS_LOCK = threading.Lock()


class PrometheusSink(_CollectorSink):
    """Expose the latest record for scraping.

    By default serves an HTTP endpoint on ``host:port`` (``127.0.0.1``;
    ``port=0`` picks a free port, see :attr:`port`) with a registry of advmon's
    own, so it runs beside a trainer's exporter. Monitors of one process that ask
    for the same address share its endpoint (their series differ by ``run``): a
    train and an eval monitor is the common case. If another process holds the
    port, the sink fails every record (counted in ``advmon/sink_errors/prometheus``;
    the monitor warns once, saying why) and training goes on. Pass ``registry=``
    to add advmon's collector to an existing registry instead and start no server.

    On a clean close the run is marked finished (``advmon_run_finished`` 1) and, once
    a scraper has come before, the endpoint keeps serving until a scrape has read that
    (at most ``finish_timeout`` seconds, and at most two scrape intervals): a run that
    vanishes unfinished is what AdvmonRunCrashed looks for.

    Example:
        >>> sink = PrometheusSink(port=0)
        >>> sink.attach(run="doc", sink_names=["prometheus"])
        >>> import urllib.request
        >>> b"advmon_updates_total" in urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics").read()
        True
        >>> sink.close()
    """

    name = "prometheus"
    synchronous = True  # an in-memory update: cheap enough for the training thread

    def __init__(self, host: str = "127.0.0.1", port: int | None = 9464, registry: Any = None, run: str = "",
                 finish_timeout: float = 60.0) -> None:
        self._exporter: _Exporter | None = None
        self._unavailable = ""
        self.host = host
        self.port = None
        self.finish_timeout = float(finish_timeout)
        if registry is not None or port is None:
            super().__init__(run, registry)
            return
        client = require("prometheus_client", "prometheus")
        with _EXPORTERS_LOCK:
            exporter = _EXPORTERS.get((host, port)) if port else None
            if exporter is None:
                shared = client.CollectorRegistry(auto_describe=False)
                try:
                    exporter = _Exporter.serve(host, port, shared)
                except OSError as exc:
                    # Said once, with the first record's failure (the monitor warns once per sink and counts).
                    self._unavailable = (f"could not serve Prometheus metrics on {host}:{port}: {exc.strerror or exc} "
                                         "(is another process using the port?); this sink records nothing")
                    super().__init__(run, None)  # a registry of its own, served by no one
                    return
                _EXPORTERS[(host, exporter.server.server_port)] = exporter
            self._exporter = exporter
            super().__init__(run, client.CollectorRegistry(auto_describe=False))  # its own, and a member of the shared
            exporter.members.append(self.collector)
        self.port = exporter.server.server_port
        if port == 0:  # a free port: say which, for the scrape configuration (several workers, one node)
            logging.getLogger("advmon").info(
                "advmon: Prometheus endpoint of process %d at http://%s:%d/metrics", os.getpid(), host, self.port)

    def write(self, record: Record) -> None:
        if self._unavailable:
            raise RuntimeError(self._unavailable)
        self.collector.update(record)

    def close(self) -> None:
        exporter, self._exporter = self._exporter, None
        if self._failed or closing_on_error():
            finished_at = None  # not finished: the run vanishes as a crashed one does
        else:
            self.collector.finish()
            finished_at = time.monotonic()
        if exporter is None:
            return
        if finished_at is not None and not exporter.await_scrape_after(finished_at, self.finish_timeout):
            logging.getLogger("advmon").warning(
                "advmon: run %s closed before a scrape read that it finished (waited up to %gs, "
                "PrometheusSink(finish_timeout=...)); Prometheus may take it for crashed (AdvmonRunCrashed)",
                self.collector.run, self.finish_timeout)
        with _EXPORTERS_LOCK:
            exporter.members.remove(self.collector)
            if exporter.members:
                return  # another monitor of this process still serves there
            _EXPORTERS.pop((self.host, exporter.server.server_port), None)
        exporter.server.shutdown()
        exporter.server.server_close()

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}" if self.port is not None else "injected registry"
        if self._unavailable:
            where = f"{self.host}, not serving"
        return f"PrometheusSink({where})"


class PushgatewaySink(_CollectorSink):
    """Push the latest record to a Pushgateway, grouped by ``run``.

    Each push replaces the run's group (``push_to_gateway``). Scrape the
    Pushgateway with ``honor_labels: true`` so the ``run`` label is kept.

    The Pushgateway keeps a group until it is deleted, so the run's state travels in
    it: a thread of the sink pushes at least every ``heartbeat_seconds`` (no torch,
    only the last record's numbers), which keeps ``advmon_heartbeat_timestamp_seconds``
    fresh while the process lives, records or not; a clean close pushes
    ``advmon_run_finished`` 1 and keeps the group, so that neither AdvmonRunHung nor
    AdvmonRunCrashed fires for a finished run. ``delete_on_close=True`` deletes the group
    instead (the run then leaves the board too). A run closed by an exception is not
    marked: its heartbeat stops, and it shows as crashed.

    Authentication, never printed or logged: basic auth from ``user:password@``
    in the URL, or ``username``/``password``, or ``ADVMON_PUSHGATEWAY_USERNAME`` with
    ``ADVMON_PUSHGATEWAY_PASSWORD`` (or ``..._PASSWORD_FILE``); a bearer token from
    ``token`` or ``ADVMON_PUSHGATEWAY_TOKEN`` (or ``..._TOKEN_FILE``).
    """

    name = "pushgateway"

    def __init__(
        self,
        url: str,
        job: str = "advmon",
        run: str = "",
        timeout: float = 5.0,
        delete_on_close: bool = False,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        heartbeat_seconds: float = 30.0,
    ) -> None:
        super().__init__(run)
        clean, url_user, url_password = split_credentials(url)
        self.url = clean
        self.job = job
        self.timeout = timeout
        self.delete_on_close = delete_on_close
        self.heartbeat_seconds = float(heartbeat_seconds)
        username = username or url_user or os.environ.get("ADVMON_PUSHGATEWAY_USERNAME")
        password = password or url_password or _from_env_or_file("ADVMON_PUSHGATEWAY_PASSWORD")
        token = token or _from_env_or_file("ADVMON_PUSHGATEWAY_TOKEN")
        for secret in (password, token):
            remember_secret(secret)
        # One Authorization header serves the pushes and the read of the group's counters.
        self._auth_headers = _auth_headers(username, password, token)
        self._seeded = False
        self._push_lock = threading.Lock()  # the delivery thread, the heartbeat and close push one at a time
        self._last_push: float | None = None  # monotonic time of the last push that arrived
        self._stopped = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _handler(self, url, method, timeout, headers, data):  # noqa: ANN001 - prometheus-client's handler shape
        extra = list(self._auth_headers.items())
        return self._client.exposition.default_handler(url, method, timeout, [*headers, *extra], data)

    def _seed_from_gateway(self) -> None:
        """Continue the counters the gateway already holds for this run (a replay, a restarted
        trainer): a counter that restarted from 0 under the same group would go backwards."""
        self._seeded = True
        try:
            current = read_group_counters(self.url, self.job, self.collector.run, self._auth_headers, self.timeout)
        except Exception:  # noqa: BLE001 - no gateway yet, or none reachable: start from 0
            return
        self.collector.continue_from(current)

    @property
    def grouping_key(self) -> dict[str, str]:
        return {"run": self.collector.run}

    def attach(self, run: str, sink_names: Sequence[str]) -> None:
        super().attach(run, sink_names)
        self._seeded = False
        if self.heartbeat_seconds > 0 and self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, name=f"advmon-heartbeat-{run}", daemon=True)
            self._heartbeat.start()

    def _beat(self) -> None:
        """Push when nothing was pushed for ``heartbeat_seconds`` (a slow step, a hung one), until close."""
        while not self._stopped.wait(self.heartbeat_seconds):
            last = self._last_push
            if last is not None and time.monotonic() - last < self.heartbeat_seconds / 2:
                continue  # records are being pushed: they are the heartbeat
            try:
                self._push()
            except Exception:  # noqa: BLE001, S112 - the records' pushes count and report a gateway that is down
                continue

    def _push(self) -> None:
        with self._push_lock:
            if not self._seeded:  # off the training thread, before this sink's first push
                self._seed_from_gateway()
            self._client.push_to_gateway(
                self.url, job=self.job, registry=self.registry, grouping_key=self.grouping_key, timeout=self.timeout,
                handler=self._handler,
            )
            self._last_push = time.monotonic()

    def accept(self, record: Record) -> None:
        """Count the record at once (on the training thread, in memory only): a record the
        queue drops later is still counted, so the pushed counters miss nothing."""
        self.collector.update(record)

    def write(self, record: Record) -> None:
        """Push the latest state (every record accepted so far)."""
        self.write_batch([record])

    def write_batch(self, records: Sequence[Record]) -> None:
        self._push()

    def close(self) -> None:
        """Mark the run finished on the gateway (or delete its group); a run closed by an exception is left
        to show as crashed. Nothing is pushed for a run that never reached the gateway."""
        self._stopped.set()
        if self.delete_on_close:
            self._client.delete_from_gateway(
                self.url, job=self.job, grouping_key=self.grouping_key, timeout=self.timeout, handler=self._handler
            )
        elif self._last_push is not None and not (self._failed or closing_on_error()):
            self.collector.finish()
            self._push()

    def __repr__(self) -> str:
        return f"PushgatewaySink({redact_url(self.url)!r}, job={self.job!r})"


def read_group_counters(url: str, job: str, run: str, headers: dict[str, str], timeout: float) -> dict[tuple[str, tuple], float]:
    """The counters one group holds on a Pushgateway (its JSON API): ``{(name, labels): value}``."""
    import json
    import urllib.request

    request = urllib.request.Request(f"{url.rstrip('/')}/api/v1/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        groups = json.loads(response.read()).get("data", [])
    found: dict[tuple[str, tuple], float] = {}
    for group in groups:
        labels = group.get("labels", {})
        if labels.get("job") != job or labels.get("run") != run:
            continue
        for name, family in group.items():
            if not isinstance(family, dict) or family.get("type") != "COUNTER":
                continue
            for metric in family.get("metrics", []):
                own = tuple(sorted((k, v) for k, v in metric.get("labels", {}).items() if k not in ("job", "instance", "run")))
                found[(name.removesuffix("_total"), own)] = float(metric.get("value", 0.0))
    return found


def _auth_headers(username: str | None, password: str | None, token: str | None) -> dict[str, str]:
    import base64

    if token:
        return {"Authorization": f"Bearer {token}"}
    if username is not None and password is not None:
        return {"Authorization": "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()}
    return {}


def _from_env_or_file(variable: str) -> str | None:
    """``$VARIABLE``, else the stripped contents of the file ``$VARIABLE_FILE``."""
    value = os.environ.get(variable)
    if value:
        return value
    path = os.environ.get(f"{variable}_FILE")
    if path:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    return None
