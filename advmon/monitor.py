"""The monitor: owns steps, aggregation, problem accounting and emission.

A :class:`Monitor` turns watched calls into records. Each call contributes device
parts (see :mod:`advmon.stats`); a record gathers the parts of one step, crosses
to the host once, is summarised and handed to every sink.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np
import torch

import advmon.assembly as assembly
import advmon.lifecycle as lifecycle
from advmon.config.checks import (
    checked_exemplars,
    checked_max_slices,
    checked_policy,
    checked_range,
    checked_run,
    checked_sinks,
    default_run_id,
    global_rank,
    make_alert_sink,
)
from advmon.config.environment import jsonl_path, monitor_settings
from advmon.config.specs import sinks_from_env, specs_from_env
from advmon.errors import AdvmonConfigError, AdvmonError, closing_on_error, on_users_path, warn, warnings_kept
from advmon.hooks import (
    ActiveCall,
    ArgumentNames,
    checked_argument_names,
    current_reward_functions,
    current_slice_labels,
    takes_argument_names,
    unmapped_inputs,
    watch_names,
    watch_with,
)
from advmon.hooks import instrument as _instrument
from advmon.host_half import HostHalf
from advmon.normalization import Normalization, checked_normalization, judge, resolve
from advmon.observation import (
    CallParts,
    ObservationError,
    ObserveSettings,
    Problem,
    advantages_of,
    as_tensor,
    estimator_metrics_of,
    observe_call,
    observe_inputs,
    observe_output,
    tensor_part,
)
from advmon.record import HISTOGRAM_STAGES, Record
from advmon.rules import Thresholds
from advmon.sinks.base import SinkLike
from advmon.sinks.delivery import Delivery
from advmon.sinks.jsonl import JsonlSink, one_sink_per_file
from advmon.stats import Part, SliceIndex, statistics_threads
from advmon.steps import StepTracker

if TYPE_CHECKING:
    from advmon.alerts.evaluator import AlertEvent
    from advmon.stopping import StopOn, StopWatch

__all__ = ["Monitor", "get_monitor", "monitor_from_environment", "set_monitor"]

F = TypeVar("F", bound=Callable[..., Any])


class Monitor:
    """Records advantage, reward and group statistics of watched estimator calls.

    Args:
        run: the run id, used by sinks and as the JSONL file name (default: a
            readable generated id such as ``run-20261202-181533-4f2a``). Every reader must
            read it back, so it is 1 to 200 UTF-8 bytes of printable characters, without
            ``/``, ``\\`` or ``#``, not starting with ``.`` or ``-``. A run has one monitor in a
            process: a monitor of a run whose monitor is still open (a notebook cell run again
            without ``close()``) closes that one, says so, and takes the run over.
        sinks: where records go: objects with ``write(record)`` or spec strings
            (``"jsonl:PATH"``, ``"wandb:PROJECT"``, ``"mlflow:URI"``,
            ``"trackio:PROJECT"``, ``"prometheus:HOST:PORT"``, ``"pushgateway:URL"``). Default: a
            :class:`~advmon.sinks.JsonlSink` writing ``advmon-runs/<run>.jsonl``
            plus the sinks named in ``ADVMON_SINKS``.
        reward_range: ``(lo, hi)`` bounds of the reward, to report all-fail and
            all-pass groups (``groups/all_low_fraction``, ``groups/all_high_fraction``).
        strict: raise :class:`~advmon.AdvmonError` on any problem instead of
            warning once per kind and counting it in ``advmon/internal_errors``.
        step_source: for loops advmon cannot wrap in :meth:`step` (NeMo-RL's
            asynchronous single controller): a callable giving the current training
            step. Calls are then aggregated per step value, and a step's record is
            emitted when a call for another step arrives, or on :meth:`flush`.
        reduce: ``"ranks"`` when the estimator runs on every rank with a shard of
            the batch (DDP loops, TRL's per-process slices): each step, every rank's
            host-side parts (counts, sums, extrema, exact values or histogram bins)
            are gathered to rank 0 over ``torch.distributed`` and merged as chunks
            of one step are, so rank 0 emits exactly the record one process would
            compute on the concatenated batch. Every rank must then record the same
            steps (it is a collective). Default ``"none"``.
        all_ranks: record on every process of a distributed job. By default only
            global rank 0 (``torch.distributed`` or ``RANK``) records and emits;
            other ranks run their estimators untouched.
        queue_size, retries: delivery to asynchronous sinks (see
            :class:`advmon.sinks.delivery.DeliveryPolicy`).
        close_timeout: seconds :meth:`close` waits for queued records.
        alerts: evaluate the alert catalog in-process and notify: notifier specs
            (``"slack:SLACK_WEBHOOK_URL"``, ``"slack:/run/secrets/slack"``,
            ``"wandb-alert"``) or notifier objects. Runs on a delivery thread.
        alert_thresholds: overrides of the catalog's thresholds by name
            (``{"zero_std_ratio": 0.9}``; see ``docs/alerts.md``).
        runbook_base, dashboard_url: where your team hosts the runbooks page and the on-call
            board, as for ``advmon alerts generate``: ``alerts`` messages link them (each
            message carries its runbook's "Check first" either way).
        exemplars: how many of a step's worst prompt groups its record names
            (``Record.exemplars``: non-finite first, then beyond the group bound,
            then the largest |advantage|; docs/drilldown.md). 0 turns them off;
            ``ADVMON_EXEMPLARS`` sets it for the process-wide monitor.
        max_slices: distinct slice labels (``watch(slices=...)``, ``observe(slices=...)``)
            that keep their own ``slices/<label>/...`` keys in this run; later ones are
            folded into ``slices/other/...`` and counted in ``slices/folded_labels``.
        histograms: whether records carry the pre- and post-norm advantages'
            distributions (``Record.histograms``: at most 64 bins from the statistics'
            own histogram). Default: when a sink draws or keeps them (JSONL,
            TensorBoard, W&B, trackio); ``ADVMON_HISTOGRAMS=0`` turns them off for the
            process-wide monitor.
        resume: continue a run in the JSONL files it wrote before (a job restarted
            from a checkpoint; ``ADVMON_RESUME=1``). By default a JSONL file that
            already holds records is moved aside (said once) and the run starts
            its own, so running a script twice never mixes two runs in one file.
        stop_on: ask the training loop to stop when an alert fires (off by default):
            ``"critical"`` (every critical rule of the catalog) or a list of alert
            names (``["AdvmonNonFiniteRewards"]``). The rules are evaluated in-process,
            with or without ``alerts``. When one fires, the record is in the JSONL file
            and the notifiers have been handed the alert (:mod:`advmon.stopping`) before
            :attr:`should_stop` turns true; the loop reads it (TRL's trainer:
            :class:`~advmon.integrations.trl.MonitoredGRPOTrainer` does). advmon itself
            never stops or raises into training.
        finish_on_caller: finish each record, and write its JSONL line, on the calling
            thread before the watched call (or the step) returns, instead of on the
            monitor's own thread. For processes that can end without running any exit
            handler: a Ray worker is ended that way when its driver shuts down, so
            :func:`advmon.integrations.ray.runtime_env` turns it on for workers
            (``ADVMON_FINISH_ON_CALLER=1``). It costs the caller the host half's share
            of each record (docs/performance.md).

    Example:
        >>> import torch, tempfile, os
        >>> from advmon import Monitor, JsonlSink
        >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
        >>> monitor = Monitor("demo", sinks=[JsonlSink(path)])
        >>> @monitor.watch
        ... def compute_advantage(prompt_ids, rewards, mask):
        ...     centered = rewards - rewards.mean()
        ...     return centered.unsqueeze(-1).expand(mask.shape)
        >>> adv = compute_advantage(torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4, 3))
        >>> monitor.last_metrics["groups/zero_std_fraction"], monitor.last_metrics["advantages/post_norm/count"]
        (0.5, 12.0)
        >>> monitor.close()
    """

    def __init__(
        self,
        run: str | None = None,
        sinks: Sequence[SinkLike] | None = None,
        *,
        reward_range: tuple[float, float] | None = None,
        strict: bool = False,
        step_source: Callable[[], int] | None = None,
        all_ranks: bool = False,
        reduce: str = "none",
        queue_size: int = 1000,
        retries: int = 3,
        close_timeout: float = 10.0,
        alerts: Sequence[Any] | None = None,
        alert_thresholds: Mapping[str, float] | None = None,
        exemplars: int = 5,
        max_slices: int = 16,
        histograms: bool | None = None,
        resume: bool = False,
        runbook_base: str = "",
        dashboard_url: str = "",
        stop_on: StopOn = None,
        finish_on_caller: bool = False,
    ) -> None:
        if step_source is not None and not callable(step_source):
            raise AdvmonConfigError(f"step_source must be a callable returning the training step, got {step_source!r}")
        self.run = default_run_id() if run is None else checked_run(run)
        self.reward_range = checked_range(reward_range)
        self.strict = bool(strict)
        self.exemplars = checked_exemplars(exemplars)
        self._slice_index = SliceIndex(checked_max_slices(max_slices))
        # The alerts' own bound decides which groups are "beyond" it.
        self._bound_factor = Thresholds.with_overrides(alert_thresholds)["bound_factor"]
        self._stop = _stop_watch(stop_on, alert_thresholds)
        self._lock = threading.RLock()
        self.rank = global_rank()
        if reduce not in ("none", "ranks"):
            raise AdvmonConfigError(f"reduce must be 'none' or 'ranks', got {reduce!r}")
        self.reduce = reduce
        #: Whether this process records (global rank 0, every rank with all_ranks or reduce="ranks").
        self.enabled = bool(all_ranks) or self.rank == 0 or reduce == "ranks"
        self.close_timeout = float(close_timeout)
        policy = checked_policy(queue_size, retries)
        if histograms is not None and not isinstance(histograms, bool):
            raise AdvmonConfigError(
                f"histograms must be True, False or None (when a sink takes them), got {histograms!r}")
        self.sinks: list[SinkLike] = []
        if self.enabled and (reduce == "none" or self.rank == 0):
            default = jsonl_path(Path("advmon-runs"), self.run, self.rank, per_process=False)
            chosen = [JsonlSink(default), *sinks_from_env(self.run)] if sinks is None else checked_sinks(sinks, self.run)
            self.sinks = one_sink_per_file(chosen)  # ADVMON_SINKS=jsonl beside the default writes one file once
            for sink in self.sinks:  # a run started again gets a file of its own, unless it continues on purpose
                if isinstance(sink, JsonlSink):
                    sink.resume = sink.resume or bool(resume)
            if alerts:
                self.sinks.append(make_alert_sink(alerts, alert_thresholds, runbook_base, dashboard_url))
        self._warned: set[str] = set()
        #: Whether records carry histograms (``None``: whether a sink takes them).
        self.histograms = any(getattr(s, "histograms", False) for s in self.sinks) if histograms is None else histograms
        self._replaced = _take_over_run(self.run)  # before this monitor's sinks take the run's name
        self._delivery = Delivery(self.sinks, self.run, policy, _weak_warner(self))
        # A record's host half runs on a thread of its own, unless a problem must raise where the call is
        # (strict) or every rank must take part in the step's gather on its training thread (reduce="ranks").
        #: Whether each record is finished (and its JSONL line written) before the call that made it returns.
        self.finish_on_caller = bool(finish_on_caller)
        self._synchronous = self.strict or reduce == "ranks" or self.finish_on_caller
        self._host = HostHalf(self.run, _weak_loss_reporter(self))
        self._deferred_warnings: list[str] = []
        self._emit_lock = threading.RLock()
        # A monitor nobody closes must not leak its threads and files: finish its host half and close its
        # delivery when it is garbage-collected, on a thread of its own (lifecycle.close_in_background
        # says why the collector must not wait); interpreter exit waits for it.
        self._finalizer = weakref.finalize(self, lifecycle.close_in_background,
                                           partial(_close_host_then_delivery, self._host, self._delivery),
                                           min(self.close_timeout, 2.0), f"advmon-close-{self.run}")
        self._finalizer.atexit = False
        replayable = [s for s in self.sinks if not getattr(s, "synchronous", False) and getattr(s, "replayable", True)]
        if replayable and not any(isinstance(sink, JsonlSink) for sink in self.sinks):
            self._warn_sink(
                "no_jsonl",
                "no JSONL sink: records an asynchronous sink fails to take cannot be replayed later "
                "(add advmon.JsonlSink or 'jsonl:PATH')",
            )
        lifecycle.track(self)
        lifecycle.register_run(self)
        if self._replaced:  # the process-wide monitor was the run's: this one is, so advmon.watch records here
            lifecycle.set_default(self)
        self._steps = StepTracker(self, step_source)
        self._internal_errors = 0
        self._last_record: Record | None = None
        self._closed = False

    # ------------------------------------------------------------------ public API

    @overload
    def watch(self, fn: F) -> F: ...

    @overload
    def watch(
        self,
        fn: None = None,
        *,
        rewards: str | None = "rewards",
        mask: str | None = "mask",
        groups: str | None = "prompt_ids",
        group_size: int | None = None,
        slices: str | None = None,
        reward_functions: str | None = None,
        normalization: Normalization = None,
    ) -> Callable[[F], F]: ...

    @takes_argument_names
    def watch(self, fn: F | None = None, **names: Any) -> F | Callable[[F], F]:
        """Decorate an estimator function or method; use bare or with argument names.

        Arguments are bound by name (positional and keyword calls both work);
        ``rewards``, ``mask`` and ``groups`` name the estimator's parameters
        (``None``: it has no such input), and ``group_size`` groups contiguous
        blocks instead. ``slices`` names a parameter of per-sample labels (a
        list or array of strings such as ``data_source``): the record then
        carries ``slices/<label>/...`` keys (docs/drilldown.md). ``reward_functions``
        names a parameter holding ``{name: per-sample rewards}`` (or
        ``"parameter:prefix"`` for its keys with that prefix): ``rewards/<name>/...``.
        ``normalization`` says how the estimator normalizes its advantages, which
        decides how large they may be before the bound alert fires: ``"group_std"``
        (GRPO), ``"group_loo_std"`` (NeMo-RL's GRPO), ``"group_mean"`` (Dr. GRPO,
        RLOO, OPO), ``"gpg"``, ``"batch"`` (whitened: REINFORCE++, GAE), ``"none"``
        (reward units: ReMax, raw rewards), or a function of the call's arguments
        returning one; ``None`` (default) infers it from each call (docs/alerts.md,
        Normalization kinds). An unknown value raises here, not during training.

        Example:
            >>> monitor = Monitor("doc", sinks=[])
            >>> @monitor.watch(rewards="token_level_rewards", mask="response_mask", groups="index")
            ... def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6):
            ...     scores = token_level_rewards.sum(-1)
            ...     return (scores - scores.mean()).unsqueeze(-1) * response_mask
            >>> compute_grpo_outcome_advantage.__name__
            'compute_grpo_outcome_advantage'
        """
        argument_names = watch_names("Monitor.watch", names)

        def decorate(function: F) -> F:
            return watch_with(function, self, argument_names)

        return decorate(fn) if fn is not None else decorate

    def instrument(self, target: Any, method: str = "compute_advantage", **argument_names: Any) -> Any:
        """Wrap ``target.method`` (an estimator instance or class) in place; see :func:`advmon.instrument`."""
        return _instrument(target, self, method, checked_argument_names(argument_names))

    def observe(
        self,
        *,
        rewards: Any = None,
        advantages: Any = None,
        mask: Any = None,
        groups: Any = None,
        pre_norm: Any = None,
        group_size: int | None = None,
        slices: Any = None,
        reward_functions: Mapping[str, Any] | None = None,
        normalization: str | None = None,
    ) -> None:
        """Record advantages computed inline, without a decorator (e.g. TRL's GRPOTrainer).

        Inside ``with monitor.step(n)`` this joins the step's record; otherwise it
        is a record of its own. ``slices`` gives each sample's label (a list or
        array of strings): per-slice keys ``slices/<label>/...``.
        ``reward_functions`` maps reward function (or component) names to their
        per-sample rewards, NaN where a function gave none: keys
        ``rewards/<name>/...``, so a function that returned ``None`` shows.
        ``normalization``: how the advantages were normalized (a kind, see
        :meth:`watch`; ``None``: inferred).

        Example:
            >>> monitor = Monitor("doc", sinks=[])
            >>> r = torch.tensor([1.0, 0.0, 1.0, 1.0])
            >>> monitor.observe(rewards=r, advantages=r - r.mean(), group_size=2)
            >>> monitor.last_metrics["groups/zero_std_count"]
            1.0
        """
        if self._refuse_closed():
            return
        if callable(normalization):
            raise AdvmonConfigError("observe(normalization=...) takes a kind, not a function: it has no call "
                                    "arguments to read")
        checked_normalization(normalization)
        problems: list[Problem] = []
        try:
            with torch.no_grad(), statistics_threads():
                taps: dict[str, list[Part]] = {}
                if pre_norm is not None:
                    try:
                        taps["pre_norm"] = [tensor_part(_required_tensor(pre_norm, "pre_norm"), as_tensor(mask, "mask"))]
                    except ObservationError as error:  # still record the rest
                        problems.append(error.problem)
                parts = observe_call(
                    estimator="observe",
                    rewards=rewards,
                    advantages=advantages,
                    mask=mask,
                    groups=groups,
                    group_size=group_size,
                    taps=taps,
                    problems=problems,
                    settings=self._observing(),
                    rewards_expected=False,
                    slices=slices if slices is not None else current_slice_labels(),
                    reward_functions=reward_functions if reward_functions is not None else current_reward_functions(),
                    normalization=normalization,
                )
        except ObservationError as error:
            self._report([error.problem])
            return
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the caller's
            self._report([_internal_problem(exc)], cause=exc)
            return
        self._report(problems)
        self._add(parts)

    @contextmanager
    def step(self, step: int) -> Iterator[Monitor]:
        """Aggregate every watched call inside the block into one record for ``step``.

        NeMo-RL's single controller calls the estimator once per chunk of a step;
        sums, counts, extrema and histograms are merged, so the record equals the
        one a single call on the whole batch would give.

        Raises:
            AdvmonConfigError: ``step`` is not a non-negative int.
            AdvmonError: a step is already open on this monitor.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise AdvmonConfigError(f"step must be a non-negative int, got {step!r}")
        # The step belongs to this context (thread, asyncio task): a call on another
        # thread is not silently folded into it. A worker pool joins on purpose by
        # running its work in contextvars.copy_context() taken inside the block.
        failed, opened = False, None
        try:
            with self._steps.block(int(step)) as opened:
                yield self
        except BaseException:
            failed = True
            raise
        finally:
            if opened is not None:
                calls, opened.calls = opened.calls, []
                if calls or self.reduce == "ranks":
                    # While the block's own exception propagates, advmon must not replace it.
                    # Across ranks, a rank with no call still takes part in the step's gather.
                    self._emit(int(step), calls, quiet=failed)

    @property
    def step_source(self) -> Callable[[], int] | None:
        """The callable giving the current step, if the monitor follows one."""
        return self._steps.step_source

    @property
    def last_metrics(self) -> dict[str, float]:
        """The latest record's metrics (``nan`` where unavailable), to merge into a trainer's own.

        Records are finished off the training thread; reading this waits for the ones
        still being finished (at most twice ``close_timeout``; docs/performance.md says what that costs).
        """
        record = self.last_record
        return dict(record.metrics) if record is not None else {}

    @property
    def last_record(self) -> Record | None:
        """The latest record, or ``None`` before the first (waits for records still being finished)."""
        self._settle()
        return self._last_record

    @property
    def should_stop(self) -> bool:
        """Whether an alert named in ``stop_on`` fired: the training loop should stop after this step.

        True only once the record that fired it is in the JSONL file and the alert was handed to the
        notifiers. Always ``False`` without ``stop_on``. Example:

            >>> monitor = Monitor("doc", sinks=[], stop_on="critical")
            >>> monitor.observe(rewards=torch.tensor([1.0, 0.0]))
            >>> monitor.should_stop
            False
            >>> monitor.observe(rewards=torch.tensor([1.0, float("nan")]))
            >>> monitor.should_stop, monitor.stop_reason.alert, monitor.stop_reason.step
            (True, 'AdvmonNonFiniteRewards', 1)
        """
        if self._stop is None:
            return False
        self._settle()  # a stop decision must not lag the step that fired it
        return self._stop.reason is not None

    @property
    def stop_reason(self) -> AlertEvent | None:
        """The alert that made :attr:`should_stop` true (its name, step, value, description), else ``None``."""
        if self._stop is None:
            return None
        self._settle()
        return self._stop.reason

    @property
    def stop_on(self) -> tuple[str, ...]:
        """The alerts that stop this run (empty: it never asks to stop)."""
        return self._stop.names if self._stop is not None else ()

    @property
    def internal_errors(self) -> int:
        """How many problems advmon met so far (also ``advmon/internal_errors``; waits for records being finished)."""
        self._settle()
        return self._internal_errors

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every record handed over is finished and given to the sinks (at most ``timeout`` seconds,
        default ``close_timeout``); whether it is.

        Watched calls return as soon as their record's transfer has started: the record
        is finished, and its JSONL line written, on the monitor's own thread
        (docs/performance.md). Synchronous sinks (JSONL) then have it; queued sinks
        (W&B, MLflow, Prometheus) deliver it on their own threads, which :meth:`flush`
        waits for too. Example:

            >>> monitor = Monitor("doc", sinks=[])
            >>> monitor.observe(rewards=torch.tensor([1.0, 0.0]))
            >>> monitor.wait()
            True
        """
        finished = self._host.wait(self.close_timeout if timeout is None else timeout)
        self._say_deferred()
        return finished

    def flush(self, timeout: float | None = None) -> None:
        """Emit the step a ``step_source`` monitor is still collecting and wait for
        asynchronous sinks to take what is queued (at most ``timeout`` seconds)."""
        budget = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        self._emit_followed()
        self._settle(budget)
        self._delivery.flush(max(deadline - time.monotonic(), 0.0))
        self._count_sink_failures()

    def close(self, timeout: float | None = None) -> None:
        """Emit what an open step holds, deliver what is queued (at most ``timeout``
        seconds, default ``close_timeout``), close every sink. Idempotent.

        Records a sink could not take are reported in one warning each; they are
        in the JSONL file for ``advmon replay``.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if closing_on_error():  # seen here, on the closing thread: sinks may close on threads of their own
            self._delivery.tell("run_failed")
        budget = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        for step, calls in self._steps.close_all():
            self._emit(step, calls)
        self._emit_followed()
        self._finalizer.detach()
        finished = self._host.stop(budget)
        self._say_deferred()
        if not finished:
            self._warn_sink("host_half_unfinished", f"records of run {self.run} were still being finished when "
                            f"close() gave up after {budget:g}s; they are lost")
        undelivered = self._delivery.close(max(deadline - time.monotonic(), 0.0))
        self._count_sink_failures()
        self._say_losses(undelivered)
        self._say_deferred()  # closed at the interpreter's exit, no frame is the user's: say them now anyway
        lifecycle.untrack(self)

    def _count_sink_failures(self) -> None:
        """Bring the latest record's sink counters up to now: a queued sink fails a record after it was made (its
        retries take seconds), so the record a user reads after :meth:`flush` or :meth:`close` counts every
        failure and drop so far. The sinks keep the record they were given."""
        with self._lock:
            record = self._last_record
            if record is not None:
                self._last_record = dataclasses.replace(record, metrics={**record.metrics,
                                                                         **self._delivery.counters()})

    def _say_losses(self, undelivered: dict[str, int]) -> None:
        """At close: one warning per sink that lost records, with how many in all, and where they are kept."""
        files = [str(sink.path) for sink in self.sinks if isinstance(sink, JsonlSink)]
        where = (
            f"they are in {files[0]}: send them with 'advmon replay {files[0]} --to SPEC'"
            if files else "no JSONL sink keeps them: they are lost"
        )
        counters = self._delivery.counters()
        for name in self._delivery.names:
            left = undelivered.get(name, 0)
            failed = int(counters.get(f"advmon/sink_errors/{name}", 0.0))
            dropped = int(counters.get(f"advmon/dropped_records/{name}", 0.0))
            if not (left or failed or dropped):
                continue
            parts = [f"{left} record(s) of run {self.run} could not be delivered to sink {name} before close"] if left \
                else []
            parts += [f"{failed} failed to be written after retries"] if failed else []
            parts += [f"{dropped} were dropped from its full queue"] if dropped else []
            self._warn_sink(f"lost:{name}", f"sink {name} lost {left + failed + dropped} record(s) of run {self.run}: "
                            f"{'; '.join(parts)}; {where}")

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Monitor(run={self.run!r}, sinks={self.sinks!r}, strict={self.strict})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Threads, files and sockets do not travel; say what does, rather than "cannot pickle RLock".
        raise TypeError(
            f"a Monitor (run {self.run!r}) does not pickle: it holds threads, files and sockets. Send the "
            "watched function or instrumented estimator instead (it finds the monitor of its run where it "
            "arrives), and configure that process with ADVMON_* variables (docs/integrations.md, Ray)"
        )

    # ------------------------------------------------------------------ hooks.Recorder: what watched calls use

    def start_call(
        self, estimator: str, inputs: dict[str, Any] | None, owner: Any, names: ArgumentNames
    ) -> ActiveCall | None:
        """Begin recording a watched call; ``None`` means: just run the estimator.

        Inputs are observed now, before the estimator could change them in place.
        """
        if self._refuse_closed():
            return None
        call = ActiveCall(monitor=self, estimator=estimator, inputs=inputs or {}, owner=owner)
        if inputs is None:
            call.problems.append(
                Problem("signature", f"could not bind the arguments of {estimator} to its signature")
            )
        try:
            with torch.no_grad(), statistics_threads():
                call.seen = observe_inputs(
                    estimator=estimator,
                    rewards=call.inputs.get("rewards"),
                    mask=call.inputs.get("mask"),
                    groups=call.inputs.get("groups"),
                    group_size=names.group_size,
                    problems=call.problems,
                    settings=self._observing(),
                    rewards_expected=names.rewards is not None,
                    slices=call.inputs.get("slices"),
                    reward_functions=call.inputs.get("reward_functions"),
                    normalization=_declared(names, call),
                )
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the estimator's
            call.problems.append(_internal_problem(exc))
        return call

    def finish_call(self, call: ActiveCall, result: Any) -> None:
        """Observe a call that returned; never raises unless ``strict``."""
        try:
            with torch.no_grad(), statistics_threads():
                parts = self._observe_result(call, result)
        except ObservationError as error:
            self._report(call.problems + [error.problem])
            return
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the estimator's
            self._report(call.problems + [_internal_problem(exc)], cause=exc)
            return
        self._report(call.problems)
        self._add(parts)

    def _observe_result(self, call: ActiveCall, result: Any) -> CallParts:
        if call.seen is None:
            raise ObservationError("internal", "the call's inputs could not be observed")
        advantages = None
        if not call.taps.get("post_norm"):
            try:
                advantages = advantages_of(result)
            except ObservationError as error:  # still record the rewards and groups
                call.problems.append(error.problem)
        parts = observe_output(
            call.seen,
            advantages=advantages,
            taps=call.taps,
            problems=call.problems,
        )
        parts.estimator_metrics = _numeric_metrics(estimator_metrics_of(result, call.owner), call.problems)
        call.problems.extend(unmapped_inputs(call, advantages))
        return parts

    def record_tap(self, call: ActiveCall, stage: str, tensor: Any, mask: Any) -> None:
        """Statistics of a tapped tensor, taken now (the estimator may change it next)."""
        try:
            if not isinstance(stage, str) or not stage.replace("_", "").isalnum():
                raise ObservationError("tap_stage", f"tap stage must be a word like 'pre_norm', got {stage!r}")
            with torch.no_grad(), statistics_threads():
                values = _required_tensor(tensor, stage)
                mask_t = as_tensor(mask, "mask") if mask is not None else _matching_mask(call, values)
                call.taps.setdefault(stage, []).append(tensor_part(values, mask_t))
        except ObservationError as error:
            call.problems.append(error.problem)
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the estimator's
            call.problems.append(_internal_problem(exc))

    def _observing(self) -> ObserveSettings:
        """What every call's observation asks of it, watched or observed: one object, built in one place."""
        return ObserveSettings(self.reward_range, self.exemplars, self._bound_factor, self._slice_index)

    # ------------------------------------------------------------------ records

    def _add(self, parts: CallParts) -> None:
        with self._emit_lock:  # a step's number and its place in the host half's queue go together
            try:
                complete = self._steps.place(parts)
            except Exception as exc:  # noqa: BLE001 - the user's step_source failed
                self._report([Problem("step_source", f"step_source failed: {type(exc).__name__}: {exc}")])
                return
            for step, calls in complete:
                self._emit(step, calls)

    def _emit_followed(self) -> None:
        """Emit the step a ``step_source`` monitor is still collecting, if any."""
        for step, calls in self._steps.take_followed():
            self._emit(step, calls)

    def _emit(self, step: int, calls: list[CallParts], quiet: bool = False) -> None:
        with self._emit_lock:
            if self._stop is None or self.reduce != "ranks":
                self._emit_record(step, calls, quiet)
                return
            try:
                self._emit_record(step, calls, quiet)
            finally:  # every rank, every step, whatever happened on rank 0: a collective
                self._share_stop()

    def _emit_record(self, step: int, calls: list[CallParts], quiet: bool) -> None:
        """The training thread's share of a record: start its one transfer and hand the rest to the host half."""
        if self._synchronous:
            self._finish_record(step, calls, None, self._slice_index.folded, quiet)
            return
        try:
            crossing = assembly.cross(calls, self.close_timeout / 2)  # a lost copy is said within close()'s budget
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the caller's
            self._report([_internal_problem(exc)], cause=exc, quiet=quiet)
            return
        lifecycle.install_sigterm_flush()  # a job stopped with SIGTERM still writes what it handed over
        self._host.submit(partial(self._finish_record_later, step, calls, crossing, self._slice_index.folded, quiet))
        self._say_deferred()

    def _finish_record_later(self, *args: Any) -> None:
        """:meth:`_finish_record` on the host half's thread: what a sink warns there (the JSONL sink moving an
        earlier run's file aside) is said at the training thread's next call, where it names the user's line."""
        with warnings_kept(self._keep_warning):
            self._finish_record(*args)

    def _keep_warning(self, message: str) -> None:
        with self._lock:
            self._deferred_warnings.append(message)

    def _finish_record(self, step: int, calls: list[CallParts], crossing: Any, folded: int, quiet: bool) -> None:
        """The host half: the record from the crossing, its JSONL line, the other sinks, the stop check."""
        try:
            record = self._build_record(step, calls, quiet, crossing, folded)
        except AdvmonError:
            if quiet:
                return
            raise
        except Exception as exc:  # noqa: BLE001
            self._report([_internal_problem(exc)], cause=exc, quiet=quiet)
            return
        if record is None:  # reduce="ranks": rank 0 emits for every rank
            return
        self._last_record = record
        self._delivery.send(record)  # the JSONL line is written and flushed here, before anything else
        if self._stop is not None:
            self._check_stop(record, quiet)

    def _check_stop(self, record: Record, quiet: bool) -> None:
        """On a stopping alert: let the notifiers take it (bounded), then turn ``should_stop`` true, and say so."""
        from advmon.stopping import notifies

        try:
            event = self._stop.check(record)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the loop's
            self._report([_internal_problem(exc)], cause=exc, quiet=quiet)
            return
        if event is None:
            return
        left = sum(self._delivery.flush(self.close_timeout, only=notifies).values())
        if left:
            self._warn_sink("stop_undelivered", f"the alert {event.alert} that stops run {self.run} had not reached "
                            f"its notifiers within {self.close_timeout:g}s (close_timeout); stopping anyway, "
                            "close() delivers it")
        self._stop.reason = event  # type: ignore[union-attr]
        logging.getLogger("advmon").warning(
            "advmon: run %s asks the training loop to stop: %s (%s) fired at step %d: %s [stop_on; monitor.should_stop "
            "is now true]", self.run, event.alert, event.severity, event.step, event.description)

    def _share_stop(self) -> None:
        """``reduce="ranks"``: rank 0 alone sees records; every rank learns its decision at the same step."""
        from advmon.stopping import shared_reason

        try:
            reason = shared_reason(self._stop.reason)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the loop's
            self._report([_internal_problem(exc)], cause=exc, quiet=True)
            return
        if reason is not None and self._stop.reason is None:  # type: ignore[union-attr]
            self._stop.reason = reason  # type: ignore[union-attr]

    def _build_record(self, step: int, calls: list[CallParts], quiet: bool, crossing: Any = None,
                      folded: int = 0) -> Record | None:
        problems: list[Problem] = []  # what the host half of a device call could not finish
        if self.reduce == "ranks":
            try:
                local = assembly.collect(calls, problems, crossing)
            except Exception as exc:  # noqa: BLE001 - still take part in the gather, or every rank hangs
                self._report([_internal_problem(exc)], cause=exc, quiet=True)
                local = assembly.StepParts()
            parts = assembly.gather_ranks(local)
            self._report(problems, quiet=quiet)  # after the gather: strict mode's raise must not hang the others
            if parts is None or parts.is_empty:
                return None  # another rank emits; or no rank recorded anything this step
        else:
            parts = assembly.collect(calls, problems, crossing)
            self._report(problems, quiet=quiet)
        summaries, histograms = assembly.summaries_of(parts, HISTOGRAM_STAGES if self.histograms else ())
        self._report(assembly.record_problems(summaries, parts), quiet=quiet)
        verdict = judge(parts.normalizations, parts.bound_evidence, summaries, self.reward_range)
        if verdict.contradicted(self._bound_factor):
            self._warn_sink(
                f"normalization:{verdict.kind}:{verdict.observed}",
                f"{', '.join(dict.fromkeys(parts.estimators))} declares normalization {verdict.kind!r}, but at step "
                f"{step} its |A| reached {verdict.ratio:.3g}x that bound while its groups look {verdict.observed!r}: "
                "check watch(normalization=...) (docs/alerts.md, Normalization kinds)")
        metrics = assembly.assemble(summaries, parts, self.reward_range, verdict)
        if parts.slices:
            metrics["slices/folded_labels"] = float(folded)  # as the training thread left it at the step's end
        metrics["advmon/internal_errors"] = float(self._internal_errors)  # this step's problems included
        metrics.update(self._delivery.counters())
        return Record(
            run=self.run,
            step=step,
            time=time.time(),
            estimator=",".join(dict.fromkeys(parts.estimators)),
            pre_norm_source=assembly.combined_source(parts.sources),
            metrics=metrics,
            exemplars=assembly.worst_first(assembly.judged_exemplars(parts.exemplars, verdict, self._bound_factor),
                                           self.exemplars),
            histograms=histograms,
            normalization=verdict.kind if verdict.source is not None else None,
            normalization_source=verdict.source,
            normalization_observed=verdict.observed,
        )

    # ------------------------------------------------------------------ problems

    def _refuse_closed(self) -> bool:
        if not self.enabled:
            return True  # not the reporting rank: stay out of the way entirely
        if self._closed:
            self._report([Problem("closed", "the monitor is closed; calls are no longer recorded")], quiet=True)
        return self._closed

    def _warn_sink(self, kind: str, message: str) -> None:
        """A delivery problem: warned once per kind, never raised (it may come from a worker thread)."""
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        self._warn(f"advmon: {message} [{kind}; not repeated]")

    def _report(self, problems: list[Problem], cause: BaseException | None = None, quiet: bool = False) -> None:
        """Count problems, warn once per kind, or raise in strict mode."""
        if not problems:
            return
        with self._lock:
            self._internal_errors += len(problems)
            fresh = [p for p in problems if p.kind not in self._warned]
            self._warned.update(p.kind for p in fresh)
        if self.strict and not quiet:
            raise AdvmonError("; ".join(p.message for p in problems)) from cause
        for problem in fresh:
            self._warn(
                f"advmon: {problem.message} [{problem.kind}; counted in advmon/internal_errors, "
                "not repeated]"
            )

    def _warn(self, message: str) -> None:
        """Warn now, or, from the host half's thread or a sink's, at the training thread's next call (where a
        warning filter that raises cannot stop the record's delivery, ``pytest.warns`` and logs see it, and the
        warning names the user's line)."""
        if self._host.on_worker() or not on_users_path():
            self._keep_warning(message)
            return
        warn(message)

    def _say_deferred(self) -> None:
        """Warn what the host half found, on the calling thread."""
        if not self._deferred_warnings:
            return
        with self._lock:
            messages, self._deferred_warnings = self._deferred_warnings, []
        for message in messages:
            warn(message)

    def _settle(self, timeout: float | None = None) -> None:
        """Wait for records still being finished (at most ``timeout``, default twice ``close_timeout``: a record
        that stops the run waits up to ``close_timeout`` for its notifiers), then warn what they found."""
        if not self._host.idle:
            self._host.wait(2 * self.close_timeout if timeout is None else timeout)
        self._say_deferred()

    def _lose_record(self, exc: BaseException) -> None:
        """What the host half raised outside a record's own guard: counted and warned, the next record still runs."""
        with self._lock:
            self._internal_errors += 1
        self._warn_sink("host_half", f"a record was lost finishing it off the training thread: "
                        f"{type(exc).__name__}: {exc}")




def _take_over_run(run: str) -> bool:
    """Close the monitor of ``run`` still open in this process, if any, and say so once; whether it was the
    process-wide monitor.

    One run has one monitor in a process: two open monitors of one run would write one file (steps 0, 1, 0) and
    serve one run's series twice. A notebook cell run again without ``close()`` does that; the newer monitor is
    the one the cell's code now holds, so it takes the run over, and the earlier one ends its run cleanly (its
    records stay in their file, which the newer monitor's JSONL sink moves aside unless it resumes).
    """
    previous = lifecycle.monitor_of_run(run)
    if previous is None:
        return False
    was_default = lifecycle.current_default() is previous
    warn(f"advmon: run {run!r} already had an open Monitor in this process (a notebook cell run again without "
         "close()?); that monitor is closed now and this one records the run from here, so the two never write "
         "one file. Give each monitor a run of its own to keep both open")
    try:
        previous.close()
    except Exception as exc:  # noqa: BLE001 - its own close warns what it could not do; this monitor still starts
        warn(f"advmon: closing the earlier monitor of run {run!r} failed: {type(exc).__name__}: {exc}")
    return was_default


def _stop_watch(stop_on: Any, thresholds: Mapping[str, float] | None) -> StopWatch | None:
    """What ``stop_on`` asks for (checked now, not at the first record); ``None``: never stop."""
    if stop_on is None:
        return None
    from advmon.stopping import StopWatch, stop_rules

    return StopWatch(stop_rules(stop_on), Thresholds.with_overrides(thresholds))


def _numeric_metrics(metrics: dict[str, Any], problems: list[Problem]) -> dict[str, float | torch.Tensor]:
    numeric: dict[str, float | torch.Tensor] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
            numeric[str(key)] = value.detach().reshape(1)
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            numeric[str(key)] = float(value)
        elif isinstance(value, bool):
            numeric[str(key)] = float(value)
        else:
            problems.append(
                Problem("estimator_metric", f"estimator metric {key!r} is not a number ({type(value).__name__}); skipped")
            )
    return numeric


def _declared(names: ArgumentNames, call: ActiveCall) -> str | None:
    """The kind the call declares (a function of its arguments is asked now); a failing one is a problem of the
    call, and the kind is then inferred."""
    try:
        return resolve(names.normalization, call.inputs.get("arguments", {}))
    except ValueError as error:
        call.problems.append(Problem("normalization", str(error)))
        return None


def _required_tensor(value: Any, name: str) -> torch.Tensor:
    tensor = as_tensor(value, name)
    if tensor is None:
        raise ObservationError(f"{name}_type", f"{name} is None")
    return tensor


def _matching_mask(call: ActiveCall, values: torch.Tensor) -> torch.Tensor | None:
    mask = call.seen.mask if call.seen is not None else None
    return mask if mask is not None and tuple(mask.shape) == tuple(values.shape) else None


def _internal_problem(exc: BaseException) -> Problem:
    return Problem("internal", f"internal error {type(exc).__name__}: {exc}")


#: Kept for compatibility: interpreter exit is :func:`advmon.lifecycle.close_all`.
close_live_monitors = lifecycle.close_all


def _weak_loss_reporter(monitor: Monitor) -> Callable[[BaseException], None]:
    """The monitor's :meth:`Monitor._lose_record`, without the host half's thread keeping the monitor alive."""
    reference = weakref.ref(monitor)

    def lose_record(exc: BaseException) -> None:
        target = reference()
        if target is not None:
            target._lose_record(exc)

    return lose_record


def _close_host_then_delivery(host: HostHalf, delivery: Delivery, timeout: float) -> dict[str, int]:
    """A collected monitor's close: what its host half holds first, then its sinks, in one budget."""
    deadline = time.monotonic() + timeout
    host.stop(timeout)
    return delivery.close(max(deadline - time.monotonic(), 0.0))


def _weak_warner(monitor: Monitor) -> Callable[[str, str], None]:
    """The monitor's sink-problem reporter, without keeping the monitor alive (its threads call it)."""
    reference = weakref.ref(monitor)

    def warn_sink(kind: str, message: str) -> None:
        target = reference()
        if target is not None:
            target._warn_sink(kind, message)
        else:
            warn(f"advmon: {message} [{kind}]")

    return warn_sink


def get_monitor() -> Monitor:
    """The process-wide default monitor behind :func:`advmon.watch`, created on first use."""
    return lifecycle.default_monitor()


def set_monitor(monitor: Monitor | None) -> Monitor | None:
    """Make ``monitor`` the process-wide default; returns the previous one."""
    if monitor is not None and not isinstance(monitor, Monitor):
        raise AdvmonConfigError(f"expected a Monitor, got {type(monitor).__name__}")
    return lifecycle.set_default(monitor)


def monitor_from_environment(run: str | None = None) -> Monitor:
    """The process-wide monitor as the ``ADVMON_*`` variables describe it (:mod:`advmon.config.environment`).

    ``run`` names it when ``ADVMON_RUN`` does not. Without any variable set this is
    ``Monitor()`` with its defaults. Where the run has an open monitor in this process already
    (the user's own), that one is returned: a run has one monitor in a process.
    """
    settings = monitor_settings(run=run)
    directory, per_process = settings.pop("directory"), settings.pop("per_process")
    name = default_run_id() if settings["run"] is None else checked_run(settings["run"])
    settings["run"] = name
    open_already = lifecycle.monitor_of_run(name)
    if open_already is not None:  # the run's monitor is open (the user's own): it is the process-wide one too
        return open_already
    # Specs, not sinks: a rank that does not record must not start a server.
    sinks: list[Any] = [JsonlSink(jsonl_path(directory, name, global_rank(), per_process)), *specs_from_env()]
    return Monitor(sinks=sinks, **settings)
