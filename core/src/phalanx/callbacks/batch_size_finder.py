"""BatchSizeFinder: find the largest batch size that trains without running out of memory.

Lightning's ``BatchSizeFinder``: the batch size lives in an attribute (``batch_size`` by default)
of the Module, its ``hparams`` or the DataModule, and ``train_dataloader()`` reads it. The finder
tries sizes, each for ``steps_per_trial`` training steps, and keeps the largest one that did not
raise an out-of-memory error:

- ``"power"``: double the size after every success; on the first OOM after a success, halve it and stop.
- ``"binsearch"``: double until the first OOM, then bisect between the last success and the failure.

Growth also stops once the size reaches the dataset's length (a bigger batch changes nothing) or
after ``max_trials`` trials. On CPU an OOM rarely happens, so the search usually ends there.

The search runs in the ``setup`` hook of fit: before the Trainer asks for the training dataloader,
so the fit that follows already trains with the size found. Each trial builds the dataloader
from the same hook the Trainer uses and runs real forward, backward and optimizer steps on the
strategy's device, inside the precision's context, with a throwaway optimizer from
``configure_optimizers``; the weights are put back afterwards. As in Lightning, the finder does not
support several processes (each would find its own size).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.lr_finder import _holder, _TunerExitException, get_attr, loss_of, muted_logging, set_attr
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.optim import init_optimizers_and_lr_schedulers
from phalanx.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["BatchSizeFinder"]

log = logging.getLogger(__name__)

_MODES = ("power", "binsearch")
_OOM_MESSAGES = (
    "CUDA out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "CUDA error: out of memory",
    "DefaultCPUAllocator: can't allocate memory",
)


def is_oom_error(error: BaseException) -> bool:
    """Whether ``error`` means the device ran out of memory (the errors Lightning's finder catches)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return (
        isinstance(error, RuntimeError) and len(error.args) == 1 and any(m in str(error.args[0]) for m in _OOM_MESSAGES)
    )


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class BatchSizeFinder(Callback):
    """Scale the batch size at the start of fit to the largest one that fits in memory.

    Args:
        mode: ``"power"`` or ``"binsearch"`` (see the module docstring).
        steps_per_trial: Training steps per trial size (one may not reveal an OOM, a few do).
        init_val: The first size tried.
        max_trials: At most this many successful growth trials.
        batch_arg_name: The attribute holding the batch size, looked up on the Module, in its
            ``hparams``, then on the DataModule.
        exit_after_search: End the stage right after the search (what :class:`phalanx.tuner.Tuner`
            uses; a phalanx addition, Lightning sets a private flag instead).

    Attributes:
        optimal_batch_size: The size found (the attribute is set to it), None before a search.

    Raises:
        MisconfigurationError: An invalid argument, a missing ``batch_arg_name`` attribute, training
            data that does not come from ``train_dataloader()``, or more than one process.
    """

    SUPPORTED_MODES = _MODES

    def __init__(
        self,
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        *,
        exit_after_search: bool = False,
    ) -> None:
        if mode not in _MODES:
            msg = f"BatchSizeFinder(mode={mode!r}) is invalid; valid values are {list(_MODES)}. Fix: pass mode='power'."
            raise MisconfigurationError(msg)
        for name, value in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"BatchSizeFinder({name}={value!r}) must be an int >= 1."
                raise MisconfigurationError(msg)
        self.mode = mode
        self.steps_per_trial = steps_per_trial
        self.init_val = init_val
        self.max_trials = max_trials
        self.batch_arg_name = batch_arg_name
        self.exit_after_search = exit_after_search
        self.optimal_batch_size: int | None = init_val

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Search before fit builds its dataloader, so the fit trains with the size found."""
        if stage != "fit":
            return
        self.scale_batch_size(trainer, pl_module)
        if self.exit_after_search:
            raise _TunerExitException

    def scale_batch_size(self, trainer: TrainerView, pl_module: Module) -> int | None:
        """Run the search, restore the weights, leave the attribute at the size found, and return it."""
        if trainer.fast_dev_run:
            rank_zero_warn("Skipping batch size scaler since `fast_dev_run` is enabled.")
            return None
        if trainer.world_size > 1:
            msg = (
                f"BatchSizeFinder does not support several processes (world_size={trainer.world_size}): each would "
                "find its own size. Fix: run the search with devices=1, then train with the size it found."
            )
            raise MisconfigurationError(msg)
        datamodule = trainer.datamodule
        if _holder(pl_module, self.batch_arg_name, datamodule) is None:
            msg = (
                f"BatchSizeFinder(batch_arg_name={self.batch_arg_name!r}) found no such attribute on "
                f"{type(pl_module).__qualname__}, its hparams or the DataModule. Fix: store the batch size in "
                f"self.{self.batch_arg_name} and read it in train_dataloader(), or pass batch_arg_name='<attribute>'."
            )
            raise MisconfigurationError(msg)
        source = self._data_source(pl_module, datamodule)
        saved = {key: value.detach().clone() for key, value in pl_module.state_dict().items()}
        was_training = pl_module.training

        def trial(size: int) -> bool:
            return self._trial(trainer, pl_module, source)

        try:
            pl_module.to(trainer.strategy.root_device)
            pl_module.train()
            with muted_logging(pl_module):
                size = self._search(pl_module, datamodule, source, trial)
        finally:
            pl_module.load_state_dict(saved)
            pl_module.zero_grad(set_to_none=True)
            pl_module.train(was_training)
            _free_memory()
        rank_zero_info(f"Finished the batch size finder; fit continues with batch size {size}.")
        self.optimal_batch_size = size
        return size

    # ------------------------------------------------------------------ the search
    def _search(
        self, pl_module: Module, datamodule: Any, source: Callable[[], Any], trial: Callable[[int], bool]
    ) -> int:
        """Lightning's power / binsearch scaling over ``trial(size) -> fits``."""
        name = self.batch_arg_name

        def adjust(current: int, new: int, desc: str | None = None) -> tuple[int, bool]:
            length = _dataset_length(source())
            if length is not None and current >= length:
                rank_zero_info(f"The batch size {current} is greater or equal than the length of your dataset.")
                return current, False
            if desc:
                rank_zero_info(f"Batch size {current} {desc}, trying batch size {new}")
            set_attr(pl_module, name, new, datamodule)
            return new, new != current

        size = self.init_val
        set_attr(pl_module, name, size, datamodule)
        if self.mode == "power":
            any_success = False
            for _ in range(self.max_trials):
                if self._fits(trial, size):
                    size, changed = adjust(size, size * 2, "succeeded")
                    if not changed:
                        break
                    any_success = True
                else:
                    size, _ = adjust(size, max(size // 2, 1), "failed")
                    if any_success:
                        break
            return int(get_attr(pl_module, name, datamodule))
        low, high, count = 1, 0, 0
        while True:
            if self._fits(trial, size):
                count += 1
                if count > self.max_trials:
                    break
                low = size
                if high:
                    if high - low <= 1:
                        break
                    size, changed = adjust(size, (high + low) // 2, "succeeded")
                else:
                    size, changed = adjust(size, size * 2, "succeeded")
                if not changed:
                    break
            else:
                high = size
                size, _ = adjust(size, (high + low) // 2, "failed")
                if high - low <= 1:
                    break
        return int(get_attr(pl_module, name, datamodule))

    @staticmethod
    def _fits(trial: Callable[[int], bool], size: int) -> bool:
        try:
            return trial(size)
        except RuntimeError as error:
            if not is_oom_error(error):
                raise
            log.debug("Batch size %d ran out of memory: %s", size, error)
            _free_memory()
            return False

    def _data_source(self, pl_module: Module, datamodule: Any) -> Callable[[], Any]:
        """The hook fit will take its training data from (the DataModule's, else the Module's)."""
        if datamodule is not None and callable(getattr(datamodule, "train_dataloader", None)):
            return datamodule.train_dataloader  # type: ignore[no-any-return]
        if is_overridden("train_dataloader", pl_module, Module):
            return pl_module.train_dataloader
        msg = (
            "BatchSizeFinder rebuilds the training dataloader for each trial size, so the data must come from "
            f"{type(pl_module).__qualname__}.train_dataloader() or a DataModule, not from fit(train_dataloaders=...). "
            "Fix: build the DataLoader in train_dataloader() with batch_size=self.batch_size."
        )
        raise MisconfigurationError(msg)

    def _trial(self, trainer: TrainerView, pl_module: Module, source: Callable[[], Any]) -> bool:
        """``steps_per_trial`` real training steps at the current size; True when they all ran."""
        strategy = trainer.strategy
        optimizers, _ = init_optimizers_and_lr_schedulers(pl_module)
        if not optimizers:
            msg = f"BatchSizeFinder needs an optimizer from {type(pl_module).__qualname__}.configure_optimizers."
            raise MisconfigurationError(msg)
        optimizer = optimizers[0]
        try:
            for batch_idx, batch in enumerate(source()):
                if batch_idx >= self.steps_per_trial:
                    break
                batch = strategy.batch_to_device(batch)
                optimizer.zero_grad(set_to_none=True)
                with strategy.precision_plugin.train_step_context():
                    loss = loss_of(pl_module.training_step(batch, batch_idx))
                if loss is not None:
                    loss.backward()
                    optimizer.step()
        finally:
            optimizer.zero_grad(set_to_none=True)
            del optimizer, optimizers
        return True


def _dataset_length(loader: Any) -> int | None:
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None
