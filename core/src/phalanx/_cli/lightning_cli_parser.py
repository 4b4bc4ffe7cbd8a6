"""LightningArgumentParser: jsonargparse's parser, taught the Trainer, Modules, optimizers and schedulers.

This is the parser behind :class:`phalanx.cli.LightningCLI` and ``phalanx fit``. It is
jsonargparse's (so configs, ``--print_config``, ``class_path`` / ``init_args`` and every type
check are jsonargparse's, exactly as under Lightning), plus the methods Lightning adds:
:meth:`~LightningArgumentParser.add_lightning_class_args`, ``add_optimizer_args`` and
``add_lr_scheduler_args``. Two things differ on purpose: help is wrapped to at most 100 columns,
and a bad config or argument prints one error that names the key and says what to do
(:mod:`phalanx._cli.lightning_cli_errors`) instead of the whole usage block.

jsonargparse is an optional dependency (``phalanx-core[cli]``); importing this module without it
raises one ``ModuleNotFoundError`` naming the install command. Nothing imports this module until
a CLI name is used, so ``phalanx strategies`` stays torch-free.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, Optional, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from phalanx._cli.lightning_cli_errors import explain
from phalanx._cli.messages import terminal_width
from phalanx.callbacks.callback import Callback
from phalanx.datamodule import DataModule
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer

_INSTALL = "pip install 'phalanx-core[cli]'"

try:
    import docstring_parser  # noqa: F401  (part of jsonargparse[signatures]: parameter help from docstrings)
    from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, class_from_function
except ImportError as _missing:
    _msg = f"phalanx's LightningCLI and `phalanx fit` need jsonargparse[signatures] ({_missing}). Fix: {_INSTALL}"
    raise ModuleNotFoundError(_msg, name="jsonargparse") from None


def _configure_jsonargparse() -> None:
    """Read configs through fsspec (paths are URLs) and never resolve torch's import paths."""
    from jsonargparse import register_unresolvable_import_paths

    register_unresolvable_import_paths(torch)  # torch's re-exported names break path resolution
    try:
        from jsonargparse import set_parsing_settings

        set_parsing_settings(config_read_mode_fsspec_enabled=True)
    except ImportError:  # jsonargparse < 4.40
        from jsonargparse import set_config_read_mode

        set_config_read_mode(fsspec_enabled=True)


_configure_jsonargparse()

__all__ = [
    "ActionConfigFile",
    "ArgsType",
    "LRSchedulerCallable",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "LightningArgumentParser",
    "Namespace",
    "OptimizerCallable",
    "ReduceLROnPlateau",
    "class_from_function",
    "instantiate_class",
    "instantiate_module",
    "keep_none",
]


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau plus the metric it watches, so a config can name it.

    Args:
        optimizer: The optimizer whose learning rate is reduced.
        monitor: The logged metric passed to ``step()`` (``"val_loss"``).
        *args: The rest of torch's ``ReduceLROnPlateau`` arguments.
        **kwargs: The rest of torch's ``ReduceLROnPlateau`` arguments.
    """

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


# The CLI's ReduceLROnPlateau carries ``monitor``; torch's own would leave the Trainer guessing.
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerType = type[LRScheduler] | type[ReduceLROnPlateau]

# Type aliases for CLI authors (Lightning's names): what ``args=`` takes, and dependency-injected
# optimizer / scheduler factories for a Module's ``__init__``.
ArgsType = list[str] | dict[str, Any] | Namespace | None
OptimizerCallable = Callable[[Iterable[Any]], Optimizer]
LRSchedulerCallable = Callable[[Optimizer], LRScheduler | ReduceLROnPlateau]

_Registered = dict[str, tuple[type | tuple[type, ...], str]]


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's ArgumentParser with Lightning's extra methods, narrow help and one-line errors.

    Args:
        *args: jsonargparse ``ArgumentParser`` arguments.
        description: Shown by ``--help``.
        env_prefix: Prefix of environment variables (``PHALANX_TRAINER__MAX_EPOCHS``); read only
            with ``default_env=True``. Lightning's is ``PL``.
        default_env: Whether to read arguments from environment variables.
        **kwargs: jsonargparse ``ArgumentParser`` arguments.
    """

    def __init__(
        self,
        *args: Any,
        description: str = "phalanx Trainer command line tool",
        env_prefix: str = "PHALANX",
        default_env: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        self.callback_keys: list[str] = []
        # Kept apart so the CLI knows which optimizer / scheduler groups it must wire itself.
        self._optimizers: _Registered = {}
        self._lr_schedulers: _Registered = {}

    @property
    def optimizer_groups(self) -> dict[str, tuple[type | tuple[type, ...], str]]:
        """The optimizer groups added so far: key -> (class or classes, ``link_to``)."""
        return self._optimizers

    @property
    def lr_scheduler_groups(self) -> dict[str, tuple[type | tuple[type, ...], str]]:
        """The learning-rate scheduler groups added so far: key -> (class or classes, ``link_to``)."""
        return self._lr_schedulers

    def known_keys(self) -> set[str]:
        """Every dotted key this parser and its subcommand parsers accept (subcommand names left out).

        Used to suggest the closest valid key when a config names an unknown one.
        """
        keys: set[str] = set()
        for action in self._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict) and choices and all(isinstance(p, ArgumentParser) for p in choices.values()):
                for sub in choices.values():
                    keys |= sub.known_keys() if isinstance(sub, LightningArgumentParser) else set()
                continue
            dest = getattr(action, "dest", "")
            if dest and dest not in {"help", "config", "print_config"} and not dest.startswith("=="):
                keys.add(dest)
        return keys

    def subcommand_names(self) -> set[str]:
        """The names of this parser's subcommands (``fit``, ``validate``, ...), if it has any."""
        names: set[str] = set()
        for action in self._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict) and choices and all(isinstance(p, ArgumentParser) for p in choices.values()):
                names |= set(choices)
        return names

    def add_lightning_class_args(
        self,
        lightning_class: type[Any] | Callable[..., Any],
        nested_key: str,
        subclass_mode: bool = False,
        required: bool = True,
    ) -> list[str]:
        """Add the ``__init__`` arguments of a Trainer, Module, DataModule or Callback under ``nested_key``.

        Args:
            lightning_class: The class, or a function returning an instance of one.
            nested_key: Where its arguments go (``"model"`` gives ``--model.hidden``).
            subclass_mode: Accept any subclass, chosen with ``class_path``.
            required: Whether the group must be given (subclass mode only).

        Returns:
            The names of the arguments added.

        Raises:
            MisconfigurationError: ``lightning_class`` is none of the four kinds.
        """
        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        if not (
            isinstance(lightning_class, type) and issubclass(lightning_class, (Trainer, Module, DataModule, Callback))
        ):
            msg = (
                f"Cannot add arguments from {lightning_class!r} under {nested_key!r}: it is not a subclass of "
                "Trainer, Module, DataModule or Callback. Fix: pass one of those classes, or a function whose "
                "return annotation is one."
            )
            raise MisconfigurationError(msg)
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            added = self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
            return list(added or [])  # jsonargparse returns None here: one group, no per-argument names
        if issubclass(lightning_class, Trainer):
            return self._add_trainer_args(lightning_class, nested_key)
        return list(
            self.add_class_arguments(
                lightning_class, nested_key, fail_untyped=False, instantiate=True, sub_configs=True
            )
        )

    def _add_trainer_args(self, trainer_class: type[Trainer], nested_key: str) -> list[str]:
        """The Trainer's arguments, not instantiated (the CLI adds callbacks first), callbacks also by name.

        The Trainer resolves ``callbacks=["early_stopping"]`` through the callback registry, but its
        signature types callbacks as instances; the CLI widens the type so a name passes parsing
        (``--trainer.callbacks+=early_stopping``) next to ``class_path`` entries.
        """
        import inspect

        by_name = "callbacks" in inspect.signature(trainer_class).parameters
        skip: set[str | int] = {"callbacks"} if by_name else set()
        added = self.add_class_arguments(
            trainer_class, nested_key, fail_untyped=False, instantiate=False, sub_configs=True, skip=skip
        )
        if not by_name:
            return list(added)
        self.add_argument(
            f"--{nested_key}.callbacks",
            type=Optional[Union[list[Union[Callback, str]], Callback, str]],  # noqa: UP007, UP045  (jsonargparse reads typing forms on every version)
            default=None,
            help="Callbacks: class paths (class_path / init_args) or registered names (early_stopping).",
        )
        return [*added, f"{nested_key}.callbacks"]

    def add_optimizer_args(
        self,
        optimizer_class: type[Optimizer] | tuple[type[Optimizer], ...] = (Optimizer,),
        nested_key: str = "optimizer",
        link_to: str = "AUTOMATIC",
    ) -> None:
        """Add an optimizer's arguments (all but ``params``) under ``nested_key``.

        Args:
            optimizer_class: An Optimizer subclass, or a tuple of them to allow any of their subclasses.
            nested_key: Where its arguments go.
            link_to: The parser key the optimizer is passed to, or ``"AUTOMATIC"``: the CLI then
                replaces the Module's ``configure_optimizers`` when one is given.
        """
        classes = optimizer_class if isinstance(optimizer_class, tuple) else (optimizer_class,)
        _check_subclasses(classes, (Optimizer,), "optimizer_class")
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"params"}}
        if isinstance(optimizer_class, tuple):
            self.add_subclass_arguments(optimizer_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(optimizer_class, nested_key, sub_configs=True, **kwargs)
        self._optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(
        self,
        lr_scheduler_class: LRSchedulerType | tuple[LRSchedulerType, ...] = LRSchedulerTypeTuple,
        nested_key: str = "lr_scheduler",
        link_to: str = "AUTOMATIC",
    ) -> None:
        """Add a learning-rate scheduler's arguments (all but ``optimizer``) under ``nested_key``.

        Args:
            lr_scheduler_class: An LRScheduler (or this module's ReduceLROnPlateau) subclass, or a
                tuple of them to allow any of their subclasses.
            nested_key: Where its arguments go.
            link_to: The parser key the scheduler is passed to, or ``"AUTOMATIC"``.
        """
        classes = lr_scheduler_class if isinstance(lr_scheduler_class, tuple) else (lr_scheduler_class,)
        _check_subclasses(classes, LRSchedulerTypeTuple, "lr_scheduler_class")
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"optimizer"}}
        if isinstance(lr_scheduler_class, tuple):
            self.add_subclass_arguments(lr_scheduler_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(lr_scheduler_class, nested_key, sub_configs=True, **kwargs)
        self._lr_schedulers[nested_key] = (lr_scheduler_class, link_to)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse sizes help to the whole terminal; phalanx caps every line it prints at 100 columns.
        formatter: Callable[..., argparse.HelpFormatter] = self.formatter_class
        return formatter(prog=self.prog, width=terminal_width() - 2)

    def format_usage(self) -> str:
        """The usage line, wrapped to at most 100 columns."""
        return _fit_lines(super().format_usage(), terminal_width() - 2)

    def format_help(self, *args: Any, **kwargs: Any) -> str:
        """The help, every line (group titles and long usage entries too) wrapped to at most 100 columns."""
        return _fit_lines(super().format_help(*args, **kwargs), terminal_width() - 2)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """Exit with one error naming the bad key and the fix (or raise, with ``exit_on_error=False``)."""
        # JSONARGPARSE_DEBUG is jsonargparse's own switch for raising instead of exiting.
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG", "").lower() in {"1", "true", "yes", "on"}:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(explain(parser, prog, message) + "\n")
        self.exit(2)
        # argparse's exit() never returns; without jsonargparse installed (the lint session) mypy
        # cannot see that, so the function says it here too.
        raise SystemExit(2)


def _fit_lines(text: str, width: int) -> str:
    """Wrap the lines argparse leaves long: group titles (class reprs) and one-entry usage lines."""
    import textwrap

    lines = []
    for line in text.splitlines():
        if len(line) <= width:
            lines.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        wrapped = textwrap.wrap(
            line.strip(), width=width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
        )
        lines.extend(wrapped or [line])
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def keep_none() -> dict[str, bool]:
    """The keyword that makes ``parser.dump`` / ``save`` write ``null`` values too (a full, reproducible config).

    jsonargparse 4.49 renamed ``skip_none`` to ``skip_unset``; the old name still works but warns.
    """
    from jsonargparse import __version__ as version

    major, minor = (int(part) for part in version.split(".")[:2])
    return {"skip_unset": False} if (major, minor) >= (4, 49) else {"skip_none": False}


def _check_subclasses(classes: tuple[Any, ...], bases: tuple[type, ...], name: str) -> None:
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, bases))]
    if bad:
        msg = (
            f"{name}={bad[0]!r} is not a subclass of {' or '.join(b.__qualname__ for b in bases)}. "
            "Fix: pass such a class, or a tuple of them."
        )
        raise MisconfigurationError(msg)


def instantiate_module(class_type: type, config: dict[str, Any]) -> Any:
    """Build a ``class_type`` (a Module, DataModule, ...) from a config dict, as a config file would.

    ``config`` holds ``__init__`` arguments; with a ``"_class_path"`` entry it names a subclass of
    ``class_type`` to build instead, and the other entries are its arguments. Nested configs
    (``{"class_path": ..., "init_args": ...}``) are built too, as jsonargparse builds them.
    """
    parser = ArgumentParser(exit_on_error=False)
    if "_class_path" in config:
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        config = {
            "class_path": config["_class_path"],
            "dict_kwargs": {key: value for key, value in config.items() if key != "_class_path"},
        }
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    built = parser.instantiate_classes(parser.parse_object({"module": config}))
    return built.module


def instantiate_class(args: Any | tuple[Any, ...], init: dict[str, Any]) -> Any:
    """Build ``init["class_path"](*args, **init["init_args"])``: an optimizer from its config, say.

    Args:
        args: Positional arguments (a tuple, or one value): the parameters for an optimizer.
        init: ``{"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1}}``.

    Returns:
        The new object.
    """
    import importlib

    kwargs = init.get("init_args", {})
    positional = args if isinstance(args, tuple) else (args,)
    module_name, _, class_name = init["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(*positional, **kwargs)
