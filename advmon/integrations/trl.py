"""TRL: record what ``GRPOTrainer`` computes, as TRL computes it, at the step TRL logs.

TRL (1.x) computes rewards and advantages inline in
``GRPOTrainer._generate_and_score_completions``: there is no estimator function to
watch, the method returns no rewards, and it returns only this process's slice of
the advantages. :class:`AdvmonGRPOMixin` therefore records around that method:

* **rewards** as TRL gathers them across processes (``_calculate_rewards``), summed
  over reward functions with TRL's weights (``nansum``); a row that no reward
  function scored (every function returned ``None``) is NaN, as in TRL's own
  ``reward`` metric, so it shows in ``rewards/nan_count``;
* **advantages** of every process, gathered in process order (TRL's
  ``process_slice`` order), so the record covers the whole generation batch;
* **groups** of ``num_generations`` consecutive rows (``num_generations_eval`` in
  evaluation), and how TRL normalized within them (``scale_rewards``,
  ``multi_objective_aggregation``: :mod:`advmon.normalization`'s kinds);
* at **TRL's logged step**: ``state.global_step + 1`` (TRL logs after the
  optimizer step that follows the generation). With ``steps_per_generation`` or
  ``num_iterations`` above 1, a batch is generated, and recorded, once every
  ``steps_per_generation * num_iterations`` steps.

Each reward function's scores (``rewards_per_func``, NaN where it returned ``None``)
become ``rewards/<function name>/...``, and a dataset column (``slice_column``,
``data_source`` by default, when every row has it) slices the record:
``slices/<value>/...`` (docs/drilldown.md).

Evaluation batches go to their own monitor (``eval_monitor``; by default a
monitor of run ``<run>-eval`` created on the first evaluation), aggregated per
training step, never into the training sequence. Every process takes part in the
gather; only the main process (rank 0) emits.

A monitor made with ``stop_on`` (``Monitor(..., stop_on="critical")``) stops the
training at the end of the step whose record fired a stopping alert: the mixin sets
TRL's ``control.should_training_stop`` there (after that step's optimizer update and
log, as any ``TrainerCallback`` would). With several processes, the main process's
decision reaches every process at that step: one small gather when training begins (does
any process's monitor have ``stop_on``?), then, if one does, one per step.

Example (with TRL installed)::

    from advmon.integrations.trl import MonitoredGRPOTrainer
    trainer = MonitoredGRPOTrainer(model=model, reward_funcs=[reward], args=config,
                                   train_dataset=dataset, monitor=advmon.Monitor("grpo-run"))
    trainer.train()

or, for a trainer class of your own: ``class MyTrainer(AdvmonGRPOMixin, GRPOTrainer): ...``.
"""

from __future__ import annotations

from typing import Any

import torch

from advmon.errors import AdvmonConfigError, warn
from advmon.lifecycle import current_default
from advmon.monitor import Monitor, get_monitor

__all__ = ["AdvmonGRPOMixin", "MonitoredGRPOTrainer"]


class AdvmonGRPOMixin:
    """Mix into a ``GRPOTrainer`` (first in the bases) to record each generation batch.

    Keyword arguments taken from the trainer's own: ``monitor`` (default: the
    process-wide monitor) and ``eval_monitor`` (default: ``Monitor(f"{run}-eval")``
    made on the first evaluation batch).
    """

    def __init__(self, *args: Any, monitor: Monitor | None = None, eval_monitor: Monitor | None = None,
                 slice_column: str | None = "data_source", **kwargs: Any) -> None:
        for given in (monitor, eval_monitor):
            if given is not None and given.reduce == "ranks":
                # The mixin gathers every process's advantages itself and only the main process
                # records: a collective on rank 0 alone would wait for the others forever.
                raise AdvmonConfigError("the TRL mixin gathers across processes itself: give it a Monitor "
                                        "with reduce='none' (the default)")
        self.advmon_monitor = monitor
        self.advmon_eval_monitor = eval_monitor
        self.advmon_slice_column = slice_column
        self._advmon_rewards_per_func: torch.Tensor | None = None
        self._advmon_slices: list[Any] | None = None
        self._advmon_share_stop = False
        super().__init__(*args, **kwargs)
        self.add_callback(_stop_callback(self))  # type: ignore[attr-defined]

    # The rewards TRL gathered across processes, caught on their way through.
    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
        rewards_per_func = super()._calculate_rewards(*args, **kwargs)  # type: ignore[misc]
        self._advmon_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
        self._advmon_rewards_per_func = None
        inputs = args[0] if args else kwargs.get("inputs")
        self._advmon_slices = self._advmon_local_labels(inputs)
        output = super()._generate_and_score_completions(*args, **kwargs)  # type: ignore[misc]
        try:
            self._advmon_record(output)
        except Exception as exc:  # noqa: BLE001 - advmon's failure must not stop training
            monitor = self.advmon_monitor
            if monitor is not None and monitor.strict:
                raise
            warn(f"advmon: could not record TRL's generation batch: {exc!r}")
        finally:
            self._advmon_rewards_per_func = None
        return output

    def _advmon_record(self, output: dict[str, Any]) -> None:
        # A collective: every process gathers, whether or not it records.
        advantages = self.accelerator.gather(output["advantages"].detach())  # type: ignore[attr-defined]
        if self._advmon_slices is not None and self.accelerator.num_processes > 1:  # type: ignore[attr-defined]
            from accelerate.utils import gather_object

            self._advmon_slices = gather_object(self._advmon_slices)
        if not self.accelerator.is_main_process:  # type: ignore[attr-defined]
            return
        rewards = self._advmon_weighted_rewards()
        batch = {"rewards": rewards, "advantages": advantages, "reward_functions": self._advmon_per_function(),
                 "slices": self._advmon_slices, "normalization": self._advmon_normalization()}
        step = int(self.state.global_step)  # type: ignore[attr-defined]
        if self.model.training:  # type: ignore[attr-defined]
            monitor = self._advmon_training_monitor()
            with monitor.step(step + 1):
                monitor.observe(group_size=self.num_generations, **batch)  # type: ignore[attr-defined]
            return
        # TRL before num_generations_eval evaluated with num_generations.
        group_size = getattr(self, "num_generations_eval", None) or self.num_generations  # type: ignore[attr-defined]
        evaluation = self._advmon_evaluation_monitor()
        if evaluation.step_source is not None:  # evaluation batches of one training step form one record
            evaluation.observe(group_size=group_size, **batch)
        else:
            with evaluation.step(step):
                evaluation.observe(group_size=group_size, **batch)

    def _advmon_normalization(self) -> str | None:
        """How TRL normalized the advantages (advmon.normalization), from ``scale_rewards`` and
        ``multi_objective_aggregation``: ``"group"`` divides by the group's std, ``"none"`` subtracts the group
        mean only (Dr. GRPO), ``"batch"`` divides by the batch's std; ``normalize_then_sum`` normalizes each
        function per group, sums, then whitens the sum over the batch."""
        if getattr(self, "multi_objective_aggregation", "sum_then_normalize") == "normalize_then_sum":
            return "batch"
        scale = getattr(self, "scale_rewards", "group")
        if isinstance(scale, bool):  # TRL before 0.22: True divided by the group's std
            return "group_std" if scale else "group_mean"
        return {"group": "group_std", "none": "group_mean", "batch": "batch"}.get(scale)

    def _advmon_local_labels(self, inputs: Any) -> list[Any] | None:
        """This process's rows' ``slice_column`` (``data_source`` by default), if every row has one.

        The column is decided on the first batch by every process alike (they share the
        dataset's columns), so each takes part in the gather or none does.
        """
        column = self.advmon_slice_column
        if column is None or not isinstance(inputs, list) or not inputs:
            return None
        if not all(isinstance(row, dict) and column in row for row in inputs):
            return None
        return [row[column] for row in inputs]

    def _advmon_per_function(self) -> dict[str, torch.Tensor] | None:
        """Each reward function's scores, NaN where it returned ``None`` (TRL's own ``rewards/<name>`` logs)."""
        per_function = self._advmon_rewards_per_func
        if per_function is None:
            return None
        names = list(getattr(self, "reward_func_names", []))
        if len(names) != per_function.shape[1]:
            names = [f"function_{i}" for i in range(per_function.shape[1])]
        return {name: per_function[:, i] for i, name in enumerate(names)}

    def _advmon_training_monitor(self) -> Monitor:
        return self.advmon_monitor if self.advmon_monitor is not None else get_monitor()

    def _advmon_weighted_rewards(self) -> torch.Tensor | None:
        """TRL's reward per completion: the weighted ``nansum`` over functions, NaN where none scored."""
        per_function = self._advmon_rewards_per_func
        if per_function is None:
            return None
        weights = self.reward_weights.to(per_function.device)  # type: ignore[attr-defined]
        rewards = (per_function * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_function).all(dim=1)] = torch.nan
        return rewards

    def _advmon_monitors(self) -> list[Monitor]:
        """The monitors this trainer records to, as they are now (none is created here)."""
        training = self.advmon_monitor if self.advmon_monitor is not None else current_default()
        return [m for m in (training, self.advmon_eval_monitor) if m is not None]

    def _advmon_stop_begin(self) -> None:
        """Whether the processes must share stop decisions: some process's monitor has ``stop_on`` (one gather)."""
        configured = any(m.stop_on for m in self._advmon_monitors())
        accelerator = self.accelerator  # type: ignore[attr-defined]
        if accelerator.num_processes > 1:
            flags = accelerator.gather(torch.tensor([float(configured)], device=accelerator.device))
            configured = bool(flags.max() > 0)
        self._advmon_share_stop = configured and accelerator.num_processes > 1

    def _advmon_should_stop(self) -> bool:
        """Whether a monitor asks to stop, as every process agrees (the main process decides)."""
        stop = any(m.should_stop for m in self._advmon_monitors())
        if self._advmon_share_stop:
            accelerator = self.accelerator  # type: ignore[attr-defined]
            stop = bool(accelerator.gather(torch.tensor([float(stop)], device=accelerator.device)).max() > 0)
        return stop

    def _advmon_evaluation_monitor(self) -> Monitor:
        if self.advmon_eval_monitor is None:
            train = self._advmon_training_monitor()
            self.advmon_eval_monitor = Monitor(
                f"{train.run}-eval", reward_range=train.reward_range,
                step_source=lambda: int(self.state.global_step),  # type: ignore[attr-defined]
            )
        return self.advmon_eval_monitor


def _stop_callback(trainer: AdvmonGRPOMixin) -> Any:
    """The ``TrainerCallback`` that ends training after a step whose record fired a stopping alert."""
    from transformers import TrainerCallback

    class AdvmonStopOnAlert(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            _quietly(trainer, trainer._advmon_stop_begin)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if _quietly(trainer, trainer._advmon_should_stop):
                control.should_training_stop = True

    return AdvmonStopOnAlert()


def _quietly(trainer: AdvmonGRPOMixin, action: Any) -> Any:
    """``action()``; advmon's own failure is a warning, never the trainer's exception (unless strict)."""
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - advmon's failure must not stop training
        monitor = trainer.advmon_monitor
        if monitor is not None and monitor.strict:
            raise
        warn(f"advmon: could not decide whether to stop TRL's training: {exc!r}")
        return None


def _trainer_class() -> type:
    from trl import GRPOTrainer

    class MonitoredGRPOTrainer(AdvmonGRPOMixin, GRPOTrainer):
        """TRL's ``GRPOTrainer`` recording to advmon: ``MonitoredGRPOTrainer(..., monitor=Monitor(...))``."""

        def train(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().train(*args, **kwargs)
            finally:
                for monitor in (self.advmon_monitor, self.advmon_eval_monitor):
                    if monitor is not None:
                        monitor.flush()

    MonitoredGRPOTrainer.__module__ = __name__
    return MonitoredGRPOTrainer


def __getattr__(name: str) -> Any:
    # TRL is imported only when the ready-made trainer is asked for.
    if name == "MonitoredGRPOTrainer":
        cls = _trainer_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
