"""The monitor: owns steps, aggregation, problem accounting and emission.

A :class:`Monitor` turns watched calls into records. Each call contributes device
parts (see :mod:`advmon.stats`); a record gathers the parts of one step, crosses
to the host once, is summarised and handed to every sink.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
import torch

import advmon.lifecycle as lifecycle
from advmon.emitter import Delivery, DeliveryPolicy
from advmon.errors import AdvmonConfigError, AdvmonError, warn
from advmon.groups import merge_group_counts
from advmon.hooks import ActiveCall, ArgumentNames, instrument as _instrument, watch_with
from advmon.observation import (
    CallParts,
    ObservationError,
    Problem,
    advantages_of,
    as_tensor,
    estimator_metrics_of,
    observe_call,
    observe_inputs,
    observe_output,
    tensor_part,
)
from advmon.record import REWARD_KEYS, Record, group_metrics, stage_metrics
from advmon.sinks.base import SinkLike
from advmon.sinks.jsonl import JsonlSink
from advmon.sinks.specs import parse_spec, sink_from_spec, sinks_from_env
from advmon.stats import HostPart, Part, pack, summarize

__all__ = ["Monitor", "get_monitor", "set_monitor"]

F = TypeVar("F", bound=Callable[..., Any])

#: Stages whose keys every record carries, in this order.
CORE_STAGES = ("pre_norm", "post_norm")


def default_run_id() -> str:
    """A readable, unique-enough run id: ``run-YYYYmmdd-HHMMSS-xxxx``."""
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class Monitor:
    """Records advantage, reward and group statistics of watched estimator calls.

    Args:
        run: the run id, used by sinks and as the JSONL file name (default: a
            readable generated id such as ``run-20261202-181533-4f2a``).
        sinks: where records go: objects with ``write(record)`` or spec strings
            (``"jsonl:PATH"``, ``"wandb:PROJECT"``, ``"mlflow:URI"``,
            ``"prometheus:HOST:PORT"``, ``"pushgateway:URL"``). Default: a
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
            :class:`advmon.emitter.DeliveryPolicy`).
        close_timeout: seconds :meth:`close` waits for queued records.
        alerts: evaluate the alert catalog in-process and notify: notifier specs
            (``"slack:SLACK_WEBHOOK_URL"``, ``"slack:/run/secrets/slack"``,
            ``"wandb-alert"``) or notifier objects. Runs on a delivery thread.
        alert_thresholds: overrides of the catalog's thresholds by name
            (``{"zero_std_ratio": 0.9}``; see ``docs/alerts.md``).

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
    ) -> None:
        if step_source is not None and not callable(step_source):
            raise AdvmonConfigError(f"step_source must be a callable returning the training step, got {step_source!r}")
        self.run = default_run_id() if run is None else _checked_run(run)
        self.reward_range = _checked_range(reward_range)
        self.strict = bool(strict)
        self._lock = threading.RLock()
        self.rank = global_rank()
        if reduce not in ("none", "ranks"):
            raise AdvmonConfigError(f"reduce must be 'none' or 'ranks', got {reduce!r}")
        self.reduce = reduce
        #: Whether this process records (global rank 0, every rank with all_ranks or reduce="ranks").
        self.enabled = bool(all_ranks) or self.rank == 0 or reduce == "ranks"
        self.close_timeout = float(close_timeout)
        policy = _checked_policy(queue_size, retries)
        self.sinks: list[SinkLike] = []
        if self.enabled and (reduce == "none" or self.rank == 0):
            jsonl_name = self.run if self.rank == 0 else f"{self.run}.rank{self.rank}"
            default = Path("advmon-runs") / f"{jsonl_name}.jsonl"
            self.sinks = [JsonlSink(default), *sinks_from_env(self.run)] if sinks is None else _checked_sinks(sinks, self.run)
            if alerts:
                self.sinks.append(_alert_sink(alerts, alert_thresholds))
        self._warned: set[str] = set()
        self._delivery = Delivery(self.sinks, self.run, policy, _weak_warner(self))
        # A monitor nobody closes must not leak its threads and files: close its
        # delivery when it is garbage-collected (interpreter exit has its own path).
        self._finalizer = weakref.finalize(self, self._delivery.close, min(self.close_timeout, 2.0))
        self._finalizer.atexit = False
        replayable = [s for s in self.sinks if not getattr(s, "synchronous", False) and getattr(s, "replayable", True)]
        if replayable and not any(isinstance(sink, JsonlSink) for sink in self.sinks):
            self._warn_sink(
                "no_jsonl",
                "no JSONL sink: records an asynchronous sink fails to take cannot be replayed later "
                "(add advmon.JsonlSink or 'jsonl:PATH')",
            )
        lifecycle.track(self)
        self._next_step = 0
        self._open_steps: set[_OpenStep] = set()  # steps open in any context, for close()
        self._step_source = step_source
        self._followed: tuple[int, list[CallParts]] | None = None
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
    ) -> Callable[[F], F]: ...

    def watch(
        self,
        fn: F | None = None,
        *,
        rewards: str | None = "rewards",
        mask: str | None = "mask",
        groups: str | None = "prompt_ids",
        group_size: int | None = None,
    ) -> F | Callable[[F], F]:
        """Decorate an estimator function or method; use bare or with argument names.

        Arguments are bound by name (positional and keyword calls both work);
        ``rewards``, ``mask`` and ``groups`` name the estimator's parameters
        (``None``: it has no such input), and ``group_size`` groups contiguous
        blocks instead.

        Example:
            >>> monitor = Monitor("doc", sinks=[])
            >>> @monitor.watch(rewards="token_level_rewards", mask="response_mask", groups="index")
            ... def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6):
            ...     scores = token_level_rewards.sum(-1)
            ...     return (scores - scores.mean()).unsqueeze(-1) * response_mask
            >>> compute_grpo_outcome_advantage.__name__
            'compute_grpo_outcome_advantage'
        """
        names = ArgumentNames(rewards=rewards, mask=mask, groups=groups, group_size=group_size)

        def decorate(function: F) -> F:
            return watch_with(function, self, names)

        return decorate(fn) if fn is not None else decorate

    def instrument(self, target: Any, method: str = "compute_advantage", **argument_names: Any) -> Any:
        """Wrap ``target.method`` (an estimator instance or class) in place; see :func:`advmon.instrument`."""
        return _instrument(target, self, method, _argument_names(argument_names))

    def observe(
        self,
        *,
        rewards: Any = None,
        advantages: Any = None,
        mask: Any = None,
        groups: Any = None,
        pre_norm: Any = None,
        group_size: int | None = None,
    ) -> None:
        """Record advantages computed inline, without a decorator (e.g. TRL's GRPOTrainer).

        Inside ``with monitor.step(n)`` this joins the step's record; otherwise it
        is a record of its own.

        Example:
            >>> monitor = Monitor("doc", sinks=[])
            >>> r = torch.tensor([1.0, 0.0, 1.0, 1.0])
            >>> monitor.observe(rewards=r, advantages=r - r.mean(), group_size=2)
            >>> monitor.last_metrics["groups/zero_std_count"]
            1.0
        """
        if self._refuse_closed():
            return
        problems: list[Problem] = []
        try:
            with torch.no_grad():
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
                    reward_range=self.reward_range,
                    problems=problems,
                    rewards_expected=False,
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
        current = self._step_in_context()
        if current is not None:
            raise AdvmonError(f"monitor.step({step}) inside monitor.step({current.step}): steps do not nest")
        # The step belongs to this context (thread, asyncio task): a call on another
        # thread is not silently folded into it. A worker pool joins on purpose by
        # running its work in contextvars.copy_context() taken inside the block.
        opened = _OpenStep(int(step))
        token = _OPEN_STEPS.set((*_OPEN_STEPS.get(), (self, opened)))
        with self._lock:
            self._open_steps.add(opened)
        failed = False
        try:
            yield self
        except BaseException:
            failed = True
            raise
        finally:
            _OPEN_STEPS.reset(token)
            with self._lock:
                self._open_steps.discard(opened)
                calls, opened.calls, opened.closed = opened.calls, [], True
                self._next_step = max(self._next_step, int(step) + 1)
            if calls or self.reduce == "ranks":
                # While the block's own exception propagates, advmon must not replace it.
                # Across ranks, a rank with no call still takes part in the step's gather.
                self._emit(int(step), calls, quiet=failed)

    def _step_in_context(self) -> _OpenStep | None:
        for monitor, opened in _OPEN_STEPS.get():
            if monitor is self and not opened.closed:
                return opened
        return None

    @property
    def last_metrics(self) -> dict[str, float]:
        """The latest record's metrics (``nan`` where unavailable), to merge into a trainer's own."""
        record = self._last_record
        return dict(record.metrics) if record is not None else {}

    @property
    def last_record(self) -> Record | None:
        """The latest record, or ``None`` before the first."""
        return self._last_record

    @property
    def internal_errors(self) -> int:
        """How many problems advmon met so far (also ``advmon/internal_errors``)."""
        return self._internal_errors

    def flush(self, timeout: float | None = None) -> None:
        """Emit the step a ``step_source`` monitor is still collecting and wait for
        asynchronous sinks to take what is queued (at most ``timeout`` seconds)."""
        self._emit_followed()
        self._delivery.flush(self.close_timeout if timeout is None else timeout)

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
            still_open = list(self._open_steps)
            for opened in still_open:
                opened.closed = True
        for opened in sorted(still_open, key=lambda o: o.step):
            calls, opened.calls = opened.calls, []
            if calls:
                self._emit(opened.step, calls)
        self._emit_followed()
        self._finalizer.detach()
        undelivered = self._delivery.close(self.close_timeout if timeout is None else timeout)
        files = [str(sink.path) for sink in self.sinks if isinstance(sink, JsonlSink)]
        where = (
            f"they are in {files[0]}: send them with 'advmon replay {files[0]} --to SPEC'"
            if files else "no JSONL sink keeps them: they are lost"
        )
        for name, count in undelivered.items():
            if count:
                self._warn_sink(
                    f"undelivered:{name}",
                    f"{count} record(s) of run {self.run} could not be delivered to sink {name} before close; {where}",
                )
        lifecycle.untrack(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Monitor(run={self.run!r}, sinks={self.sinks!r}, strict={self.strict})"

    # ------------------------------------------------------------------ hooks' side

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
            with torch.no_grad():
                call.seen = observe_inputs(
                    estimator=estimator,
                    rewards=call.inputs.get("rewards"),
                    mask=call.inputs.get("mask"),
                    groups=call.inputs.get("groups"),
                    group_size=names.group_size,
                    reward_range=self.reward_range,
                    problems=call.problems,
                    rewards_expected=names.rewards is not None,
                )
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the estimator's
            call.problems.append(_internal_problem(exc))
        return call

    def finish_call(self, call: ActiveCall, result: Any) -> None:
        """Observe a call that returned; never raises unless ``strict``."""
        try:
            with torch.no_grad():
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
            reward_range=self.reward_range,
            problems=call.problems,
        )
        parts.estimator_metrics = _numeric_metrics(estimator_metrics_of(result, call.owner), call.problems)
        return parts

    def _record_tap(self, call: ActiveCall, stage: str, tensor: Any, mask: Any) -> None:
        """Statistics of a tapped tensor, taken now (the estimator may change it next)."""
        try:
            if not isinstance(stage, str) or not stage.replace("_", "").isalnum():
                raise ObservationError("tap_stage", f"tap stage must be a word like 'pre_norm', got {stage!r}")
            with torch.no_grad():
                values = _required_tensor(tensor, stage)
                mask_t = as_tensor(mask, "mask") if mask is not None else _matching_mask(call, values)
                call.taps.setdefault(stage, []).append(tensor_part(values, mask_t))
        except ObservationError as error:
            call.problems.append(error.problem)
        except Exception as exc:  # noqa: BLE001 - advmon's own failure, never the estimator's
            call.problems.append(_internal_problem(exc))

    # ------------------------------------------------------------------ records

    def _add(self, parts: CallParts) -> None:
        opened = self._step_in_context()
        if opened is None and self._step_source is not None:
            self._follow(parts)
            return
        with self._lock:
            if opened is not None and not opened.closed:
                opened.calls.append(parts)
                return
            step = self._next_step
            self._next_step += 1
        self._emit(step, [parts])

    def _follow(self, parts: CallParts) -> None:
        """Aggregate by the step ``step_source`` gives; emit a step when the next begins."""
        try:
            step = int(self._step_source())  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - the user's callable failed
            self._report([Problem("step_source", f"step_source failed: {type(exc).__name__}: {exc}")])
            return
        with self._lock:
            finished = None
            if self._followed is not None and self._followed[0] != step:
                finished, self._followed = self._followed, None
            if self._followed is None:
                self._followed = (step, [])
            self._followed[1].append(parts)
        if finished is not None:
            self._emit(*finished)

    def _emit_followed(self) -> None:
        """Emit the step a ``step_source`` monitor is still collecting, if any."""
        with self._lock:
            followed, self._followed = self._followed, None
        if followed is not None:
            self._emit(*followed)

    def _emit(self, step: int, calls: list[CallParts], quiet: bool = False) -> None:
        try:
            record = self._build_record(step, calls, quiet)
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
        self._delivery.send(record)

    def _build_record(self, step: int, calls: list[CallParts], quiet: bool) -> Record | None:
        if self.reduce == "ranks":
            try:
                local = self._host_parts(calls)
            except Exception as exc:  # noqa: BLE001 - still take part in the gather, or every rank hangs
                self._report([_internal_problem(exc)], cause=exc, quiet=True)
                local = ({}, None, {}, [], [])
            gathered = _gather_to_rank_zero(local)
            if gathered is None:
                return None
            stage_parts, group_totals, estimator_metrics, estimators, sources = _merge_ranks(gathered)
            if not stage_parts and group_totals is None:
                return None  # no rank recorded anything this step
        else:
            stage_parts, group_totals, estimator_metrics, estimators, sources = self._host_parts(calls)
        return self._finish_record(step, stage_parts, group_totals, estimator_metrics, estimators, sources, quiet)

    def _host_parts(self, calls: list[CallParts]) -> tuple:
        """This process's parts of a step, on the host after one transfer."""
        tensors: list[torch.Tensor] = []
        for call in calls:
            for parts in call.stages.values():
                for part in parts:
                    tensors.extend(part.tensors)
            if call.groups is not None:
                tensors.append(call.groups)
            tensors.extend(v for v in call.estimator_metrics.values() if isinstance(v, torch.Tensor))
        arrays = iter(pack(tensors))  # the record's one crossing to the host

        stage_parts: dict[str, list[HostPart]] = {}
        group_totals: np.ndarray | None = None
        estimator_metrics: dict[str, float] = {}
        for call in calls:
            for stage, parts in call.stages.items():
                for part in parts:
                    host = HostPart(part.kind, tuple(next(arrays) for _ in part.tensors))
                    stage_parts.setdefault(stage, []).append(host)
            if call.groups is not None:
                counts = next(arrays)
                group_totals = counts.copy() if group_totals is None else merge_group_counts(group_totals, counts)
            for key, value in call.estimator_metrics.items():
                number = float(next(arrays)[0]) if isinstance(value, torch.Tensor) else float(value)
                estimator_metrics[f"estimator/{key}"] = number
        estimators = [call.estimator for call in calls]
        return stage_parts, group_totals, estimator_metrics, estimators, [call.pre_norm_source for call in calls]

    def _finish_record(self, step: int, stage_parts: dict[str, list[HostPart]], group_totals: np.ndarray | None,
                       estimator_metrics: dict[str, float], estimators: list[str], sources: list[str | None],
                       quiet: bool) -> Record:
        summaries = {stage: summarize(parts) for stage, parts in stage_parts.items()}
        problems = _record_problems(summaries, stage_parts)
        self._report(problems, quiet=quiet)

        metrics = stage_metrics("rewards", summaries.get("rewards", {}), REWARD_KEYS)
        extra_stages = sorted(set(summaries) - set(CORE_STAGES) - {"rewards"})
        for stage in (*CORE_STAGES, *extra_stages):
            metrics.update(stage_metrics(f"advantages/{stage}", summaries.get(stage, {})))
        metrics.update(group_metrics(None if group_totals is None else group_totals.tolist(), self.reward_range))
        metrics.update(estimator_metrics)
        metrics["advmon/internal_errors"] = float(self._internal_errors)
        metrics.update(self._delivery.counters())
        return Record(
            run=self.run,
            step=step,
            time=time.time(),
            estimator=",".join(dict.fromkeys(estimators)),
            pre_norm_source=_combined_source(sources),
            metrics=metrics,
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
        warn(f"advmon: {message} [{kind}; not repeated]", stacklevel=2)

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
            warn(
                f"advmon: {problem.message} [{problem.kind}; counted in advmon/internal_errors, "
                "not repeated]",
                stacklevel=4,
            )


def _record_problems(summaries: dict[str, dict[str, float]], parts: dict[str, list[HostPart]]) -> list[Problem]:
    post = summaries.get("post_norm")
    if post is None or post["count"] > 0:
        return []
    entries = sum(p.arrays[0].size if p.kind == "exact" else 1 for p in parts["post_norm"])
    if entries == 0:
        return []
    return [Problem("empty_mask", "the mask selects no position: post-normalization statistics are empty")]


@dataclass(eq=False)
class _OpenStep:
    """A ``monitor.step(n)`` block in flight, and the calls it gathered."""

    step: int
    calls: list[CallParts] = field(default_factory=list)
    closed: bool = False


#: The steps open in this context, as (monitor, step) pairs.
_OPEN_STEPS: ContextVar[tuple[tuple[Monitor, _OpenStep], ...]] = ContextVar("advmon_open_steps", default=())


def _gather_to_rank_zero(payload: Any) -> list[Any] | None:
    """Every rank's payload on rank 0 (``None`` elsewhere); just ``[payload]`` without torch.distributed."""
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return [payload]
    gathered = [None] * distributed.get_world_size() if distributed.get_rank() == 0 else None
    distributed.gather_object(payload, gathered, dst=0)
    return gathered


def _merge_ranks(gathered: list[Any]) -> tuple:
    """Merge every rank's host parts as the chunks of one step are merged (ranks in order)."""
    stage_parts: dict[str, list[HostPart]] = {}
    group_totals: np.ndarray | None = None
    estimator_metrics: dict[str, float] = {}
    estimators: list[str] = []
    sources: list[str | None] = []
    for parts, totals, metrics, names, rank_sources in gathered:
        for stage, host_parts in parts.items():
            stage_parts.setdefault(stage, []).extend(host_parts)
        if totals is not None:
            group_totals = totals.copy() if group_totals is None else merge_group_counts(group_totals, totals)
        for key, value in metrics.items():
            estimator_metrics.setdefault(key, value)  # rank 0's value first
        estimators += names
        sources += rank_sources
    return stage_parts, group_totals, estimator_metrics, estimators, sources


def _combined_source(pre_norm_sources: list[str | None]) -> str | None:
    sources = set(pre_norm_sources) - {None}
    if not sources:
        return None
    return sources.pop() if len(sources) == 1 else "mixed"


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


def _required_tensor(value: Any, name: str) -> torch.Tensor:
    tensor = as_tensor(value, name)
    if tensor is None:
        raise ObservationError(f"{name}_type", f"{name} is None")
    return tensor


def _matching_mask(call: ActiveCall, values: torch.Tensor) -> torch.Tensor | None:
    mask = call.seen.mask if call.seen is not None else None
    return mask if mask is not None and tuple(mask.shape) == tuple(values.shape) else None


def _argument_names(names: dict[str, Any]) -> ArgumentNames:
    unknown = set(names) - {"rewards", "mask", "groups", "group_size"}
    if unknown:
        raise AdvmonConfigError(
            f"unknown argument name option(s) {sorted(unknown)}; expected rewards=, mask=, groups=, group_size="
        )
    return ArgumentNames(**names)


def _internal_problem(exc: BaseException) -> Problem:
    return Problem("internal", f"internal error {type(exc).__name__}: {exc}")


#: Longest run id (in UTF-8 bytes): file systems allow 255 per name, suffixes need the rest.
MAX_RUN_BYTES = 200


def _checked_run(run: Any) -> str:
    if not isinstance(run, str) or not run.strip():
        raise AdvmonConfigError(f"run must be a non-empty string, got {run!r}")
    if any(c in run for c in "/\\\0") or run in {".", ".."}:
        raise AdvmonConfigError(f"run {run!r} must not contain path separators (it names the JSONL file)")
    if len(run.encode("utf-8")) > MAX_RUN_BYTES:
        # It names files ("<run>.rank<N>.jsonl"): longer names fail on every write later.
        raise AdvmonConfigError(
            f"run names a file, so it must be at most {MAX_RUN_BYTES} bytes; got {len(run.encode('utf-8'))} "
            f"({run[:40]!r}...)"
        )
    return run


def _alert_sink(alerts: Sequence[Any], thresholds: Mapping[str, float] | None) -> SinkLike:
    from advmon.alerts.sink import AlertSink
    from advmon.sinks.specs import notifiers_from_specs

    if isinstance(alerts, (str, bytes)) or not isinstance(alerts, Sequence):
        raise AdvmonConfigError(f"alerts must be a list of notifier specs or notifiers, got {type(alerts).__name__}")
    specs = [a for a in alerts if isinstance(a, str)]
    objects = [a for a in alerts if not isinstance(a, str)]
    for notifier in objects:
        if not callable(getattr(notifier, "send", None)):
            raise AdvmonConfigError(f"{notifier!r} is not a notifier: it has no send(message) method")
    return AlertSink([*notifiers_from_specs(specs), *objects], thresholds)


def _checked_sinks(sinks: Sequence[SinkLike | str], run: str) -> list[SinkLike]:
    if isinstance(sinks, (str, bytes)) or not isinstance(sinks, Sequence):
        raise AdvmonConfigError(f"sinks must be a list of sinks or sink specs, got {type(sinks).__name__}")
    for sink in sinks:
        if isinstance(sink, str):
            parse_spec(sink)  # every error before any sink starts a server
        elif not callable(getattr(sink, "write", None)):
            raise AdvmonConfigError(f"{sink!r} is not a sink: it has no write(record) method")
    return [sink_from_spec(s, run) if isinstance(s, str) else s for s in sinks]


def _checked_policy(queue_size: Any, retries: Any) -> DeliveryPolicy:
    for name, value, least in (("queue_size", queue_size, 1), ("retries", retries, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise AdvmonConfigError(f"{name} must be an int >= {least}, got {value!r}")
    return DeliveryPolicy(capacity=queue_size, retries=retries)


def global_rank() -> int:
    """This process's global rank: ``torch.distributed`` if initialized, else ``RANK``, else 0."""
    distributed = getattr(torch, "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


#: Kept for compatibility: interpreter exit is :func:`advmon.lifecycle.close_all`.
close_live_monitors = lifecycle.close_all


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


def _checked_range(reward_range: Any) -> tuple[float, float] | None:
    if reward_range is None:
        return None
    try:
        low, high = (float(v) for v in reward_range)
    except (TypeError, ValueError):
        raise AdvmonConfigError(f"reward_range must be (lo, hi), got {reward_range!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise AdvmonConfigError(f"reward_range must be finite with lo < hi, got {reward_range!r}")
    return (low, high)


def get_monitor() -> Monitor:
    """The process-wide default monitor behind :func:`advmon.watch`, created on first use."""
    return lifecycle.default_monitor()


def set_monitor(monitor: Monitor | None) -> Monitor | None:
    """Make ``monitor`` the process-wide default; returns the previous one."""
    if monitor is not None and not isinstance(monitor, Monitor):
        raise AdvmonConfigError(f"expected a Monitor, got {type(monitor).__name__}")
    return lifecycle.set_default(monitor)


lifecycle.set_default_factory(Monitor)
