"""The Trainer's components from its arguments: callbacks, loggers and the profiler.

``callbacks=`` and ``logger=`` take instances or registered names (built here through
:data:`~phalanx.registry.CallbackRegistry` / :data:`~phalanx.registry.LoggerRegistry`, as a vendor's
would be); the defaults (progress bar, model summary, ModelCheckpoint, a Timer for ``max_time``) are
added, and what ``Module.configure_callbacks`` returns is merged in, in Lightning's order.
"""

from __future__ import annotations

import warnings
from typing import Any

from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.arguments import argument_error, as_list
from phalanx.trainer.config import TrainerConfig
from phalanx.utilities.model_helpers import is_overridden

__all__ = ["add_default_callbacks", "add_module_callbacks", "check_callbacks", "check_loggers", "check_profiler"]


def _named(argument: str, value: Any, registry: Any, name: str, **params: Any) -> Any:
    """Build the registered ``name``; an unknown one names the Trainer argument as well as the choices."""
    from phalanx.errors import UnknownNameError

    try:
        return registry.get(name, **params)
    except UnknownNameError as err:
        msg = f"Trainer({argument}={value!r}): {err}"
    raise UnknownNameError(msg)  # outside the except: one error, not one raised while handling another


def check_callbacks(value: Any) -> list[Any]:
    """A Callback, a registered callback name, or a list of them; names become instances here."""
    from phalanx.callbacks.callback import Callback
    from phalanx.registry import CallbackRegistry

    callbacks = [_named("callbacks", value, CallbackRegistry, i) if isinstance(i, str) else i for i in as_list(value)]
    for item in callbacks:
        if not isinstance(item, Callback):
            raise argument_error(
                "callbacks",
                value,
                f"a phalanx.callbacks.Callback, a registered name ({', '.join(CallbackRegistry.names())}) or a list of them",
                f"subclass phalanx.callbacks.Callback (got an item of type {type(item).__name__})",
            )
    return callbacks


def _is_logger(item: Any) -> bool:
    """Whether ``item`` can stand as a logger: a Logger, or any object with its methods (duck typing, as Lightning)."""
    from phalanx.loggers import Logger

    return isinstance(item, Logger) or (not isinstance(item, (str, bool, int, float)) and hasattr(item, "log_metrics"))


def default_logger(root_dir: str) -> Any:
    """What ``logger=True`` gives, as in Lightning: a TensorBoardLogger under ``<root_dir>/lightning_logs``
    when tensorboard is installed, else a CSVLogger there.

    Under SLURM the TensorBoard version is the job id, so a requeued job keeps writing to its own folder.
    """
    import importlib.util

    from phalanx.loggers import CSVLogger

    if importlib.util.find_spec("tensorboard") is None:
        return CSVLogger(root_dir)
    from phalanx.loggers import TensorBoardLogger

    return TensorBoardLogger(root_dir, version=_slurm_job_id())


def _slurm_job_id() -> int | None:
    """The SLURM job id of a batch job (None outside SLURM and in an interactive ``srun --pty bash``)."""
    import os

    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit() or os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    return int(job_id)


def check_loggers(value: Any, root_dir: str) -> list[Any]:
    """True (see :func:`default_logger`), False/None, a logger, a registered logger name, or a list.

    A name builds the registered logger with ``save_dir=root_dir``, so ``logger="tensorboard"``
    writes where ``logger=True`` would. Like Lightning, any object with a logger's methods is
    accepted (``phalanx.loggers.Logger`` subclasses, or a stand-in such as a ``Mock``).
    """
    from phalanx.registry import LoggerRegistry

    if value is True:
        return [default_logger(root_dir)]
    if value is False or value is None:
        return []
    items = as_list(value) if isinstance(value, (list, tuple, str)) or _is_logger(value) else None
    loggers = None
    if items is not None:
        loggers = [
            _named("logger", value, LoggerRegistry, i, save_dir=root_dir) if isinstance(i, str) else i for i in items
        ]
    if loggers is None or not all(_is_logger(item) for item in loggers):
        choices = (
            "True, False, a phalanx.loggers.Logger (or an object with its methods), "
            f"a registered name ({', '.join(LoggerRegistry.names())}) or a list"
        )
        raise argument_error("logger", value, choices, "pass logger=True")
    return loggers


def check_profiler(value: Any) -> Any:
    """None, ``"simple"``, ``"advanced"``, ``"pytorch"`` or a :class:`phalanx.profilers.Profiler`; None when off."""
    if value is None:
        return None
    from phalanx.profilers import resolve_profiler

    try:
        return resolve_profiler(value)
    except MisconfigurationError as error:
        raise argument_error(
            "profiler",
            value,
            "None, 'simple', 'advanced', 'pytorch' or a phalanx.profilers.Profiler",
            "pass profiler='simple'",
        ) from error


def add_default_callbacks(
    callbacks: list[Any], checkpointing_on: bool, bar_on: bool, config: TrainerConfig
) -> list[Any]:
    """Add the default progress bar / model summary / ModelCheckpoint (and a Timer for ``max_time``);
    put checkpointing callbacks last.

    Checkpointing runs after every other callback so the state it saves is final for the step.

    Raises:
        MisconfigurationError: A ModelCheckpoint/progress bar given while its flag is False.
    """
    from phalanx.callbacks.model_checkpoint import ModelCheckpoint
    from phalanx.callbacks.model_summary import ModelSummary
    from phalanx.callbacks.progress import TQDMProgressBar
    from phalanx.callbacks.progress_bar import ProgressBar
    from phalanx.callbacks.timer import Timer

    has_ckpt = any(isinstance(cb, ModelCheckpoint) for cb in callbacks)
    bars = [cb for cb in callbacks if isinstance(cb, ProgressBar)]
    if len(bars) > 1:
        msg = (
            f"You added multiple progress bar callbacks to the Trainer ({[type(cb).__name__ for cb in bars]}); "
            "the Trainer draws one: keep only one of them in callbacks."
        )
        raise MisconfigurationError(msg)
    has_bar = bool(bars)
    if has_ckpt and not checkpointing_on:
        msg = "Trainer(enable_checkpointing=False) conflicts with the ModelCheckpoint in callbacks; drop one of them."
        raise MisconfigurationError(msg)
    if has_bar and not bar_on:
        msg = (
            f"Trainer was configured with `enable_progress_bar=False` but found `{type(bars[0]).__name__}` in "
            "callbacks list: the two conflict; drop one of them."
        )
        raise MisconfigurationError(msg)
    callbacks = list(callbacks)
    if config.enable_model_summary and not any(isinstance(cb, ModelSummary) for cb in callbacks):
        # with the rich bar, the rich summary (rich is installed: the bar needed it), as Lightning
        from phalanx.callbacks.rich_progress import RichProgressBar

        if any(isinstance(cb, RichProgressBar) for cb in callbacks):
            from phalanx.callbacks.rich_model_summary import RichModelSummary

            callbacks.append(RichModelSummary())
        else:
            callbacks.append(ModelSummary())
    if bar_on and not has_bar:
        callbacks.append(TQDMProgressBar())
    if config.max_time is not None:
        if any(isinstance(cb, Timer) for cb in callbacks):
            warnings.warn(
                "Trainer(max_time=...) is ignored: callbacks already hold a Timer, which decides.", stacklevel=3
            )
        else:
            callbacks.append(Timer(duration=config.max_time, interval="step"))
    if checkpointing_on and not has_ckpt:
        callbacks.append(ModelCheckpoint())
    last = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    return [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)] + last


def add_module_callbacks(callbacks: list[Any], module: Any) -> list[Any]:
    """Merge what ``module.configure_callbacks()`` returns: each replaces the Trainer's callbacks of
    its type, the rest are added; checkpointing callbacks stay last (Lightning's rule).

    Raises:
        MisconfigurationError: ``configure_callbacks`` returned something that is not a Callback.
    """
    from phalanx.callbacks.callback import Callback
    from phalanx.callbacks.model_checkpoint import ModelCheckpoint

    if not is_overridden("configure_callbacks", module, Module):
        return callbacks
    extra = as_list(module.configure_callbacks())
    wrong = [type(cb).__qualname__ for cb in extra if not isinstance(cb, Callback)]
    if wrong:
        msg = (
            f"{type(module).__qualname__}.configure_callbacks() returned {wrong}; return a Callback or a list of "
            "phalanx.callbacks.Callback instances."
        )
        raise MisconfigurationError(msg)
    types = {type(cb) for cb in extra}
    merged = [cb for cb in callbacks if type(cb) not in types and not any(cb is e for e in extra)] + extra
    last = [cb for cb in merged if isinstance(cb, ModelCheckpoint)]
    return [cb for cb in merged if not isinstance(cb, ModelCheckpoint)] + last
