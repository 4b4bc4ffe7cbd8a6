"""The plugin-author helpers: everything a strategy package may use besides the contract classes.

A vendor's strategy needs a few building blocks the built-in strategies share: moving optimizer
state, calling a Module method through a wrapper so the wrapper's hooks run, mapping over nested
batches, casting floats, writing the portable checkpoint that ``phalanx checkpoint convert``
produces, bringing a worker's results back to the main process, and looking up an installed
version. They live here, under stable public names, so no plugin (in this repository or outside
it) imports a private core module; the layering check rejects a plugin that does.

Names are resolved lazily: importing this module does not import torch, so a ``_plugin.py`` may
use :func:`installed_version` while strategies are being listed.

=============================================  ================================================
name                                           what it is for
=============================================  ================================================
``optimizers_to_device(optimizers, device)``   move optimizer state after a restore or offload
``init_optimizers_and_lr_schedulers(module)``  run ``configure_optimizers`` and parse its answer
``LRSchedulerConfig``                          one scheduler and when it steps
``call_through_wrapper(wrapper, module, name)``  run ``module.<name>`` by calling ``wrapper``
``apply_to_collection(data, dtype, fn)``       map ``fn`` over matching leaves of nested data
``move_data_to_device(batch, device)``         move every tensor of a batch
``cast_floats(data, dtype)``                   cast the floating-point tensors of nested data
``default_dtype(dtype)``                       context: new float tensors get ``dtype``
``write_portable_checkpoint(...)``             write the single-file format convert produces
``save_worker_results`` / ``load_worker_results``  local rank 0's results to the main process
``installed_version(distribution)``            version of an installed distribution, or None
``parse_int_env(name, value)``                 read an integer environment variable clearly
=============================================  ================================================
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "LRSchedulerConfig",
    "apply_to_collection",
    "call_through_wrapper",
    "cast_floats",
    "default_dtype",
    "init_optimizers_and_lr_schedulers",
    "installed_version",
    "load_worker_results",
    "move_data_to_device",
    "optimizers_to_device",
    "parse_int_env",
    "save_worker_results",
    "write_portable_checkpoint",
]

_LAZY = {
    "LRSchedulerConfig": "phalanx._optim:LRSchedulerConfig",
    "init_optimizers_and_lr_schedulers": "phalanx._optim:init_optimizers_and_lr_schedulers",
    "optimizers_to_device": "phalanx._optim:optimizers_to_device",
    "call_through_wrapper": "phalanx.strategies._redirect:call_through_wrapper",
    "apply_to_collection": "phalanx._collections:apply_to_collection",
    "move_data_to_device": "phalanx._collections:move_data_to_device",
    "cast_floats": "phalanx.precision.precision:_cast_floats",
    "default_dtype": "phalanx.precision.precision:_default_dtype",
    "write_portable_checkpoint": "phalanx._builtin._convert:write_portable",
    "parse_int_env": "phalanx.environments.local:parse_int_env",
}

if TYPE_CHECKING:
    from phalanx._builtin._convert import write_portable as write_portable_checkpoint
    from phalanx._collections import apply_to_collection, move_data_to_device
    from phalanx._optim import LRSchedulerConfig, init_optimizers_and_lr_schedulers, optimizers_to_device
    from phalanx.environments.local import parse_int_env
    from phalanx.precision.precision import _cast_floats as cast_floats
    from phalanx.precision.precision import _default_dtype as default_dtype
    from phalanx.strategies._redirect import call_through_wrapper


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (e.g. ``"torch-xla"``), or None when absent.

    Reads installed metadata only; nothing is imported, so availability checks stay fast.
    """
    from phalanx import _metadata

    return _metadata.version(distribution)


def save_worker_results(strategy: Any, trainer: Any, result: Any, path: str) -> None:
    """In a launched worker: write what the main process needs after the stage to ``path``.

    That is the Module's weights, the Trainer's ``callback_metrics``, the checkpoint callbacks'
    best/last paths and the stage's return value, all on CPU; written atomically. A launcher calls
    it on local rank 0 only.
    """
    from phalanx.launchers import _results

    _results.save(_results.collect(strategy, trainer, result), path)


def load_worker_results(path: str, strategy: Any, trainer: Any) -> Any:
    """In the main process: load what :func:`save_worker_results` wrote and return the stage's result.

    The weights go into this process's Module and the metrics and paths into its Trainer and
    callbacks, so ``trainer.callback_metrics`` and ``model`` look as they would after ``ddp``.
    Returns None when no worker wrote anything.
    """
    from phalanx.launchers import _results

    payload = _results.load(path)
    if payload is None:
        return None
    return _results.recover_in_main_process(payload, strategy, trainer)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        msg = f"module 'phalanx.utilities' has no attribute {name!r}; available: {', '.join(__all__)}"
        raise AttributeError(msg)
    module_name, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
