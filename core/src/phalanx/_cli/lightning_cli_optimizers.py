"""``--optimizer`` / ``--lr_scheduler``: optimizers from the config instead of the Module's ``configure_optimizers``.

LightningCLI adds an optimizer and a scheduler group (any ``torch.optim.Optimizer`` and
``LRScheduler`` subclass, by class path) to every parser, linked ``"AUTOMATIC"``. When the user
gives ``--optimizer``, the CLI builds it (and the scheduler) on the Module's parameters and
replaces the Module's ``configure_optimizers`` with :meth:`LightningCLI.configure_optimizers`, so
trying another optimizer is a command-line change, not a code change; without ``--optimizer`` the
Module keeps its own. A CLI that registers several groups must link them itself.
"""

from __future__ import annotations

from functools import partial, update_wrapper
from types import MethodType
from typing import Any

from torch.optim import Optimizer

from phalanx._cli.lightning_cli_parser import LRSchedulerTypeTuple, Namespace, instantiate_class
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.rank_zero import rank_zero_warn

__all__ = ["replace_configure_optimizers", "with_class_path"]


def replace_configure_optimizers(cli: Any, parser: Any) -> None:
    """Give ``cli.model`` a ``configure_optimizers`` built from the AUTOMATIC groups, if one was configured.

    Args:
        cli: The LightningCLI, after its classes were instantiated.
        parser: The parser of the subcommand being run (it holds the registered groups).

    Raises:
        MisconfigurationError: more than one optimizer or scheduler group is marked AUTOMATIC.
    """
    optimizers = _automatic(Optimizer, parser.optimizer_groups)
    lr_schedulers = _automatic(LRSchedulerTypeTuple, parser.lr_scheduler_groups)
    if not optimizers:
        return
    if len(optimizers) > 1 or len(lr_schedulers) > 1:
        msg = (
            f"`{type(cli).__name__}` can wire at most one optimizer and one lr_scheduler marked 'AUTOMATIC', "
            f"found {optimizers + lr_schedulers}. Fix: link the argument groups with `link_to` and implement "
            "`configure_optimizers` in the Module."
        )
        raise MisconfigurationError(msg)
    # The instantiated config, inside the subcommand's section when there is one.
    config = cli.config_init.get(str(cli.subcommand), cli.config_init)
    optimizer_class = parser.optimizer_groups[optimizers[0]][0]
    optimizer_init = config.get(optimizers[0])
    if not isinstance(optimizer_class, tuple):
        optimizer_init = with_class_path(optimizer_class, optimizer_init)
    if not optimizer_init:
        return  # the group was registered automatically, and the user gave no optimizer
    lr_scheduler_init = None
    if lr_schedulers:
        lr_scheduler_class = parser.lr_scheduler_groups[lr_schedulers[0]][0]
        lr_scheduler_init = config.get(lr_schedulers[0])
        if not isinstance(lr_scheduler_class, tuple):
            lr_scheduler_init = with_class_path(lr_scheduler_class, lr_scheduler_init)
    model = cli.model
    if is_overridden("configure_optimizers", model, Module):
        rank_zero_warn(
            f"`{type(model).__name__}.configure_optimizers` will be overridden by "
            f"`{type(cli).__name__}.configure_optimizers`."
        )
    optimizer = instantiate_class(model.parameters(), _as_dict(optimizer_init))
    lr_scheduler = instantiate_class(optimizer, _as_dict(lr_scheduler_init)) if lr_scheduler_init else None
    fn = partial(cli.configure_optimizers, optimizer=optimizer, lr_scheduler=lr_scheduler)
    update_wrapper(fn, cli.configure_optimizers)  # so is_overridden sees a replacement
    model.configure_optimizers = MethodType(fn, model)


def _automatic(class_type: type | tuple[type, ...], register: dict[str, tuple[Any, str]]) -> list[str]:
    """The keys of ``register`` whose classes are ``class_type`` subclasses linked ``"AUTOMATIC"``."""
    found = []
    for key, (base_class, link_to) in register.items():
        bases = base_class if isinstance(base_class, tuple) else (base_class,)
        if link_to == "AUTOMATIC" and any(issubclass(c, class_type) for c in bases):
            found.append(key)
    return found


def _as_dict(init: Any) -> dict[str, Any]:
    return init.as_dict() if isinstance(init, Namespace) else dict(init)


def with_class_path(class_type: type, init_args: Any = None) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": ...}`` for ``class_type``: how jsonargparse names a class and its arguments."""
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": f"{class_type.__module__}.{class_type.__name__}", "init_args": init_args or {}}
