"""Metrics from ``Module.log``: per-step values, epoch aggregation, syncing, and where they go.

Values stay tensors on their device until something needs a number (the progress bar, a logger
write every ``log_every_n_steps``, epoch end), so logging adds no per-step device synchronisation.
Epoch means are weighted by batch size and, with ``sync_dist=True``, reduced across processes as
``sum(value * n) / sum(n)``: the exact mean over the whole epoch, not a mean of per-rank means.

Step values logged in validation or test (``self.log(..., on_step=True)`` in ``validation_step``)
reach the loggers after each batch, as in Lightning: under ``<name>_step`` (``<name>`` when
``on_epoch=False``), at a step that counts the evaluation batches of that dataloader (not
``global_step``; it keeps counting across the validations of one fit), without an ``epoch`` column.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from phalanx.errors import MisconfigurationError
from phalanx.hooks import LOG_DEFAULTS

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["MetricStore"]

_REDUCTIONS = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
# Python's max/min/sum name the same reductions (Lightning accepts reduce_fx=max too).
_TORCH_REDUCTIONS = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min", max: "max", min: "min",
                     sum: "sum"}  # fmt: skip


@dataclass
class _Metric:
    key: str
    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    reduce: str
    sync_dist: bool
    step_value: torch.Tensor | None = None
    total: torch.Tensor | None = None
    weight: float = 0.0


def _reduction(reduce_fx: Any) -> str:
    name = _REDUCTIONS.get(reduce_fx) if isinstance(reduce_fx, str) else _TORCH_REDUCTIONS.get(reduce_fx)
    if name is None:
        msg = (
            f"self.log(..., reduce_fx={reduce_fx!r}) is not supported; use 'mean', 'sum', 'max' or 'min' "
            "(or torch.mean/sum/max/min)."
        )
        raise MisconfigurationError(msg)
    return name


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            msg = (
                f"self.log({name!r}, ...) got a tensor of shape {tuple(value.shape)}; only scalars can be "
                "logged. Reduce it first, e.g. value.mean()."
            )
            raise MisconfigurationError(msg)
        tensor = value.detach().reshape(())
        return tensor if tensor.is_floating_point() else tensor.float()
    if isinstance(value, numbers.Real):
        return torch.tensor(float(value))
    msg = (
        f"self.log({name!r}, value) got {type(value).__name__}; log a Python number or a one-element "
        "tensor (use log_dict for several values)."
    )
    raise MisconfigurationError(msg)


def _forked(key: str, word: str) -> str:
    """``key`` with Lightning's ``_step`` / ``_epoch`` suffix, placed before a ``/dataloader_idx_N`` suffix."""
    base, sep, index = key.rpartition("/dataloader_idx_")
    if sep and index.isdigit():
        return f"{base}_{word}{sep}{index}"
    return f"{key}_{word}"


def _batch_size(batch: Any) -> int:
    """First dimension of the first tensor in ``batch`` (1 when there is none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.size(0)) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _batch_size(item)
            if size:
                return size
        return 1
    return 1


class MetricStore:
    """Collects ``self.log`` calls per stage and publishes them (to callbacks, the bar, the loggers).

    Args:
        trainer: The Trainer, through its public view (world size, strategy, loggers, position).
    """

    def __init__(self, trainer: TrainerView) -> None:
        self.trainer = trainer
        self.stores: dict[str, dict[str, _Metric]] = {"train": {}, "validate": {}, "test": {}}
        self.stage = "train"
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.logged_metrics: dict[str, float] = {}
        self.progress_bar: dict[str, torch.Tensor] = {}
        #: Step values logged since the last flush (the loop flushes only when there are some).
        self.step_updates: list[_Metric] = []
        self._logger_pending: dict[str, torch.Tensor] = {}
        self._eval_step_pending: dict[str, torch.Tensor] = {}
        self._epoch_log: dict[str, torch.Tensor] = {}
        self._batch: Any = None
        self._batch_size: int | None = None
        self._dataloader_idx: int | None = None

    # ------------------------------------------------------------------ recording
    def begin_batch(self, batch: Any, dataloader_idx: int | None = None) -> None:
        """Remember the batch (for batch-size inference) and its dataloader index (for key suffixes)."""
        self._batch = batch
        self._batch_size = None
        self._dataloader_idx = dataloader_idx

    def log(
        self,
        fx: str | None,
        name: str,
        value: Any,
        *,
        prog_bar: bool,
        logger: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        reduce_fx: Any,
        sync_dist: bool,
        batch_size: int | None,
        add_dataloader_idx: bool,
    ) -> None:
        """Record one ``Module.log`` call made from hook ``fx``."""
        defaults = LOG_DEFAULTS.get(fx) if fx is not None else None
        if defaults is None:
            msg = (
                f"self.log({name!r}, ...) was called from {fx or 'outside the Trainer'!s}, where logging is not "
                f"supported. Log from training_step/validation_step/test_step or the hooks around them."
            )
            raise MisconfigurationError(msg)
        if not isinstance(name, str) or not name:
            msg = f"self.log(name={name!r}, ...) needs a non-empty string name."
            raise MisconfigurationError(msg)
        on_step = defaults[0] if on_step is None else bool(on_step)
        on_epoch = defaults[1] if on_epoch is None else bool(on_epoch)
        if not on_step and not on_epoch:
            msg = f"self.log({name!r}, ..., on_step=False, on_epoch=False) records nothing; set one of them to True."
            raise MisconfigurationError(msg)
        reduce = _reduction(reduce_fx)
        tensor = _as_tensor(name, value)
        key = name
        if add_dataloader_idx and self._dataloader_idx is not None:
            key = f"{name}/dataloader_idx_{self._dataloader_idx}"
        store = self.stores[self.stage]
        # One aggregate per hook and name, as Lightning's results: a name logged per step in
        # training_step and again in on_train_epoch_end is two metrics (the later one publishes last).
        slot = f"{fx}.{key}"
        metric = store.get(slot)
        if metric is None:
            metric = store[slot] = _Metric(key, on_step, on_epoch, prog_bar, logger, reduce, sync_dist)
        elif metric.reduce != reduce or metric.on_step != on_step or metric.on_epoch != on_epoch:
            msg = (
                f"self.log({name!r}, ...) was called with on_step={on_step}, on_epoch={on_epoch}, reduce_fx={reduce!r} "
                f"but earlier with on_step={metric.on_step}, on_epoch={metric.on_epoch}, reduce_fx={metric.reduce!r}; "
                "use the same options for a name (or another name)."
            )
            raise MisconfigurationError(msg)
        if on_step:
            step_value = tensor
            if sync_dist and self.trainer.world_size > 1:
                step_value = self.trainer.strategy.reduce(tensor, reduce_op=reduce)
            metric.step_value = step_value
            self.step_updates.append(metric)
        if on_epoch:
            self._accumulate(metric, tensor, batch_size)

    def _accumulate(self, metric: _Metric, value: torch.Tensor, batch_size: int | None) -> None:
        if metric.reduce == "mean":
            if batch_size is None:
                if self._batch_size is None:
                    self._batch_size = _batch_size(self._batch)
                batch_size = self._batch_size
            weighted = value * batch_size
            metric.total = weighted if metric.total is None else metric.total + weighted
            metric.weight += batch_size
        elif metric.total is None:
            metric.total = value
        elif metric.reduce == "sum":
            metric.total = metric.total + value
        elif metric.reduce == "max":
            metric.total = torch.maximum(metric.total, value)
        else:
            metric.total = torch.minimum(metric.total, value)

    # ------------------------------------------------------------------ publishing
    def flush_step(self) -> None:
        """Publish this batch's step values to ``callback_metrics``, the bar and the logger buffer."""
        for metric in self.step_updates:
            key = _forked(metric.key, "step") if metric.on_epoch else metric.key
            self.callback_metrics[key] = metric.step_value  # type: ignore[assignment]
            if metric.prog_bar:
                self.progress_bar[key] = metric.step_value  # type: ignore[assignment]
            if metric.logger:
                pending = self._logger_pending if self.stage == "train" else self._eval_step_pending
                pending[key] = metric.step_value  # type: ignore[assignment]
        self.step_updates.clear()

    def log_eval_step_metrics(self, step: int) -> None:
        """Send this evaluation batch's step values to the loggers at ``step`` (Lightning's per-dataloader count).

        Nothing is written during the sanity check; like Lightning, no ``epoch`` column is added.
        """
        pending, self._eval_step_pending = self._eval_step_pending, {}
        if pending:
            self._write(pending, step, add_epoch=False)

    def log_step_metrics(self, step: int) -> None:
        """Send buffered step values to the loggers (called every ``log_every_n_steps``)."""
        if self._logger_pending:
            self._write(self._logger_pending, step)
            self._logger_pending = {}

    def _compute(self, metric: _Metric) -> torch.Tensor:
        assert metric.total is not None
        sync = metric.sync_dist and self.trainer.world_size > 1
        strategy = self.trainer.strategy
        if metric.reduce == "mean":
            total = metric.total
            weight = torch.tensor(metric.weight, dtype=total.dtype, device=total.device)
            if sync:
                total = strategy.reduce(total, reduce_op="sum")
                weight = strategy.reduce(weight, reduce_op="sum")
            return total / weight
        return strategy.reduce(metric.total, reduce_op=metric.reduce) if sync else metric.total

    def epoch_end_reached(self, stage: str) -> None:
        """Publish ``stage``'s epoch aggregates so far to ``callback_metrics``, before the epoch-end hooks.

        Lightning computes them when read, so a callback's ``on_train_epoch_end`` /
        ``on_validation_epoch_end`` finds ``callback_metrics["val_loss"]``; :meth:`epoch_end` runs
        after the hooks (it also counts what they log) and is what the loggers receive.
        """
        for metric in self.stores[stage].values():
            if metric.on_epoch and metric.total is not None:
                value = self._compute(metric)
                key = _forked(metric.key, "epoch") if metric.on_step else metric.key
                self.callback_metrics[key] = value
                if metric.on_step:
                    self.callback_metrics[metric.key] = value
                if metric.prog_bar:  # the bar's on_train_epoch_end shows the epoch's values, as Lightning's
                    self.progress_bar[key] = value

    def epoch_end(self, stage: str, *, write: bool = True) -> dict[str, torch.Tensor]:
        """Aggregate ``stage``'s epoch metrics and publish them; write them to the loggers now or,
        with ``write=False``, at :meth:`write_epoch` (after the epoch-end callbacks ran)."""
        self.flush_step()
        self._eval_step_pending = {}  # step values belong to a batch; none is left at epoch end
        published: dict[str, torch.Tensor] = {}
        to_log: dict[str, torch.Tensor] = {}
        for metric in self.stores[stage].values():
            if not metric.on_epoch or metric.total is None:
                continue
            value = self._compute(metric)
            key = _forked(metric.key, "epoch") if metric.on_step else metric.key
            published[key] = value
            self.callback_metrics[key] = value
            if metric.on_step:
                self.callback_metrics[metric.key] = value
            if metric.prog_bar:
                self.progress_bar[key] = value
            if metric.logger:
                to_log[key] = value
        if stage == "train":
            to_log = {**self._logger_pending, **to_log}
            self._logger_pending = {}
        self._epoch_log = to_log
        if write:
            self.write_epoch()
        return published

    def write_epoch(self) -> None:
        """Send the last aggregated epoch metrics to the loggers."""
        if self._epoch_log:
            self._write(self._epoch_log, max(self.trainer.global_step - 1, 0))
        self._epoch_log = {}

    def _write(self, metrics: dict[str, torch.Tensor], step: int, *, add_epoch: bool = True) -> None:
        trainer = self.trainer
        # Every rank calls its loggers, as Lightning: phalanx's loggers write on global rank 0 only
        # (rank_zero_only), one that logs per rank decides for itself.
        if not trainer.loggers or trainer.sanity_checking:
            return
        numbers_only = {key: float(value) for key, value in metrics.items()}
        if add_epoch:
            numbers_only["epoch"] = float(trainer.current_epoch)
        self.logged_metrics.update(numbers_only)
        for logger in trainer.loggers:
            logger.log_metrics(numbers_only, step)

    def reset(self, stage: str) -> None:
        """Forget ``stage``'s accumulated values (start of an epoch or evaluation run)."""
        self.stores[stage] = {}
        self.step_updates.clear()
        self._eval_step_pending = {}

    @staticmethod
    def results(published: dict[str, torch.Tensor], num_dataloaders: int) -> list[dict[str, float]]:
        """Per-dataloader result dicts as returned by ``validate``/``test``."""
        results: list[dict[str, float]] = [{} for _ in range(max(num_dataloaders, 1))]
        for key, value in published.items():
            number = float(value)
            _, sep, index = key.rpartition("/dataloader_idx_")
            if sep and index.isdigit() and int(index) < len(results):
                results[int(index)][key] = number
            else:
                for result in results:
                    result[key] = number
        return results

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """The training epoch's partial aggregates, so a mid-epoch resume reports full-epoch values."""
        return {
            slot: {
                "key": m.key,
                "on_step": m.on_step,
                "on_epoch": m.on_epoch,
                "prog_bar": m.prog_bar,
                "logger": m.logger,
                "reduce": m.reduce,
                "sync_dist": m.sync_dist,
                "total": m.total,
                "weight": m.weight,
            }
            for slot, m in self.stores["train"].items()
            if m.on_epoch and m.total is not None
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Restore what :meth:`state_dict` saved, on ``device``."""
        store: dict[str, _Metric] = {}
        for slot, item in (state or {}).items():
            total = item["total"].to(device) if isinstance(item["total"], torch.Tensor) else None
            store[slot] = _Metric(
                item.get("key", slot),  # checkpoints before per-hook slots keyed by the name alone
                item["on_step"],
                item["on_epoch"],
                item["prog_bar"],
                item["logger"],
                item["reduce"],
                item["sync_dist"],
                total=total,
                weight=float(item["weight"]),
            )
        self.stores["train"] = store
