"""Checks of what a user hands ``Monitor(...)``: one clear error, at once.

The configuration is the user's direct call, so a bad value raises
:class:`~advmon.errors.AdvmonConfigError` here rather than failing later, record
after record, inside the training loop.

Example:
    >>> checked_run("grpo-tp2")
    'grpo-tp2'
    >>> checked_run("run#1")
    Traceback (most recent call last):
    ...
    advmon.errors.AdvmonConfigError: run 'run#1' contains '#', which readers take for FILE#RUN: a run name names its JSONL file and is read back by every reader (advmon summary, report, compare, alerts check; FILE#RUN, mlflow+URI#RUN, trackio+PROJECT#RUN), so it is 1 to 200 UTF-8 bytes of printable characters, without '/', '\\' or '#', and does not start with '.' or '-'
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from advmon.config.specs import parse_spec, sink_from_spec
from advmon.errors import AdvmonConfigError
from advmon.sinks.base import SinkLike
from advmon.sinks.delivery import DeliveryPolicy

__all__ = ["MAX_RUN_BYTES", "RUN_RULE", "checked_policy", "checked_range", "checked_run", "checked_sinks", "default_run_id",
           "global_rank", "make_alert_sink"]


def default_run_id() -> str:
    """A readable, unique-enough run id: ``run-YYYYmmdd-HHMMSS-xxxx``."""
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


#: Longest run id (in UTF-8 bytes): file systems allow 255 per name, suffixes need the rest.
MAX_RUN_BYTES = 200


#: What a run name is, as ``Monitor(...)`` says when it refuses one.
RUN_RULE = ("a run name names its JSONL file and is read back by every reader (advmon summary, report, compare, "
            "alerts check; FILE#RUN, mlflow+URI#RUN, trackio+PROJECT#RUN), so it is 1 to 200 UTF-8 bytes of "
            "printable characters, without '/', '\\' or '#', and does not start with '.' or '-'")


def checked_run(run: Any) -> str:
    """``run`` if every reader can read it back (:data:`RUN_RULE`), else one error that says the rule."""
    if not isinstance(run, str) or not run.strip():
        raise AdvmonConfigError(f"run must be a non-empty string, got {run!r}")
    if any(c in run for c in "/\\\0") or run in {".", ".."}:
        raise AdvmonConfigError(f"run {run!r} must not contain path separators: {RUN_RULE}")
    unreadable = _unreadable_part(run)
    if unreadable:
        raise AdvmonConfigError(f"run {run!r} {unreadable}: {RUN_RULE}")
    if len(run.encode("utf-8")) > MAX_RUN_BYTES:
        # It names files ("<run>.rank<N>.jsonl"): longer names fail on every write later.
        raise AdvmonConfigError(
            f"run names a file, so it must be at most {MAX_RUN_BYTES} bytes; got {len(run.encode('utf-8'))} "
            f"({run[:40]!r}...): {RUN_RULE}"
        )
    return run


def _unreadable_part(run: str) -> str:
    """What in ``run`` a reader could not take back, in words; ``""`` if nothing."""
    import unicodedata

    if "#" in run:
        return "contains '#', which readers take for FILE#RUN"
    if run.startswith("."):
        return "starts with '.', which hides its file"
    if run.startswith("-"):
        return "starts with '-', which a command line takes for an option"
    for character in run:
        if unicodedata.category(character) in ("Cc", "Cs", "Zl", "Zp"):  # newline, tab, NUL, a lone surrogate
            return f"contains the unprintable character {character!r}"
    return ""


def make_alert_sink(alerts: Sequence[Any], thresholds: Mapping[str, float] | None, runbook_base: str = "",
                    dashboard_url: str = "") -> SinkLike:
    from advmon.alerts.sink import AlertSink
    from advmon.config.specs import notifiers_from_specs

    if isinstance(alerts, (str, bytes)) or not isinstance(alerts, Sequence):
        raise AdvmonConfigError(f"alerts must be a list of notifier specs or notifiers, got {type(alerts).__name__}")
    specs = [a for a in alerts if isinstance(a, str)]
    objects = [a for a in alerts if not isinstance(a, str)]
    for notifier in objects:
        if not callable(getattr(notifier, "send", None)):
            raise AdvmonConfigError(f"{notifier!r} is not a notifier: it has no send(message) method")
    for name, url in (("runbook_base", runbook_base), ("dashboard_url", dashboard_url)):
        if not isinstance(url, str):
            raise AdvmonConfigError(f"{name} must be a URL string, got {type(url).__name__}")
    return AlertSink([*notifiers_from_specs(specs), *objects], thresholds, runbook_base=runbook_base,
                     dashboard_url=dashboard_url)


def checked_sinks(sinks: Sequence[SinkLike | str], run: str) -> list[SinkLike]:
    if isinstance(sinks, (str, bytes)) or not isinstance(sinks, Sequence):
        raise AdvmonConfigError(f"sinks must be a list of sinks or sink specs, got {type(sinks).__name__}")
    for sink in sinks:
        if isinstance(sink, str):
            parse_spec(sink)  # every error before any sink starts a server
        elif not callable(getattr(sink, "write", None)):
            raise AdvmonConfigError(f"{sink!r} is not a sink: it has no write(record) method")
    return [sink_from_spec(s, run) if isinstance(s, str) else s for s in sinks]


def checked_policy(queue_size: Any, retries: Any) -> DeliveryPolicy:
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


def checked_exemplars(exemplars: Any) -> int:
    """How many worst groups a record keeps (0: none).

    Example:
        >>> checked_exemplars(-1)
        Traceback (most recent call last):
        ...
        advmon.errors.AdvmonConfigError: exemplars must be an int >= 0 (0 turns them off), got -1
    """
    if isinstance(exemplars, bool) or not isinstance(exemplars, int) or exemplars < 0:
        raise AdvmonConfigError(f"exemplars must be an int >= 0 (0 turns them off), got {exemplars!r}")
    return exemplars


def checked_max_slices(max_slices: Any) -> int:
    """How many slice labels keep their own keys in a run (the rest are folded into ``other``)."""
    if isinstance(max_slices, bool) or not isinstance(max_slices, int) or max_slices < 1:
        raise AdvmonConfigError(f"max_slices must be an int >= 1, got {max_slices!r}")
    return max_slices


def checked_range(reward_range: Any) -> tuple[float, float] | None:
    if reward_range is None:
        return None
    try:
        low, high = (float(v) for v in reward_range)
    except (TypeError, ValueError):
        raise AdvmonConfigError(f"reward_range must be (lo, hi), got {reward_range!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise AdvmonConfigError(f"reward_range must be finite with lo < hi, got {reward_range!r}")
    return (low, high)
