"""Recorded runs, read back from wherever advmon's sinks wrote them.

One interface, :func:`read_run`, over four sources:

* an advmon JSONL file: ``advmon-runs/tp2.jsonl`` (``FILE#RUN`` picks one run of a
  file holding several);
* an MLflow run: ``mlflow+TRACKING_URI#RUN`` where ``RUN`` is an MLflow run id or
  the ``advmon.run`` tag advmon sets (``mlflow+sqlite:///mlflow.db#grpo-tp2``,
  ``mlflow+http://127.0.0.1:5000#4f2a...``);
* a W&B offline run: its directory (``wandb/offline-run-...``) or its ``.wandb`` file;
* a TensorBoard run: ``tb+DIR``, the run's event-file directory (``tb+runs/grpo-tp2``).

Each gives the records advmon emitted, in step order: the same steps and metrics
whichever sink wrote them (values W&B and MLflow cannot store, NaN and Inf, come
back as ``nan``; MLflow keeps no estimator name, W&B keeps one row per step).

Example:
    >>> import tempfile, os
    >>> from advmon.record import Record
    >>> from advmon.sinks.jsonl import JsonlSink
    >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
    >>> sink = JsonlSink(path); sink.write(Record("r", 0, 1.0, "e", None, {"rewards/mean": 0.5})); sink.close()
    >>> run = read_run(path)
    >>> run.name, run.steps, run.records[0].metrics["rewards/mean"]
    ('r', [0], 0.5)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from advmon.errors import AdvmonConfigError
from advmon.record import Record

__all__ = ["Run", "RunSourceError", "read_run"]

#: Key prefixes that are advmon's (other keys of a shared W&B/MLflow run are the trainer's).
ADVMON_PREFIXES = ("rewards/", "advantages/", "groups/", "estimator/", "advmon/")


class RunSourceError(AdvmonConfigError):
    """A run that cannot be read: missing, unreadable, empty or ambiguous."""


@dataclass(frozen=True)
class Run:
    """A recorded run: its name, where it came from, its records in step order."""

    name: str
    source: str
    records: list[Record]

    @property
    def steps(self) -> list[int]:
        return [r.step for r in self.records]

    @property
    def estimator(self) -> str:
        names = [r.estimator for r in self.records if r.estimator]
        return ",".join(dict.fromkeys(",".join(names).split(","))) if names else "unknown"

    @property
    def normalizations(self) -> dict[str, int]:
        """How the run's advantages were normalized (``kind (declared)``) and in how many records; empty for
        sources that do not keep it (only JSONL does)."""
        counts: dict[str, int] = {}
        for record in self.records:
            if record.normalization is not None:
                label = f"{record.normalization} ({record.normalization_source})"
                counts[label] = counts.get(label, 0) + 1
        return counts


def read_run(source: str | Path) -> Run:
    """Read one run from a JSONL file, an MLflow run, a W&B offline run or TensorBoard files (see the module doc)."""
    text = str(source)
    if text.startswith("tb+"):
        from advmon.runs.tensorboard import read_tensorboard_run

        return _checked(read_tensorboard_run(Path(text.removeprefix("tb+"))), text)
    if text.startswith("mlflow+"):
        from advmon.runs.mlflow import read_mlflow_run

        uri, _, run = text.removeprefix("mlflow+").rpartition("#")
        if not uri or not run:
            raise RunSourceError(f"expected mlflow+TRACKING_URI#RUN_ID_OR_ADVMON_RUN, got {text!r}")
        return _checked(read_mlflow_run(uri, run), text)
    path_text, _, wanted = text.partition("#")
    path = Path(path_text)
    if not path.exists():
        raise RunSourceError(f"{path}: no such file or directory")
    if path.is_dir() or path.suffix == ".wandb":
        from advmon.runs.wandb import read_wandb_run

        return _checked(read_wandb_run(path), text)
    return _checked(_read_jsonl_run(path, wanted or None), text)


def _read_jsonl_run(path: Path, wanted: str | None) -> Run:
    from advmon.sinks.jsonl import one_history, read_jsonl

    records = one_history(read_jsonl(path, progress_label=f"read {path.name}"), str(path))
    runs = list(dict.fromkeys(r.run for r in records))
    if wanted is None:
        if len(runs) > 1:
            raise RunSourceError(f"{path} holds runs {', '.join(runs)}: name one as {path}#RUN")
        wanted = runs[0] if runs else path.stem
    elif wanted not in runs:
        raise RunSourceError(f"{path} has no run {wanted!r} (it holds {', '.join(runs) or 'no records'})")
    return Run(wanted, str(path), sorted((r for r in records if r.run == wanted), key=lambda r: r.step))


def _checked(run: Run, source: str) -> Run:
    if not run.records:
        raise RunSourceError(f"{source}: the run has no records")
    return run
