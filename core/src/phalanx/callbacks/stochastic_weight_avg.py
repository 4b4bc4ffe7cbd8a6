"""StochasticWeightAveraging: average the weights of the last epochs, at a constant or annealed lr.

SWA (Izmailov et al., 2018) averages the weights seen at the start of each of the last epochs of
training while a cyclic or constant learning rate (``torch.optim.swa_utils.SWALR``) keeps the
model exploring; the average lands in a wider optimum that generalises better. When training
ends, the averaged weights are copied into the Module and, if it has BatchNorm layers, their
running statistics are recomputed with one pass over the training data (the statistics of the
individual weights do not fit the average). Arguments, checkpoint state and the epochs averaged
are Lightning's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from copy import deepcopy
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import SWALR

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.utilities.optim import LRSchedulerConfig
from phalanx.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["StochasticWeightAveraging"]

_AVG_FN = Callable[[Tensor, Tensor, Tensor], Tensor]
_STRATEGIES = ("cos", "linear")


class StochasticWeightAveraging(Callback):
    """Average the weights from ``swa_epoch_start`` on and use them when training ends.

    From the SWA start epoch, the optimizer's learning rate follows ``SWALR`` (replacing a
    scheduler from ``configure_optimizers``) and the weights at the start of every epoch go into
    the average. If fit runs to ``max_epochs``, the Module gets the averaged weights (and fresh
    BatchNorm statistics) in ``on_train_end``. One optimizer and at most one scheduler.

    Args:
        swa_lrs: The SWA learning rate: one float for all param groups, or a list with one per group.
        swa_epoch_start: The epoch (1-based int) or fraction of ``max_epochs`` (float in [0, 1]) at
            which averaging starts.
        annealing_epochs: Epochs over which the lr anneals to ``swa_lrs``.
        annealing_strategy: ``"cos"`` or ``"linear"`` annealing.
        avg_fn: ``avg_fn(averaged, current, num_averaged) -> new averaged``; None: equal weights.
        device: Where the averaged copy lives (default CPU); None: the Module's device.

    Raises:
        MisconfigurationError: A bad argument; at setup, a sharded strategy (FSDP, DeepSpeed, model
            parallel: the average is a full copy of the Module); at fit start, several optimizers or schedulers.
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: str = "cos",
        avg_fn: _AVG_FN | None = None,
        device: torch.device | str | None = torch.device("cpu"),  # noqa: B008  # Lightning's default
    ) -> None:
        bad_start = (isinstance(swa_epoch_start, int) and swa_epoch_start < 1) or (
            isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1
        )
        if bad_start or not isinstance(swa_epoch_start, (int, float)):
            msg = (
                f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}): swa_epoch_start should be a >0 "
                "integer or a float between 0 and 1. Fix: pass e.g. 5 (the fifth epoch) or 0.8 (80% of max_epochs)."
            )
            raise MisconfigurationError(msg)
        wrong_float = isinstance(swa_lrs, float) and swa_lrs <= 0
        wrong_list = isinstance(swa_lrs, list) and not all(isinstance(lr, float) and lr > 0 for lr in swa_lrs)
        if not isinstance(swa_lrs, (float, list)) or wrong_float or wrong_list:
            msg = (
                f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}): the `swa_lrs` should be a positive float, or a "
                "list of positive floats (one per param group). Fix: pass e.g. swa_lrs=1e-2."
            )
            raise MisconfigurationError(msg)
        if annealing_strategy not in _STRATEGIES:
            msg = (
                f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}) is invalid; valid values are "
                f"{list(_STRATEGIES)}."
            )
            raise MisconfigurationError(msg)
        if avg_fn is not None and not callable(avg_fn):
            msg = (
                f"StochasticWeightAveraging(avg_fn={avg_fn!r}): the `avg_fn` should be callable (averaged, current, n)."
            )
            raise MisconfigurationError(msg)
        if device is not None and not isinstance(device, (torch.device, str)):
            msg = f"StochasticWeightAveraging: device is expected to be a torch.device or a str. Found {device!r}."
            raise MisconfigurationError(msg)
        self.n_averaged: Tensor | None = None
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = device
        self._model_contains_batch_norm: bool | None = None
        self._average_model: nn.Module | None = None
        self._initialized = False
        self._swa_scheduler: Any = None
        self._scheduler_state: dict[str, Any] | None = None
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self.momenta: dict[nn.modules.batchnorm._BatchNorm, float | None] = {}
        self._max_epochs = 0

    @property
    def swa_start(self) -> int:
        """The first averaged epoch, zero-based."""
        return max(int(self._swa_epoch_start) - 1, 0)

    @property
    def swa_end(self) -> int:
        """The last averaged epoch, zero-based (the last epoch of fit)."""
        return self._max_epochs - 1

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: nn.Module) -> bool:
        """Whether a BatchNorm layer needs its statistics recomputed for the averaged weights."""
        return any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in pl_module.modules())

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Refuse sharded strategies; copy the Module before the strategy moves it."""
        if trainer.strategy.restore_checkpoint_after_setup:  # FSDP, DeepSpeed, model parallel
            msg = (
                f"SWA does not currently support sharded models ({type(trainer.strategy).__name__}): it keeps a full "
                "copy of the Module. Use strategy='ddp' (or one device), or remove StochasticWeightAveraging."
            )
            raise MisconfigurationError(msg)
        self._average_model = deepcopy(pl_module)

    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Check the optimizer setup and fix the SWA epochs from ``max_epochs``."""
        if len(trainer.optimizers) != 1:
            msg = f"SWA currently works with 1 `optimizer`; configure_optimizers returned {len(trainer.optimizers)}."
            raise MisconfigurationError(msg)
        if len(trainer.lr_scheduler_configs) > 1:
            msg = (
                f"SWA currently not supported for more than 1 `lr_scheduler`; configure_optimizers returned "
                f"{len(trainer.lr_scheduler_configs)}."
            )
            raise MisconfigurationError(msg)
        # fit has resolved max_epochs before any callback runs (1000 when unset, -1 when unbounded)
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
        if isinstance(self._swa_epoch_start, float):
            self._swa_epoch_start = int(max_epochs * self._swa_epoch_start)
        self._model_contains_batch_norm = self.pl_module_contains_batch_norm(pl_module)
        self._max_epochs = max_epochs

    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start SWA here too when fit resumes in the middle of an SWA epoch (its epoch start is past)."""
        self.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """At the SWA start, swap in SWALR; in every SWA epoch, add the current weights to the average."""
        epoch = trainer.current_epoch
        in_swa = self.swa_start <= epoch <= self.swa_end
        if not self._initialized and in_swa:
            self._initialized = True
            self._start_swa(trainer, pl_module)
        if in_swa and epoch > self._latest_update_epoch:
            assert self.n_averaged is not None and self._average_model is not None
            self.update_parameters(self._average_model, pl_module, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch

    def _start_swa(self, trainer: TrainerView, pl_module: Module) -> None:
        assert self._average_model is not None
        self._average_model = self._average_model.to(self._device or pl_module.device)
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        for lr, group in zip(self._swa_lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        self._swa_scheduler = SWALR(
            optimizer,
            swa_lr=self._swa_lrs,  # type: ignore[arg-type]  # torch accepts one per group
            anneal_epochs=self._annealing_epochs,
            anneal_strategy=self._annealing_strategy,  # type: ignore[arg-type]
            last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1,
        )
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
        elif trainer.current_epoch != self.swa_start:
            rank_zero_warn(
                "SWA is initializing after swa_start without any checkpoint data. "
                "This may be caused by loading a checkpoint from an older version of PyTorch Lightning."
            )
        config = LRSchedulerConfig(self._swa_scheduler)
        configs = trainer.strategy.lr_scheduler_configs  # the list the Trainer steps (trainer's is a copy)
        if configs:
            previous = configs[0]
            if previous.interval != "epoch" or previous.frequency != 1:
                rank_zero_warn(f"SWA is currently only supported every epoch. Found {previous}")
            rank_zero_info(
                f"Swapping scheduler `{type(previous.scheduler).__name__}` for `{type(self._swa_scheduler).__name__}`"
            )
            configs[0] = config
        else:
            configs.append(config)
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long, device=pl_module.device)

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """After the last SWA epoch: the averaged weights into the Module, then fresh BatchNorm statistics."""
        if trainer.current_epoch - 1 != self.swa_end:  # stopped early: keep the trained weights, as Lightning
            return
        assert self._average_model is not None
        self.transfer_weights(self._average_model, pl_module)
        if self._model_contains_batch_norm:
            self.reset_batch_norm_and_save_state(pl_module)
            try:
                self._forward_training_data(trainer, pl_module)
            finally:
                self.reset_momenta()

    @staticmethod
    def _forward_training_data(trainer: TrainerView, pl_module: Module) -> None:
        """One pass of ``training_step`` over the training data without gradients, for BatchNorm
        statistics (Lightning runs it as an extra epoch without backward); ``self.log`` is muted."""
        takes_idx = len(inspect.signature(pl_module.training_step).parameters) >= 2
        was_training = pl_module.training
        pl_module.train()
        pl_module.log = _muted  # type: ignore[method-assign]
        try:
            with torch.no_grad():
                for batch_idx, batch in enumerate(trainer.train_dataloader):
                    batch = trainer.strategy.batch_to_device(batch)
                    if takes_idx:
                        pl_module.training_step(batch, batch_idx)
                    else:
                        pl_module.training_step(batch)
        finally:
            del pl_module.log
            pl_module.train(was_training)

    # ------------------------------------------------------------------ averaging
    @staticmethod
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        """Copy the parameters of ``src_pl_module`` into ``dst_pl_module``."""
        for src_param, dst_param in zip(src_pl_module.parameters(), dst_pl_module.parameters()):
            dst_param.detach().copy_(src_param.to(dst_param.device))

    def reset_batch_norm_and_save_state(self, pl_module: nn.Module) -> None:
        """Zero the BatchNorm statistics and use a cumulative average for the pass (``torch.optim.swa_utils.update_bn``)."""
        self.momenta = {}
        for module in pl_module.modules():
            if not isinstance(module, nn.modules.batchnorm._BatchNorm):
                continue
            assert module.running_mean is not None and module.running_var is not None
            module.running_mean = torch.zeros_like(module.running_mean)
            module.running_var = torch.ones_like(module.running_var)
            self.momenta[module] = module.momentum
            module.momentum = None  # type: ignore[assignment]
            assert module.num_batches_tracked is not None
            module.num_batches_tracked *= 0

    def reset_momenta(self) -> None:
        """Put the BatchNorm momenta back after the statistics pass."""
        for bn_module, momentum in self.momenta.items():
            bn_module.momentum = momentum  # type: ignore[assignment]

    @staticmethod
    def update_parameters(average_model: nn.Module, model: nn.Module, n_averaged: Tensor, avg_fn: _AVG_FN) -> None:
        """Fold ``model``'s parameters into ``average_model`` (the first update copies them)."""
        for p_swa, p_model in zip(average_model.parameters(), model.parameters()):
            device = p_swa.device
            p_swa_ = p_swa.detach()
            p_model_ = p_model.detach().to(device)
            src = p_model_ if n_averaged == 0 else avg_fn(p_swa_, p_model_, n_averaged.to(device))
            p_swa_.copy_(src)
        n_averaged += 1

    @staticmethod
    def avg_fn(averaged_model_parameter: Tensor, model_parameter: Tensor, num_averaged: Tensor) -> Tensor:
        """The equal-weight running mean (``torch.optim.swa_utils.get_swa_avg_fn``)."""
        return averaged_model_parameter + (model_parameter - averaged_model_parameter) / (num_averaged + 1)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Averages taken, the last averaged epoch, SWALR's state and the averaged weights (Lightning's keys)."""
        return {
            "n_averaged": 0 if self.n_averaged is None else self.n_averaged.item(),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": None if self._average_model is None else self._average_model.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; SWALR is rebuilt from its state when training starts."""
        self._init_n_averaged = state_dict["n_averaged"]
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._scheduler_state = state_dict["scheduler_state"]
        if self._average_model is not None and state_dict["average_model_state"] is not None:
            self._average_model.load_state_dict(state_dict["average_model_state"])

    def on_load_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Keep the Trainer from restoring SWALR's state into the ``configure_optimizers`` scheduler.

        A checkpoint taken during SWA holds SWALR where the Module's scheduler was; the callback
        rebuilds SWALR from its own copy of that state when training starts, so the scheduler
        entries are dropped here (Lightning clears its scheduler list in ``on_fit_start`` for the same reason).
        """
        if self._scheduler_state is not None:
            checkpoint["lr_schedulers"] = []
            trainer.strategy.lr_scheduler_configs.clear()


def _muted(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``Module.log`` during the BatchNorm pass, which is no training step."""
