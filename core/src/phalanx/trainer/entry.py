"""Checks every entry point makes in the calling process, before any process starts or work begins.

A wrong model class, a Module without ``training_step``, data that is not iterable or a checkpoint
path that does not exist fail here with one clear message, instead of inside a launched rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError
from phalanx.trainer.checkpointing import resolve_ckpt_path
from phalanx.trainer.data import as_loader_list
from phalanx.trainer.run import is_overridden
from phalanx.trainer.state import TrainerFn

if TYPE_CHECKING:
    from phalanx.trainer.trainer import Trainer

__all__ = ["check_eval", "check_fit"]

_STEP = {TrainerFn.VALIDATING: "validation_step", TrainerFn.TESTING: "test_step"}
_DATA_HOOK = {
    TrainerFn.VALIDATING: "val_dataloader",
    TrainerFn.TESTING: "test_dataloader",
    TrainerFn.PREDICTING: "predict_dataloader",
}


def _check_module(model: Any, fn: str) -> None:
    from phalanx.module import Module

    if not isinstance(model, Module):
        msg = (
            f"{fn}() expects a phalanx.Module, got {type(model).__module__}.{type(model).__qualname__}. Fix: subclass "
            "phalanx.Module (it is a torch.nn.Module) and define training_step and configure_optimizers."
        )
        raise MisconfigurationError(msg)


def check_fit(trainer: Trainer, model: Any, train: Any, val: Any, ckpt_path: Any) -> str | None:
    """Validate ``fit``'s arguments; returns the resolved checkpoint path."""
    _check_module(model, "fit")
    missing = [name for name in ("training_step", "configure_optimizers") if not is_overridden(model, name)]
    if missing:
        msg = (
            f"{type(model).__qualname__} does not define {' and '.join(missing)}, which fit() needs. Define "
            "`training_step(self, batch, batch_idx)` returning the loss and `configure_optimizers(self)` "
            "returning an optimizer."
        )
        raise MisconfigurationError(msg)
    if train is not None:
        as_loader_list(train, argument="train_dataloaders", multiple=False)
    elif not is_overridden(model, "train_dataloader"):
        msg = (
            f"fit() got no training data: pass train_dataloaders=DataLoader(...) or define "
            f"{type(model).__qualname__}.train_dataloader()."
        )
        raise MisconfigurationError(msg)
    if val is not None:
        as_loader_list(val, argument="val_dataloaders", multiple=True)
    return resolve_ckpt_path(trainer, ckpt_path, "fit")


def check_eval(trainer: Trainer, fn: TrainerFn, model: Any, dataloaders: Any, ckpt_path: Any) -> tuple[Any, str | None]:
    """Validate ``validate``/``test``/``predict`` arguments; returns (model, checkpoint path)."""
    name = fn.value
    if model is None:
        model = trainer.module
        if model is None:
            msg = f"{name}() needs a model: call trainer.{name}(model, ...) (no earlier run left one attached)."
            raise MisconfigurationError(msg)
    _check_module(model, name)
    step = _STEP.get(fn)
    if step is not None and not is_overridden(model, step):
        msg = f"{type(model).__qualname__} does not define {step}, which {name}() needs; define `{step}(self, batch, batch_idx)`."
        raise MisconfigurationError(msg)
    if dataloaders is not None:
        as_loader_list(dataloaders, argument="dataloaders", multiple=True)
    elif not is_overridden(model, _DATA_HOOK[fn]):
        msg = f"{name}() got no data: pass dataloaders=DataLoader(...) or define {type(model).__qualname__}.{_DATA_HOOK[fn]}()."
        raise MisconfigurationError(msg)
    return model, resolve_ckpt_path(trainer, ckpt_path, name)
