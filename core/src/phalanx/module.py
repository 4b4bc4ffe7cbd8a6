"""The Module: a ``torch.nn.Module`` plus the steps and hooks the Trainer drives.

Users describe *what* one step computes (``training_step``, ``validation_step``, ...) and which
optimizers to use (``configure_optimizers``); the Trainer and its strategy decide *where* and *how*
(devices, processes, precision). Every hook has a do-nothing default so a Module only overrides
what it needs, exactly as in Lightning, which keeps ported code unchanged.
"""

from __future__ import annotations

import builtins
import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx._module_export import ExportMixin, jit_is_scripting
from phalanx._module_hooks import BatchTransferHooks, ModuleHooks
from phalanx.errors import MisconfigurationError
from phalanx.hparams import HyperparametersMixin
from phalanx.saving import ModelIO

if TYPE_CHECKING:
    from typing_extensions import Self

    from phalanx.trainer_view import TrainerView

__all__ = ["Module"]


class Module(ModelIO, ExportMixin, HyperparametersMixin, ModuleHooks, BatchTransferHooks, nn.Module):
    """Base class for models trained by :class:`phalanx.Trainer`.

    Subclasses define at least ``training_step`` and ``configure_optimizers`` for ``fit``;
    ``validation_step``, ``test_step`` and ``predict_step`` enable the other stages.
    ``save_hyperparameters`` / ``hparams`` come from :class:`~phalanx.hparams.HyperparametersMixin`,
    ``load_from_checkpoint`` / ``strict_loading`` from :class:`~phalanx.saving.ModelIO`, and
    ``to_torchscript`` / ``to_onnx`` / ``example_input_array`` from the export mixin.
    """

    #: Properties TorchScript must not compile (it would read e.g. ``trainer`` outside a Trainer);
    #: every property of the class, a test keeps the list complete.
    __jit_unused_properties__: list[str] = [  # noqa: RUF012
        "trainer", "_current_fx_name", "automatic_optimization", "device", "dtype", "device_mesh", "on_gpu",
        "global_rank", "local_rank", "current_epoch", "global_step", "logger", "loggers", "strict_loading",
        "example_input_array", *HyperparametersMixin.__jit_unused_properties__,
    ]  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: TrainerView | None = None
        # The stage's Run (``trainer.run``): where self.log records and which hook is running. Read
        # from the Trainer's public ``run`` when it is attached, so logging costs no extra look-ups.
        self._run: Any = None
        self._automatic_optimization = True
        self._warned_detached_log = False
        # requires_grad of every optimizer's parameters while toggle_optimizer is in effect
        self._param_requires_grad_state: dict[torch.Tensor, bool] = {}

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        """Drop the Trainer: spawn launchers and ``copy.deepcopy`` must not drag it along."""
        state = self.__dict__.copy()
        state["_trainer"] = None
        state["_run"] = None
        return state

    # ------------------------------------------------------------------ properties
    @property
    def trainer(self) -> TrainerView:
        """The Trainer running this Module.

        Raises:
            RuntimeError: The Module is not attached to a Trainer yet.
        """
        if self._trainer is None:
            if jit_is_scripting():  # TorchScript reads every attribute; it must not fail here
                return None  # type: ignore[return-value]
            msg = (
                f"{type(self).__qualname__} is not attached to a Trainer; `self.trainer` is only "
                "available inside trainer.fit/validate/test/predict."
            )
            raise RuntimeError(msg)
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: TrainerView | None) -> None:
        self._trainer = trainer
        self._run = getattr(trainer, "run", None)

    @property
    def _current_fx_name(self) -> str | None:
        """The hook or step running now (kept on the Run: setting Module attributes is slow)."""
        return self._run.hooks.current if self._run is not None else None

    @property
    def automatic_optimization(self) -> bool:
        """Whether the Trainer runs backward and the optimizer step (False: the step does it)."""
        return self._automatic_optimization

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self._automatic_optimization = bool(value)

    @property
    def device(self) -> torch.device:
        """The device of the first parameter (or buffer); CPU for a Module without tensors."""
        for param in self.parameters():
            return param.device
        for buffer in self.buffers():
            return buffer.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the first floating-point parameter; float32 when there is none."""
        for tensor in self.parameters():
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.float32

    @property
    def on_gpu(self) -> bool:
        """Whether the model's parameters are on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def device_mesh(self) -> Any:
        """The strategy's ``DeviceMesh`` (model parallel, FSDP), for ``configure_model``; None otherwise.

        Model-parallel strategies build the mesh before ``configure_model`` runs, so tensor-parallel
        plans and ``fully_shard`` calls there can name its dimensions (``self.device_mesh["tensor_parallel"]``).
        """
        return self._trainer.strategy.device_mesh if self._trainer is not None else None

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes (0 without a Trainer)."""
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """Rank of this process on its machine (0 without a Trainer)."""
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The epoch in progress (0 without a Trainer)."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (0 without a Trainer)."""
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def logger(self) -> Any:
        """The Trainer's first logger, or ``None``."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Any]:
        """All of the Trainer's loggers."""
        return self._trainer.loggers if self._trainer is not None else []

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Compute and return the loss of one batch (a tensor, a dict with ``"loss"``, or None to skip)."""
        msg = (
            f"{type(self).__qualname__} does not define training_step, which fit() needs; define "
            "`def training_step(self, batch, batch_idx)` returning the loss."
        )
        raise MisconfigurationError(msg)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate one validation batch; log metrics with ``self.log``."""
        msg = (
            f"{type(self).__qualname__} does not define validation_step, which validation needs; define "
            "`def validation_step(self, batch, batch_idx)`."
        )
        raise MisconfigurationError(msg)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate one test batch; log metrics with ``self.log``."""
        msg = (
            f"{type(self).__qualname__} does not define test_step, which test() needs; define "
            "`def test_step(self, batch, batch_idx)`."
        )
        raise MisconfigurationError(msg)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """Return the prediction for one batch; calls ``self(batch)`` by default."""
        return self(batch)

    def configure_optimizers(self) -> Any:
        """Return the optimizer(s) and optional LR scheduler(s) (Lightning's accepted shapes)."""
        msg = (
            f"{type(self).__qualname__} does not define configure_optimizers, which fit() needs; define "
            "it returning e.g. torch.optim.AdamW(self.parameters(), lr=1e-3)."
        )
        raise MisconfigurationError(msg)

    # ------------------------------------------------------------------ logging
    def log(
        self,
        name: str,
        value: Any,
        *,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        sync_dist: bool = False,
        batch_size: int | None = None,
        add_dataloader_idx: bool = True,
    ) -> None:
        """Record a scalar metric for the progress bar, the loggers and ``trainer.callback_metrics``.

        Args:
            name: Metric name.
            value: A Python number or a one-element tensor.
            prog_bar: Show it in the progress bar.
            logger: Send it to the loggers (default True).
            on_step: Record the per-step value. Defaults to True in training steps, False elsewhere.
            on_epoch: Aggregate over the epoch. Defaults to False in training steps, True elsewhere.
            reduce_fx: Epoch aggregation: ``"mean"`` (weighted by batch size), ``"sum"``, ``"max"``,
                ``"min"`` (or the matching ``torch`` function).
            sync_dist: Reduce the value over processes through ``strategy.reduce``.
            batch_size: Weight for the epoch mean; inferred from the batch when omitted.
            add_dataloader_idx: Suffix ``/dataloader_idx_N`` when evaluating several dataloaders.
        """
        run = self._run
        if run is None:
            if not self._warned_detached_log:
                self._warned_detached_log = True
                warnings.warn(
                    f"self.log({name!r}, ...) was called while {type(self).__qualname__} is not attached "
                    "to a Trainer; the value is dropped. Log from the step methods or hooks the Trainer runs.",
                    stacklevel=2,
                )
            return
        run.metrics.log(
            run.hooks.current,
            name,
            value,
            prog_bar=prog_bar,
            logger=True if logger is None else logger,
            on_step=on_step,
            on_epoch=on_epoch,
            reduce_fx=reduce_fx,
            sync_dist=sync_dist,
            batch_size=batch_size,
            add_dataloader_idx=add_dataloader_idx,
        )

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        """Call :meth:`log` for every item of ``dictionary`` with the same options."""
        if not isinstance(dictionary, Mapping):
            msg = (
                f"log_dict expects a mapping of name -> value, got {type(dictionary).__name__}; "
                "pass e.g. {'loss': loss, 'acc': acc}."
            )
            raise MisconfigurationError(msg)
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only, without breaking the progress bar."""
        trainer = self._trainer
        if trainer is not None:
            trainer.print(*args, **kwargs)
        else:
            builtins.print(*args, **kwargs)

    # ------------------------------------------------------------------ optimization helpers
    def optimizers(self) -> Any:
        """The optimizer (or list of them) from ``configure_optimizers``, stepping through the strategy."""
        wrapped = self._attached_run().step_optimizers
        return wrapped[0] if len(wrapped) == 1 else list(wrapped)

    def lr_schedulers(self) -> Any:
        """The scheduler (or list of them) from ``configure_optimizers``; None when there is none."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward for manual optimization: goes through the strategy (precision scaling, DDP)."""
        run = self._attached_run()
        run.hooks.call("on_before_backward", loss)
        run.strategy.backward(loss, None, *args, **kwargs)
        run.hooks.call("on_after_backward")

    def _attached_run(self) -> Any:
        """The stage's Run; raises like :attr:`trainer` when the Module runs outside a stage."""
        if self._run is None:
            self.trainer  # noqa: B018  # raises the "not attached" error
            msg = f"{type(self).__qualname__} is attached to a Trainer that is not running a stage."
            raise RuntimeError(msg)
        return self._run

    def clip_gradients(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the gradients of ``optimizer``'s parameters through the precision (which unscales)."""
        if gradient_clip_val is None or gradient_clip_val <= 0:
            return
        algorithm = gradient_clip_algorithm or "norm"
        inner = getattr(optimizer, "optimizer", optimizer)
        self.trainer.strategy.precision_plugin.clip_gradients(inner, gradient_clip_val, algorithm)

    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip gradients before each optimizer step; override for custom clipping."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Any,
        optimizer_closure: Any = None,
    ) -> None:
        """Step ``optimizer``; the closure runs the training step and backward. Override to customise."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Reset gradients at the start of each accumulation window."""
        optimizer.zero_grad()

    def all_gather(self, data: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """Gather ``data`` from every process through the strategy."""
        return self.trainer.strategy.all_gather(data, group=group, sync_grads=sync_grads)

    # ------------------------------------------------------------------ freezing & optimizer toggling
    def freeze(self) -> Self:
        """Stop gradients for every parameter and switch to eval mode (for inference); returns ``self``."""
        for param in self.parameters():
            param.requires_grad = False
        return self.eval()

    def unfreeze(self) -> Self:
        """Let every parameter receive gradients again and switch to train mode; returns ``self``."""
        for param in self.parameters():
            param.requires_grad = True
        return self.train()

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Compute gradients only for ``optimizer``'s parameters until :meth:`untoggle_optimizer`.

        With several optimizers (a GAN's generator and discriminator), a backward for one must not
        leave gradients on the other's parameters. The parameters of every other optimizer of the
        Trainer stop requiring gradients; each parameter's previous ``requires_grad`` is kept, so
        parameters frozen on purpose stay frozen.

        Args:
            optimizer: One of the Trainer's optimizers, or the wrapper ``self.optimizers()`` returns.
        """
        previous: dict[torch.Tensor, bool] = {}
        for opt in self.trainer.optimizers:
            for param in _parameters_of(opt):
                if param not in previous:
                    previous[param] = param.requires_grad
                    param.requires_grad = False
        for param in _parameters_of(optimizer):
            param.requires_grad = previous.get(param, param.requires_grad)
        self._param_requires_grad_state = previous

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Give the other optimizers' parameters back the ``requires_grad`` they had before :meth:`toggle_optimizer`."""
        inner = getattr(optimizer, "optimizer", optimizer)
        state = self._param_requires_grad_state
        for opt in self.trainer.optimizers:
            if opt is optimizer or opt is inner:
                continue
            for param in _parameters_of(opt):
                if param in state:
                    param.requires_grad = state[param]
        self._param_requires_grad_state = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` for the ``with`` block, :meth:`untoggle_optimizer` after it (also on error)."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)


def _parameters_of(optimizer: Any) -> Iterator[torch.Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]
