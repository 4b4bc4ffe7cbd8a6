"""Up-front validation of what ``fit`` / ``validate`` / ``test`` / ``predict`` are given.

The model (a Module, or ``torch.compile`` of one), the dataloaders or DataModule, and the
checkpoint path are checked in the calling process, before any process starts; each check raises
one :class:`MisconfigurationError` naming the argument, the bad value and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.checkpointing import resolve_ckpt_path
from phalanx.trainer.data import as_loader_list
from phalanx.trainer_view import TrainerFn
from phalanx.utilities.model_helpers import is_overridden

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["check_datamodule", "check_eval", "check_fit", "no_training_data", "split_datamodule", "unwrap_compiled"]

_STEP = {TrainerFn.VALIDATING: "validation_step", TrainerFn.TESTING: "test_step"}
_DATA_HOOK = {
    TrainerFn.VALIDATING: "val_dataloader",
    TrainerFn.TESTING: "test_dataloader",
    TrainerFn.PREDICTING: "predict_dataloader",
}


def unwrap_compiled(model: Any) -> Any:
    """``torch.compile(module)`` given to an entry point: the Module itself, its compile remembered.

    The strategy wraps (or shards) the plain Module and then compiles it again with the same
    options (:func:`phalanx.utilities.compile.reapply_compile`), as Lightning does.
    """
    from phalanx.utilities.compile import from_compiled

    return from_compiled(model)


def _check_module(model: Any, fn: str) -> None:
    if not isinstance(model, Module):
        msg = (
            f"{fn}() expects a phalanx.Module, got {type(model).__module__}.{type(model).__qualname__}. Fix: subclass "
            "phalanx.Module (it is a torch.nn.Module) and define training_step and configure_optimizers."
        )
        raise MisconfigurationError(msg)


_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def check_datamodule(datamodule: Any, loaders: dict[str, Any], fn: str) -> Any:
    """A DataModule (or None); it cannot come together with dataloaders.

    Raises:
        MisconfigurationError: Not a DataModule, or given together with dataloaders.
    """
    if datamodule is None:
        return None
    from phalanx.datamodule import DataModule

    if not isinstance(datamodule, DataModule):
        msg = (
            f"{fn}(datamodule=...) expects a phalanx.DataModule, got {type(datamodule).__qualname__}. Fix: subclass "
            "phalanx.DataModule, or pass the dataloaders themselves."
        )
        raise MisconfigurationError(msg)
    transfer = [name for name in _TRANSFER_HOOKS if callable(getattr(datamodule, name, None))]
    if transfer:
        msg = (
            f"{type(datamodule).__qualname__} defines {', '.join(transfer)}; phalanx calls the batch-transfer hooks "
            "of the Module only. Fix: move them to the Module (same names and arguments)."
        )
        raise MisconfigurationError(msg)
    given = [name for name, value in loaders.items() if value is not None]
    if given:
        msg = (
            f"{fn}() got both datamodule= and {' and '.join(given)}=; the data comes from one place. Fix: drop "
            f"{given[0]}, or drop datamodule."
        )
        raise MisconfigurationError(msg)
    return datamodule


def split_datamodule(first: Any, datamodule: Any) -> tuple[Any, Any]:
    """Lightning accepts a DataModule in the dataloaders' position: move it to ``datamodule``."""
    from phalanx.datamodule import DataModule

    if isinstance(first, DataModule) and datamodule is None:
        return None, first
    return first, datamodule


def _provides(name: str, model: Any, datamodule: Any) -> bool:
    from phalanx.datamodule import DataModule

    return is_overridden(name, datamodule, DataModule) or is_overridden(name, type(model), Module)


def check_fit(trainer: TrainerView, model: Any, train: Any, val: Any, datamodule: Any, ckpt_path: Any) -> str | None:
    """Validate ``fit``'s arguments; returns the resolved checkpoint path."""
    _check_module(model, "fit")
    missing = [
        name for name in ("training_step", "configure_optimizers") if not is_overridden(name, type(model), Module)
    ]
    if missing:
        msg = (
            f"{type(model).__qualname__} does not define {' and '.join(missing)}, which fit() needs. Define "
            "`training_step(self, batch, batch_idx)` returning the loss and `configure_optimizers(self)` "
            "returning an optimizer."
        )
        raise MisconfigurationError(msg)
    check_datamodule(datamodule, {"train_dataloaders": train, "val_dataloaders": val}, "fit")
    if train is not None:
        as_loader_list(train, argument="train_dataloaders", multiple=False)
    elif not _provides("train_dataloader", model, datamodule):
        raise no_training_data(model)
    if val is not None:
        as_loader_list(val, argument="val_dataloaders", multiple=True)
    return resolve_ckpt_path(trainer, ckpt_path, "fit")


def no_training_data(model: Any) -> MisconfigurationError:
    """The error for a fit without training data (checked up front, and again once the hook ran)."""
    return MisconfigurationError(
        f"fit() got no training data: pass train_dataloaders=DataLoader(...), a datamodule, or define "
        f"{type(model).__qualname__}.train_dataloader()."
    )


def check_eval(
    trainer: TrainerView, fn: TrainerFn, model: Any, dataloaders: Any, datamodule: Any, ckpt_path: Any
) -> tuple[Any, str | None]:
    """Validate ``validate``/``test``/``predict`` arguments; returns (model, checkpoint path)."""
    name = fn.value
    if model is None:
        model = trainer.lightning_module
        if model is None:
            msg = f"{name}() needs a model: call trainer.{name}(model, ...) (no earlier run left one attached)."
            raise MisconfigurationError(msg)
    _check_module(model, name)
    step = _STEP.get(fn)
    if step is not None and not is_overridden(step, type(model), Module):
        msg = f"{type(model).__qualname__} does not define {step}, which {name}() needs; define `{step}(self, batch, batch_idx)`."
        raise MisconfigurationError(msg)
    check_datamodule(datamodule, {"dataloaders": dataloaders}, name)
    if dataloaders is not None:
        as_loader_list(dataloaders, argument="dataloaders", multiple=True)
    elif not _provides(_DATA_HOOK[fn], model, datamodule):
        msg = (
            f"{name}() got no data: pass dataloaders=DataLoader(...), a datamodule, or define "
            f"{type(model).__qualname__}.{_DATA_HOOK[fn]}()."
        )
        raise MisconfigurationError(msg)
    return model, resolve_ckpt_path(trainer, ckpt_path, name)
