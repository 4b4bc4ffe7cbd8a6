"""The plugin-author helpers: everything a strategy package may use besides the contract classes.

A vendor's strategy needs a few building blocks the built-in strategies share: moving optimizer
state, calling a Module method through a wrapper so the wrapper's hooks run, mapping over nested
batches, casting floats, writing the portable checkpoint that ``phalanx checkpoint convert``
produces, bringing a worker's results back to the main process, and looking up an installed
version. They live in public modules, named like Lightning's where Lightning has one, and every
one is also importable from here by name, so no plugin (in this repository or outside it) imports
a private core module; the layering check rejects a plugin that does.

Names are resolved lazily: importing this package does not import torch, so a ``_plugin.py`` may
use :func:`installed_version` while strategies are being listed.

===============================================  ============================  =================================================
name                                             public module (``phalanx.``)  what it is for
===============================================  ============================  =================================================
``optimizers_to_device(optimizers, device)``     ``utilities.optim``           move optimizer state after a restore or offload
``init_optimizers_and_lr_schedulers(module)``    ``utilities.optim``           run ``configure_optimizers``, parse its answer
``LRSchedulerConfig``                            ``utilities.optim``           one scheduler and when it steps
``call_through_wrapper(wrapper, module, name)``  ``utilities.wrappers``        run ``module.<name>`` by calling ``wrapper``
``apply_to_collection(data, dtype, fn)``         ``utilities.apply_func``      map ``fn`` over matching leaves of nested data
``move_data_to_device(batch, device)``           ``utilities.apply_func``      move every tensor of a batch
``cast_floats(data, dtype)``                     ``utilities.dtypes``          cast the floating-point tensors of nested data
``default_dtype(dtype)``                         ``utilities.dtypes``          context: new float tensors get ``dtype``
``is_overridden(name, instance, parent)``        ``utilities.model_helpers``   whether ``instance`` replaces ``parent``'s method
``write_portable_checkpoint(...)``               ``checkpoint_io.portable``    write the single file convert produces
``save_worker_results(...)``                     ``utilities``                 a worker's results, for the main process
``load_worker_results(...)``                     ``utilities``                 load them in the main process
``installed_version(distribution)``              ``utilities``                 version of an installed distribution, or None
``parse_int_env(name, value)``                   ``environments.local``        read an integer environment variable clearly
===============================================  ============================  =================================================

Lightning's ``lightning.pytorch.utilities`` names that ported scripts, callbacks and Modules import
are here too, under the same names (each module is also importable by Lightning's path with
``lightning.pytorch`` renamed ``phalanx``: ``phalanx.utilities.rank_zero``, ``.seed``, ``.grads``,
``.types``, ``.exceptions``):

===============================================  ============================  =================================================
name                                             public module (``phalanx.``)  what it is for
===============================================  ============================  =================================================
``rank_zero_only`` (``.rank``)                   ``utilities.rank_zero``       run a function on global rank 0 only
``rank_zero_info`` / ``_warn`` / ``_debug``      ``utilities.rank_zero``       log or warn once per job, not once per rank
``rank_zero_deprecation``                        ``utilities.rank_zero``       a DeprecationWarning, on rank 0 only
``grad_norm(module, norm_type)``                 ``utilities.grads``           gradient norms to pass to ``log_dict``
``measure_flops(model, forward_fn, loss_fn)``    ``utilities.flops``           FLOPs of a step, on a meta-device model
``AttributeDict``                                ``hparams``                   a dict read by attribute (``self.hparams``)
``CombinedLoader(iterables, mode)``              ``utilities.combined_loader`` iterate several dataloaders as one
``LightningEnum``, ``GradClipAlgorithmType``     ``utilities.enums``           case-insensitive ``str`` enums
``find_shared_parameters`` / ``set_...``         ``utilities.parameter_tying`` find and restore tied weights
``is_picklable(obj)``                            ``utilities.parsing``         whether hyperparameters can be saved
``is_shared_filesystem(strategy, path)``         ``utilities.distributed``     whether all ranks see the same directory
``suggested_max_num_workers(local_world_size)``  ``utilities.data``            a ``num_workers`` bound for this machine
``disable_possible_user_warnings()``             ``utilities.warnings``        silence the maybe-false-alarm warnings
===============================================  ============================  =================================================

Every public module of ``lightning.pytorch.utilities`` exists here under the same path (the list,
and the few deliberate gaps, are in docs/migrating-from-lightning.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    # the plugin-author helpers (first table)
    "LRSchedulerConfig",
    "apply_to_collection",
    "call_through_wrapper",
    "cast_floats",
    "default_dtype",
    "init_optimizers_and_lr_schedulers",
    "installed_version",
    "is_overridden",
    "load_worker_results",
    "move_data_to_device",
    "optimizers_to_device",
    "parse_int_env",
    "save_worker_results",
    "write_portable_checkpoint",
    # Lightning's user-facing utilities (second table)
    "AttributeDict",
    "CombinedLoader",
    "GradClipAlgorithmType",
    "LightningEnum",
    "disable_possible_user_warnings",
    "find_shared_parameters",
    "grad_norm",
    "is_picklable",
    "is_shared_filesystem",
    "measure_flops",
    "rank_zero_debug",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "set_shared_parameters",
    "suggested_max_num_workers",
]

_LAZY = {
    "LRSchedulerConfig": "phalanx.utilities.optim:LRSchedulerConfig",
    "init_optimizers_and_lr_schedulers": "phalanx.utilities.optim:init_optimizers_and_lr_schedulers",
    "optimizers_to_device": "phalanx.utilities.optim:optimizers_to_device",
    "call_through_wrapper": "phalanx.utilities.wrappers:call_through_wrapper",
    "apply_to_collection": "phalanx.utilities.apply_func:apply_to_collection",
    "move_data_to_device": "phalanx.utilities.apply_func:move_data_to_device",
    "cast_floats": "phalanx.utilities.dtypes:cast_floats",
    "default_dtype": "phalanx.utilities.dtypes:default_dtype",
    "is_overridden": "phalanx.utilities.model_helpers:is_overridden",
    "write_portable_checkpoint": "phalanx.checkpoint_io.portable:write_portable_checkpoint",
    "parse_int_env": "phalanx.environments.local:parse_int_env",
    "rank_zero_only": "phalanx.utilities.rank_zero:rank_zero_only",
    "rank_zero_info": "phalanx.utilities.rank_zero:rank_zero_info",
    "rank_zero_warn": "phalanx.utilities.rank_zero:rank_zero_warn",
    "rank_zero_debug": "phalanx.utilities.rank_zero:rank_zero_debug",
    "rank_zero_deprecation": "phalanx.utilities.rank_zero:rank_zero_deprecation",
    "grad_norm": "phalanx.utilities.grads:grad_norm",
    "measure_flops": "phalanx.utilities.flops:measure_flops",
    "AttributeDict": "phalanx.hparams:AttributeDict",
    "CombinedLoader": "phalanx.utilities.combined_loader:CombinedLoader",
    "GradClipAlgorithmType": "phalanx.utilities.enums:GradClipAlgorithmType",
    "LightningEnum": "phalanx.utilities.enums:LightningEnum",
    "disable_possible_user_warnings": "phalanx.utilities.warnings:disable_possible_user_warnings",
    "find_shared_parameters": "phalanx.utilities.parameter_tying:find_shared_parameters",
    "set_shared_parameters": "phalanx.utilities.parameter_tying:set_shared_parameters",
    "is_picklable": "phalanx.utilities.parsing:is_picklable",
    "is_shared_filesystem": "phalanx.utilities.distributed:is_shared_filesystem",
    "suggested_max_num_workers": "phalanx.utilities.data:suggested_max_num_workers",
}

if TYPE_CHECKING:
    from phalanx.checkpoint_io.portable import write_portable_checkpoint
    from phalanx.environments.local import parse_int_env
    from phalanx.hparams import AttributeDict
    from phalanx.utilities.apply_func import apply_to_collection, move_data_to_device
    from phalanx.utilities.combined_loader import CombinedLoader
    from phalanx.utilities.data import suggested_max_num_workers
    from phalanx.utilities.distributed import is_shared_filesystem
    from phalanx.utilities.dtypes import cast_floats, default_dtype
    from phalanx.utilities.enums import GradClipAlgorithmType, LightningEnum
    from phalanx.utilities.flops import measure_flops
    from phalanx.utilities.grads import grad_norm
    from phalanx.utilities.model_helpers import is_overridden
    from phalanx.utilities.optim import LRSchedulerConfig, init_optimizers_and_lr_schedulers, optimizers_to_device
    from phalanx.utilities.parameter_tying import find_shared_parameters, set_shared_parameters
    from phalanx.utilities.parsing import is_picklable
    from phalanx.utilities.rank_zero import (
        rank_zero_debug,
        rank_zero_deprecation,
        rank_zero_info,
        rank_zero_only,
        rank_zero_warn,
    )
    from phalanx.utilities.warnings import disable_possible_user_warnings
    from phalanx.utilities.wrappers import call_through_wrapper


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
