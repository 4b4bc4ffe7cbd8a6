"""BaseFinetuning and BackboneFinetuning: freeze part of a model, then unfreeze it into the optimizer.

Fine-tuning a pretrained backbone usually starts with the backbone frozen (only the new head
learns, so large early gradients do not wreck the pretrained features) and later trains it with
a smaller learning rate. Freezing must happen before ``configure_optimizers`` builds the
optimizer over the trainable parameters, and unfreezing must add the parameters to that optimizer
as a new param group; these callbacks do both at the right moments, as Lightning's do. The param
groups they add are recorded (by parameter name) in the callback's checkpoint state, so a resumed
fit rebuilds the same optimizer before its state is loaded back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import Module as TorchModule
from torch.nn import ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.optimizer import Optimizer

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]

log = logging.getLogger(__name__)

Modules = TorchModule | Iterable[TorchModule | Iterable[Any]]


def multiplicative(epoch: int) -> float:
    """BackboneFinetuning's default schedule: double the backbone's learning rate every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Base class for freeze/unfreeze schedules; override the two methods below.

    ``freeze_before_training(pl_module)`` runs in ``setup``, before ``configure_optimizers``: freeze
    what must not train at first. ``finetune_function(pl_module, epoch, optimizer)`` runs at every
    training epoch start: unfreeze modules with :meth:`unfreeze_and_add_param_group`, which adds
    their parameters to the optimizer as a new param group. ``configure_optimizers`` should pass
    only trainable parameters (``filter(lambda p: p.requires_grad, self.parameters())``).

    Raises:
        NotImplementedError: With the DeepSpeed strategy (its engine owns the param groups), as Lightning.
    """

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False

    def state_dict(self) -> dict[str, Any]:
        """The param groups of every optimizer, parameters named (so they map onto a new Module)."""
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the param groups to rebuild in ``on_fit_start``."""
        self._restarting = True
        if "internal_optimizer_metadata" in state_dict:  # noqa: SIM401  # an old checkpoint is the mapping itself
            self._internal_optimizer_metadata = state_dict["internal_optimizer_metadata"]
        else:
            self._internal_optimizer_metadata = state_dict  # type: ignore[assignment]  # the old layout

    def on_load_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Rebuild the recorded param groups before the Trainer loads the optimizer state into them.

        Lightning does this in ``on_fit_start``, which it runs before restoring optimizers; phalanx
        restores the optimizers right after the callbacks' ``on_load_checkpoint``, so it happens here.
        """
        self._restore_param_groups(trainer, pl_module)

    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Rebuild the recorded param groups when fit resumes (if the checkpoint hook did not)."""
        self._restore_param_groups(trainer, pl_module)

    def _restore_param_groups(self, trainer: TrainerView, pl_module: Module) -> None:
        if not self._restarting:
            return
        named_parameters = dict(pl_module.named_parameters())
        for opt_idx, optimizer in enumerate(trainer.optimizers):
            optimizer.param_groups = self._apply_mapping_to_param_groups(
                self._internal_optimizer_metadata[opt_idx], named_parameters
            )
            # ``setup`` froze them again before the restore; what the optimizer holds was training.
            for group in optimizer.param_groups:
                for param in group["params"]:
                    param.requires_grad_(True)
        self._restarting = False

    # ------------------------------------------------------------------ module helpers
    @staticmethod
    def flatten_modules(modules: Modules) -> list[TorchModule]:
        """The leaf modules of ``modules`` plus the parents that hold parameters themselves."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):
            flat: list[TorchModule] = []
            for module in modules:
                flat.extend(BaseFinetuning.flatten_modules(module))
            candidates: Iterable[TorchModule] = flat
        else:
            candidates = modules.modules()
        return [m for m in candidates if not list(m.children()) or next(m.parameters(recurse=False), None) is not None]

    @staticmethod
    def filter_params(
        modules: Modules, train_bn: bool = True, requires_grad: bool = True
    ) -> Generator[Any, None, None]:
        """Yield the parameters of ``modules`` whose ``requires_grad`` equals ``requires_grad``.

        Args:
            modules: A module or an iterable of modules.
            train_bn: Include BatchNorm parameters (False skips them).
            requires_grad: Yield trainable (True) or frozen (False) parameters.
        """
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):  # no recursion: parents would repeat them
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze the parameters of ``modules`` (BatchNorm layers track running stats again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: TorchModule) -> None:
        """Freeze one module's own parameters (a BatchNorm stops tracking running stats)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze ``modules``; with ``train_bn`` their BatchNorm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[Any]) -> list[Any]:
        """The parameters of ``params`` that no param group of ``optimizer`` holds yet (warns about the others)."""
        out_params, removed = [], []
        for param in params:
            if not any(torch.equal(p, param) for group in optimizer.param_groups for p in group["params"]):
                out_params.append(param)
            else:
                removed.append(param)
        if removed:
            rank_zero_warn(
                "The provided params to be frozen already exist within another group of this optimizer. Those "
                "parameters will be skipped.\nHINT: Did you init your optimizer in `configure_optimizer` as such:\n "
                f"{type(optimizer)}(filter(lambda p: p.requires_grad, self.parameters()), ...) "
            )
        return out_params

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Modules,
        optimizer: Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as one new param group.

        Args:
            modules: A module or an iterable of modules to unfreeze.
            optimizer: The optimizer that receives the new param group.
            lr: Learning rate of the new group; None: the first group's lr divided by ``initial_denom_lr``.
            initial_denom_lr: Divisor of the first group's lr when ``lr`` is None.
            train_bn: Whether BatchNorm parameters join the group.
        """
        BaseFinetuning.make_trainable(modules)
        params_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denom_lr = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        kept = BaseFinetuning.filter_on_optimizer(optimizer, params)
        if kept:
            optimizer.add_param_group({"params": kept, "lr": params_lr / denom_lr})

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Freeze before ``configure_optimizers`` runs; refuse DeepSpeed."""
        self.freeze_before_training(pl_module)
        if trainer.strategy.strategy_name == "deepspeed":
            msg = (
                "The Finetuning callback does not support running with the DeepSpeed strategy (its engine owns the "
                "optimizer's param groups). Choose a different strategy or disable the callback."
            )
            raise NotImplementedError(msg)

    @staticmethod
    def _apply_mapping_to_param_groups(
        param_groups: list[dict[str, Any]], mapping: dict[Any, Any]
    ) -> list[dict[str, Any]]:
        output = []
        for group in param_groups:
            state = {key: value for key, value in group.items() if key != "params"}
            state["params"] = [mapping[p] for p in group["params"]]
            output.append(state)
        return output

    def _store(
        self, pl_module: Module, opt_idx: int, num_param_groups: int, current_param_groups: list[dict[str, Any]]
    ) -> None:
        mapping = {p: n for n, p in pl_module.named_parameters()}
        if opt_idx not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[opt_idx] = self._apply_mapping_to_param_groups(
                current_param_groups, mapping
            )
        elif num_param_groups != len(current_param_groups):  # groups added since: record them too
            self._internal_optimizer_metadata[opt_idx].extend(
                self._apply_mapping_to_param_groups(current_param_groups[num_param_groups:], mapping)
            )

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Run :meth:`finetune_function` for every optimizer and record the param groups it added."""
        for opt_idx, optimizer in enumerate(trainer.optimizers):
            num_param_groups = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._store(pl_module, opt_idx, num_param_groups, optimizer.param_groups)

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        """Override to unfreeze modules at the epochs you choose."""
        raise NotImplementedError

    def freeze_before_training(self, pl_module: Module) -> None:
        """Override to freeze modules before the optimizer is built."""
        raise NotImplementedError


class BackboneFinetuning(BaseFinetuning):
    """Freeze ``pl_module.backbone``, unfreeze it at an epoch and raise its learning rate each epoch.

    At ``unfreeze_backbone_at_epoch`` the backbone joins the optimizer as a new param group with
    lr ``backbone_initial_lr`` (default: the current lr times ``backbone_initial_ratio_lr``); every
    later epoch multiplies it by ``lambda_func(epoch + 1)``, capped at the current lr of the first
    group when ``should_align``.

    Args:
        unfreeze_backbone_at_epoch: Epoch (zero-based) at which the backbone starts training.
        lambda_func: Factor applied to the backbone lr at each later epoch (default doubles it).
        backbone_initial_ratio_lr: The backbone's first lr as a fraction of the current lr.
        backbone_initial_lr: The backbone's first lr; overrides the ratio.
        should_align: Once the backbone lr would pass the model's lr, use the model's lr.
        initial_denom_lr: Divisor of the current lr for the new group when no lr is given
            (only reached through :meth:`unfreeze_and_add_param_group` directly).
        train_bn: Whether the backbone's BatchNorm layers train.
        verbose: Log both learning rates every epoch (INFO on the ``phalanx`` logger).
        rounding: Decimals of the logged learning rates.

    Raises:
        MisconfigurationError: The Module has no ``backbone`` attribute that is an ``nn.Module``.
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 10e-2,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        """The recorded param groups and the backbone's last lr."""
        return {
            "internal_optimizer_metadata": self._internal_optimizer_metadata,
            "previous_backbone_lr": self.previous_backbone_lr,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Check for a backbone before freezing it (Lightning checks in ``on_fit_start``, too late to name it)."""
        self._check_backbone(pl_module)
        super().setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Require ``pl_module.backbone``, then rebuild recorded param groups on resume."""
        self._check_backbone(pl_module)
        super().on_fit_start(trainer, pl_module)

    @staticmethod
    def _check_backbone(pl_module: Module) -> None:
        if not isinstance(getattr(pl_module, "backbone", None), TorchModule):
            msg = (
                f"The LightningModule should have a nn.Module `backbone` attribute; {type(pl_module).__name__} "
                "has none. Fix: assign the pretrained part to self.backbone, or subclass BaseFinetuning."
            )
            raise MisconfigurationError(msg)

    def freeze_before_training(self, pl_module: Module) -> None:
        """Freeze the backbone."""
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        """Unfreeze the backbone at its epoch; afterwards raise its lr by ``lambda_func``."""
        if epoch == self.unfreeze_backbone_at_epoch:
            current_lr = optimizer.param_groups[0]["lr"]
            initial_backbone_lr = (
                self.backbone_initial_lr
                if self.backbone_initial_lr is not None
                else current_lr * self.backbone_initial_ratio_lr
            )
            self.previous_backbone_lr = initial_backbone_lr
            self.unfreeze_and_add_param_group(
                pl_module.backbone,
                optimizer,
                initial_backbone_lr,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
            if self.verbose:
                log.info(
                    f"Current lr: {round(current_lr, self.rounding)}, "
                    f"Backbone lr: {round(initial_backbone_lr, self.rounding)}"
                )
        elif epoch > self.unfreeze_backbone_at_epoch:
            assert self.previous_backbone_lr is not None
            current_lr = optimizer.param_groups[0]["lr"]
            next_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            next_lr = current_lr if (self.should_align and next_lr > current_lr) else next_lr
            optimizer.param_groups[-1]["lr"] = next_lr
            self.previous_backbone_lr = next_lr
            if self.verbose:
                log.info(
                    f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: {round(next_lr, self.rounding)}"
                )
