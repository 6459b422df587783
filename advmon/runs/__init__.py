"""Recorded runs, read back from wherever advmon's sinks wrote them.

One interface, :func:`read_run`, over five sources:

* an advmon JSONL file: ``advmon-runs/tp2.jsonl`` (``FILE#RUN`` picks one run of a
  file holding several);
* an MLflow run: ``mlflow+TRACKING_URI#RUN`` where ``RUN`` is an MLflow run id or
  the ``advmon.run`` tag advmon sets (``mlflow+sqlite:///mlflow.db#grpo-tp2``,
  ``mlflow+http://127.0.0.1:5000#4f2a...``);
* a W&B offline run: its directory (``wandb/offline-run-...``) or its ``.wandb`` file;
* a TensorBoard run: ``tb+DIR``, the run's event-file directory (``tb+runs/grpo-tp2``), or the
  log directory given to the sink when it holds one run;
* a trackio run: ``trackio+PROJECT#RUN`` in trackio's local store (``TRACKIO_DIR``, by default
  ``~/.cache/huggingface/trackio``), or ``trackio+PATH/PROJECT.db#RUN`` (the project's SQLite file).

Each gives the records advmon emitted, in step order: the same steps and metrics
whichever sink wrote them (values W&B and MLflow cannot store, NaN and Inf, come
back as ``nan``, trackio keeps them; MLflow and trackio keep no estimator name, W&B
keeps one row per step).

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

__all__ = ["Run", "RunSourceError", "SOURCE_FORMS", "read_run", "read_runs"]

#: The forms a run's source takes, as the CLI's help lists them.
SOURCE_FORMS = ("FILE.jsonl (FILE.jsonl#RUN for one of several runs in it), mlflow+TRACKING_URI#RUN_ID_OR_NAME, "
                "a W&B offline run directory (wandb/offline-run-...) or its .wandb file, tb+DIR (TensorBoard event files), "
                "trackio+PROJECT#RUN or trackio+PATH/PROJECT.db#RUN (trackio's local store)")

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
    """Read one run from a JSONL file, an MLflow run, a W&B offline run, TensorBoard files or trackio (see the module doc)."""
    text = str(source)
    if _jsonl_file(text):  # a file advmon wrote, whatever its run's name looks like (tb+..., mlflow+...)
        return _checked(_read_jsonl_run(Path(text), None), text)
    if text.startswith("trackio+"):
        from advmon.runs.trackio import read_trackio_run

        store, _, run = text.removeprefix("trackio+").rpartition("#")
        if not store or not run:
            raise RunSourceError(f"expected trackio+PROJECT#RUN or trackio+PATH/PROJECT.db#RUN, got {text!r}")
        return _checked(read_trackio_run(store, run), text)
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
    if path.is_dir():
        return _checked(_read_directory_run(path), text)
    if path.suffix == ".wandb":
        from advmon.runs.wandb import read_wandb_run

        return _checked(read_wandb_run(path), text)
    return _checked(_read_jsonl_run(path, wanted or None), text)


def read_runs(source: str | Path) -> list[Run]:
    """Every run a source holds: each run of a JSONL file, each of a directory's JSONL files, else :func:`read_run`'s one.

    What ``advmon summary`` and ``advmon alerts check`` read: ``advmon-runs/`` means
    every run in it, a file of several runs means all of them.

    Raises:
        RunSourceError: the source is missing, unreadable, holds no run, or holds no records.
    """
    text = str(source)
    path = Path(text)
    if _jsonl_file(text):
        return _runs_of_jsonl(path)
    if text.startswith(("tb+", "mlflow+", "trackio+")) or "#" in text or not path.is_dir() and path.suffix == ".wandb":
        return [read_run(text)]
    if not path.exists():
        raise RunSourceError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            return [read_run(text)]  # a W&B run directory, or the sentence that says what to pass
        return _runs_of_files(path, files)
    return _runs_of_jsonl(path)


def _jsonl_file(text: str) -> bool:
    """Whether ``text`` names a JSONL file that exists: read as one, even where its name looks like another form
    (a run named ``tb+x`` writes ``tb+x.jsonl``, and ``advmon-runs/`` read from inside lists it without a folder)."""
    path = Path(text)
    return path.suffix == ".jsonl" and path.is_file()


def _runs_of_jsonl(path: Path) -> list[Run]:
    """Every run of one JSONL file."""
    records = _read_jsonl_records(path)
    names = dict.fromkeys(r.run for r in records)
    return [Run(name, str(path), sorted((r for r in records if r.run == name), key=lambda r: r.step)) for name in names]


def _runs_of_files(directory: Path, files: list[Path]) -> list[Run]:
    """Every run of a directory's JSONL files; an empty file (a run that died before its first record) is skipped."""
    from advmon.errors import warn

    runs: list[Run] = []
    for file in files:
        try:
            runs.extend(read_runs(file))
        except RunSourceError as exc:
            if file.stat().st_size:
                raise
            warn(f"advmon: {exc}; skipped")
    if not runs:
        raise RunSourceError(f"{directory}: its JSONL files hold no advmon records")
    return runs


def _read_directory_run(path: Path) -> Run:
    """A directory as one run: a W&B run directory; else a sentence that says what to pass instead."""
    jsonl = sorted(path.glob("*.jsonl"))
    wandb_files = sorted(path.glob("run-*.wandb")) or sorted(path.glob("*/run-*.wandb"))
    if jsonl and not wandb_files:
        names = ", ".join(f.name for f in jsonl[:4]) + (", ..." if len(jsonl) > 4 else "")
        raise RunSourceError(f"{path} is a directory of {len(jsonl)} JSONL run file(s) ({names}): "
                             f"pass one of them, e.g. {jsonl[0]}")
    if len(wandb_files) > 1:
        names = ", ".join(str(f.parent) for f in wandb_files[:3]) + (", ..." if len(wandb_files) > 3 else "")
        raise RunSourceError(f"{path} holds {len(wandb_files)} W&B runs ({names}): pass one run's directory")
    if not wandb_files:
        hint = (f"it holds TensorBoard event files: pass tb+{path}" if any(path.glob("events.out.tfevents.*"))
                else f"pass one of: {SOURCE_FORMS}")
        raise RunSourceError(f"{path}: a directory with no advmon run in it; {hint}")
    from advmon.runs.wandb import read_wandb_run

    return read_wandb_run(path)


def _read_jsonl_records(path: Path) -> list[Record]:
    from advmon.sinks.jsonl import one_history, read_jsonl

    records = one_history(read_jsonl(path, progress_label=f"read {path.name}"), str(path))
    if not records:
        raise RunSourceError(f"{path}: no advmon records in it (the file is empty)")
    return records


def _read_jsonl_run(path: Path, wanted: str | None) -> Run:
    records = _read_jsonl_records(path)
    runs = list(dict.fromkeys(r.run for r in records))
    if wanted is None:
        if len(runs) > 1:
            raise RunSourceError(f"{path} holds runs {', '.join(runs)}: name one as {path}#RUN")
        wanted = runs[0]
    elif wanted not in runs:
        raise RunSourceError(f"{path} has no run {wanted!r} (it holds {', '.join(runs)})")
    return Run(wanted, str(path), sorted((r for r in records if r.run == wanted), key=lambda r: r.step))


def _checked(run: Run, source: str) -> Run:
    if not run.records:
        raise RunSourceError(f"{source}: the run has no records")
    return run
