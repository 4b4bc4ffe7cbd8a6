"""WeightAveraging and EMAWeightAveraging: keep a running average of the weights while training.

An average of the weights along the end of a training run (equal weights: SWA; exponentially
decaying: EMA) usually generalises better than the last weights. These callbacks keep that
average in a :class:`torch.optim.swa_utils.AveragedModel` updated after optimizer steps (or
epochs), validate with the averaged weights, write them as the checkpoint's ``state_dict`` (the
training weights go under ``current_model_state``, so a resumed fit continues from them) and leave
them in the Module when training ends. The API and the checkpoint layout are Lightning 2.6's, so a
checkpoint written by either loads in the other.
"""

from __future__ import annotations

import itertools
from copy import deepcopy
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["EMAWeightAveraging", "WeightAveraging"]

_PREFIX = "module."  # AveragedModel keeps the averaged copy as its submodule "module"


class WeightAveraging(Callback):
    """Update an :class:`~torch.optim.swa_utils.AveragedModel` of the Module after training steps.

    Keyword arguments other than ``device`` and ``use_buffers`` go to ``AveragedModel`` (``avg_fn``
    or ``multi_avg_fn``; without either, an equal-weight average: SWA). Override
    :meth:`should_update` to choose when the average is updated (default: after every optimizer
    step). During validation and after training the Module holds the averaged weights.

    Sharded models are not supported: the average is a full copy of the Module made when fit starts
    (a ``configure_model`` override is called first so the copy has every layer; a warning says so).

    Args:
        device: Where the averaged copy lives; None: the Module's device when fit starts. Use
            ``"cpu"`` to spare accelerator memory.
        use_buffers: Average the buffers too (unlike ``AveragedModel``'s default, True here), so
            BatchNorm statistics follow the average; with False, update them yourself
            (``torch.optim.swa_utils.update_bn``).
        **kwargs: More ``AveragedModel`` arguments, e.g. ``avg_fn=get_ema_avg_fn(0.99)``.

    Example::

        from torch.optim.swa_utils import get_ema_avg_fn
        from phalanx.callbacks import WeightAveraging

        class EMAAfter100(WeightAveraging):
            def __init__(self):
                super().__init__(avg_fn=get_ema_avg_fn())

            def should_update(self, step_idx=None, epoch_idx=None):
                return step_idx is not None and step_idx >= 100
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any) -> None:
        if device is not None and not isinstance(device, (torch.device, str, int)):
            msg = (
                f"{type(self).__name__}(device={device!r}) is invalid; pass a torch.device, a string like 'cpu' or "
                "'cuda:0', a device index, or None to keep the average on the Module's device."
            )
            raise MisconfigurationError(msg)
        self._device: torch.device | int | None = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        # Optimizer steps taken at the last update: should_update is first asked after the first
        # step (after N batches with accumulate_grad_batches=N).
        self._latest_update_step = 0
        # The epoch after which the average was last updated; -1 lets epoch 0 update.
        self._latest_update_epoch = -1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average after optimizer step ``step_idx`` or epoch ``epoch_idx``.

        Called after every optimizer step (with the zero-based ``step_idx``) and after every
        training epoch (with ``epoch_idx``); the default updates after every step only.
        """
        return step_idx is not None

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Create the averaged copy when fit starts (before the strategy moves or wraps the Module)."""
        if stage != "fit":
            return
        device = self._device or pl_module.device
        if is_overridden("configure_model", pl_module, Module):
            rank_zero_warn(
                f"You're using the {type(self).__name__} callback with a model that overrides the configure_model "
                "hook. WeightAveraging doesn't support sharding model layers, so you may run out of memory."
            )
            pl_module.configure_model()
        self._average_model = AveragedModel(
            model=pl_module, device=device, use_buffers=self._use_buffers, **self._kwargs
        )

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Update the average when an optimizer step happened in this batch and :meth:`should_update` agrees."""
        step_idx = trainer.global_step - 1  # zero-based, like epoch_idx
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=step_idx):
            assert self._average_model is not None
            self._average_model.update_parameters(pl_module)
            self._latest_update_step = trainer.global_step

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Update the average after the epoch when :meth:`should_update` asks for it."""
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            assert self._average_model is not None
            self._average_model.update_parameters(pl_module)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Leave the averaged weights in the Module."""
        assert self._average_model is not None
        self._copy_average_to_current(pl_module)

    def on_validation_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Validate the averaged weights: swap them into the Module."""
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Swap the training weights back."""
        if self._average_model is not None:
            self._swap_models(pl_module)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The step of the last update (the averaged weights travel in the checkpoint's ``state_dict``)."""
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self._latest_update_step = state_dict["latest_update_step"]

    def on_save_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Write the averaged weights as ``state_dict`` and the training weights as ``current_model_state``.

        A model loaded from the checkpoint for inference so gets the averaged weights; the rest of
        the AveragedModel's state (``n_averaged``) goes under ``averaging_state``.
        """
        if self._average_model is None:
            rank_zero_info(
                f"You're using the {type(self).__name__} callback, but saving a checkpoint outside the 'fit' stage. "
                "The state of the callback won't be saved in the checkpoint. If training has finished, the average "
                "model parameters will be saved to the state_dict in the checkpoint."
            )
            return
        average_state = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {
            name[len(_PREFIX) :]: value for name, value in average_state.items() if name.startswith(_PREFIX)
        }
        checkpoint["averaging_state"] = {
            name: value for name, value in average_state.items() if not name.startswith(_PREFIX)
        }

    def on_load_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Restore the average from ``state_dict`` and the training weights from ``current_model_state``."""
        if self._average_model is None:
            rank_zero_warn(
                f"You're using the {type(self).__name__} callback, but loading a checkpoint outside the 'fit' stage. "
                "The averaging state cannot be restored. If you're using the checkpoint for prediction or testing, "
                "you can ignore this warning. To disable the warning, remove the callback."
            )
        elif "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            rank_zero_info("Found current_model_state in the checkpoint. This will be used to initialize the model.")
            average_state = {_PREFIX + name: value for name, value in checkpoint["state_dict"].items()}
            average_state |= checkpoint["averaging_state"]
            self._average_model.load_state_dict(average_state)
            # The Module was loaded from "state_dict" (the average) already: load the training weights.
            pl_module.load_state_dict(checkpoint["current_model_state"])
        else:
            rank_zero_warn(
                f"The checkpoint was not created with {type(self).__name__}. Both the current and the average model "
                "will be initialized with state_dict."
            )
            self._average_model.module.load_state_dict(deepcopy(checkpoint["state_dict"]), strict=False)

    # ------------------------------------------------------------------ helpers
    def _pairs(self, pl_module: Module) -> zip[tuple[torch.Tensor, torch.Tensor]]:
        assert self._average_model is not None
        average = itertools.chain(self._average_model.module.parameters(), self._average_model.module.buffers())
        current = itertools.chain(pl_module.parameters(), pl_module.buffers())
        return zip(average, current)

    def _swap_models(self, pl_module: Module) -> None:
        """Exchange the values of the Module's and the average's parameters and buffers."""
        for average, current in self._pairs(pl_module):
            saved = average.data.clone()
            average.data.copy_(current.data)
            current.data.copy_(saved)

    def _copy_average_to_current(self, pl_module: Module) -> None:
        """Copy the averaged parameters and buffers into the Module."""
        for average, current in self._pairs(pl_module):
            current.data.copy_(average.data)


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights: ``ema = decay * ema + (1 - decay) * weights``.

    Args:
        device: Where the average lives (see :class:`WeightAveraging`).
        use_buffers: Average the buffers too.
        decay: Weight of the previous average at each update (``get_ema_avg_fn(decay)``).
        update_every_n_steps: Update after every N-th optimizer step (``step_idx % N == 0``; 0: never by steps).
        update_starting_at_step: First optimizer step (zero-based) that updates; None: from the first.
        update_starting_at_epoch: Also update after every epoch from this one on; None: never by epochs.
        **kwargs: More ``AveragedModel`` arguments.
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= decay <= 1.0:
            msg = f"EMAWeightAveraging(decay={decay!r}) must lie in [0, 1]; typical values are 0.99 to 0.9999."
            raise MisconfigurationError(msg)
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Update by steps (every N from the start step) and, when configured, by epochs."""
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            due = self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0
            if started and due:
                return True
        if epoch_idx is not None:
            return self.update_starting_at_epoch is not None and epoch_idx >= self.update_starting_at_epoch
        return False
