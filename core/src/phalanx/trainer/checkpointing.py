"""What a checkpoint holds, how it is checked, and how a run is restored from it.

A checkpoint records the exact loop position (epoch, optimizer step, batches consumed in the epoch,
which post-batch work was done) and the random state at the start of the epoch and at save time.
Resuming replays the epoch's shuffle with the saved random state, skips the consumed batches at the
sampler level and continues with the saved random state, so a resumed run computes the same losses
and weights bit for bit as one that never stopped (same world size, deterministic data pipeline).
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.checkpoint_io.atomic import committed_path
from phalanx.checkpoint_io.checks import check_scheduler_count, compare_state_dicts, shapes
from phalanx.checkpoint_io.storage import is_remote, remote_error
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.hparams import checkpoint_hparams
from phalanx.trainer._last_checkpoint import find_last_checkpoint
from phalanx.utilities.paths import check_path
from phalanx.version import __version__

if TYPE_CHECKING:
    from phalanx.trainer.run import Run
    from phalanx.trainer_view import TrainerView

__all__ = [
    "FORMAT_VERSION",
    "capture_rng",
    "check_matches_module",
    "checkpoint_dir",
    "dump_checkpoint",
    "find_last_checkpoint",
    "load_checkpoint",
    "resolve_ckpt_path",
    "restore",
    "restore_module",
    "restore_rng",
    "restore_training_state",
]

#: Bumped when the layout changes incompatibly; newer files are refused with a clear message.
FORMAT_VERSION = 1


# ---------------------------------------------------------------------- random state
def capture_rng(generators: list[torch.Generator] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """Every random stream training may use, in a form ``torch.load(weights_only=True)`` accepts."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    state["generators"] = [generator.get_state() for generator in generators]
    return state


def restore_rng(state: dict[str, Any] | None, generators: list[torch.Generator] = ()) -> None:  # type: ignore[assignment]
    """Put back what :func:`capture_rng` returned (missing entries are left alone)."""
    if not state:
        return
    torch.set_rng_state(state["torch"])
    python = state.get("python")
    if python is not None:
        random.setstate((python[0], tuple(python[1]), python[2]))
    np = sys.modules.get("numpy")
    if np is not None and state.get("numpy") is not None:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for generator, saved in zip(generators, state.get("generators", [])):
        generator.set_state(saved)


# ---------------------------------------------------------------------- writing
def dump_checkpoint(run: Run, *, weights_only: bool = False) -> dict[str, Any]:
    """The checkpoint dict for the current state (see docs/trainer.md for the layout)."""
    trainer, module, strategy, fit_loop = run.trainer, run.module, run.strategy, run.fit_loop
    checkpoint: dict[str, Any] = {
        "phalanx_version": __version__,
        "format_version": FORMAT_VERSION,
        "strategy": trainer.strategy_name,
        "world_size": trainer.world_size,
        "module_class": f"{type(module).__module__}.{type(module).__qualname__}",
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "state_dict": strategy.module_state_dict(),
    }
    # what Module.load_from_checkpoint rebuilds the Module from (weights-only checkpoints too)
    checkpoint.update(checkpoint_hparams(module))
    datamodule = run.datamodule
    if datamodule is not None:
        checkpoint.update(checkpoint_hparams(datamodule))
    if not weights_only:
        checkpoint["loops"] = {"fit": fit_loop.state_dict()}
        checkpoint["rng_states"] = fit_loop.rng_states()
        checkpoint["optimizer_states"] = [strategy.optimizer_state(opt) for opt in strategy.optimizers]
        checkpoint["lr_schedulers"] = [config.scheduler.state_dict() for config in strategy.lr_scheduler_configs]
        checkpoint["precision_plugin"] = strategy.precision_plugin.state_dict()
        checkpoint["metrics"] = run.metrics.state_dict()
        if fit_loop.mid_accumulation:
            # gradients of an unfinished accumulation window are training state too
            checkpoint["accumulated_grads"] = {
                name: param.grad for name, param in module.named_parameters() if param.grad is not None
            }
        states = {}
        for callback in trainer.callbacks:
            state = callback.state_dict()
            if state:
                states[callback.state_key] = state
        checkpoint["callbacks"] = states
        if datamodule is not None:
            checkpoint[type(datamodule).__qualname__] = datamodule.state_dict()
        run.hooks.call_callbacks("on_save_checkpoint", checkpoint)
    module.on_save_checkpoint(checkpoint)
    return checkpoint


# ---------------------------------------------------------------------- finding
def checkpoint_dir(trainer: TrainerView) -> str:
    """Where this Trainer's checkpoints go: the first ModelCheckpoint's directory, else
    ``trainer.default_checkpoint_dir`` (what a ModelCheckpoint without ``dirpath`` uses).

    The one answer for ModelCheckpoint's default, preemption's checkpoint and ``ckpt_path="last"``.
    """
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return callback.dirpath
    return trainer.default_checkpoint_dir


def resolve_ckpt_path(trainer: TrainerView, ckpt_path: Any, fn: str) -> str | None:
    """Turn ``ckpt_path`` (a path, ``"last"``, ``"best"`` or None) into a path, failing early.

    Raises:
        MisconfigurationError: Wrong type, or ``"best"`` without a ModelCheckpoint that saved one.
        CheckpointError: A local path that does not exist.
    """
    if ckpt_path is None:
        return None
    if not isinstance(ckpt_path, (str, os.PathLike)):
        msg = (
            f"{fn}(ckpt_path={ckpt_path!r}) (type {type(ckpt_path).__name__}) is invalid: expected a path, "
            "'last' or 'best'. Fix: pass ckpt_path='path/to/file.ckpt' or ckpt_path='last'."
        )
        raise MisconfigurationError(msg)
    if ckpt_path not in ("last", "best"):
        ckpt_path = check_path(ckpt_path, argument=f"{fn}(ckpt_path=...)")
    if ckpt_path == "last":
        path = find_last_checkpoint(trainer)
        if path is None:
            warnings.warn(
                f"{fn}(ckpt_path='last'): no checkpoint found under {trainer.default_root_dir!r}; starting "
                "from scratch.",
                stacklevel=3,
            )
        return path
    if ckpt_path == "best":
        callback = next((cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)), None)
        if fn == "fit" or callback is None or not callback.best_model_path:
            msg = (
                f"{fn}(ckpt_path='best') needs a ModelCheckpoint that already saved a best model"
                + (" and is for evaluation only" if fn == "fit" else "")
                + ". Fix: pass an explicit path, or 'last'."
            )
            raise MisconfigurationError(msg)
        return callback.best_model_path
    path = os.fspath(ckpt_path)
    if is_remote(path):
        try:
            complete = committed_path(path)
        except Exception as error:  # the store's own errors (endpoint, credentials) vary by backend
            raise CheckpointError(remote_error(path, error, action="read the checkpoint", untouched=False)) from error
        if complete is None:
            msg = (
                f"{fn}(ckpt_path={path!r}): no complete checkpoint there (missing, or never committed). Check the "
                "URL, or pass ckpt_path='last' to resume from the newest committed checkpoint."
            )
            raise CheckpointError(msg)
        return complete
    if not os.path.exists(path):
        msg = (
            f"{fn}(ckpt_path={path!r}): no such file. Check the path, or pass ckpt_path='last' to resume from "
            "the newest checkpoint."
        )
        raise CheckpointError(msg)
    return path


# ---------------------------------------------------------------------- loading
def load_checkpoint(trainer: TrainerView, path: str, *, fn: str) -> dict[str, Any]:
    """Read and sanity-check a checkpoint (every rank reads).

    A strategy that restores after setup (``restore_checkpoint_after_setup``, e.g. sharded FSDP)
    loads ``"state_dict"`` and ``"optimizer_states"`` itself once the model is sharded, so their
    absence here is not an error; the loop state (``"loops"``) is still required to resume.

    Raises:
        CheckpointError: Unreadable, not a phalanx checkpoint, weights-only when resuming, or newer.
    """
    strategy = trainer.strategy
    deferred = strategy.restore_checkpoint_after_setup
    checkpoint = strategy.load_checkpoint(path)
    marker = "format_version" if deferred else "state_dict"
    if not isinstance(checkpoint, dict) or (marker not in checkpoint and "state_dict" not in checkpoint):
        keys = sorted(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        msg = (
            f"{path!r} is not a phalanx checkpoint (found {keys}, no {marker!r}). A bare state dict can be "
            "loaded with module.load_state_dict(torch.load(path)); or pick a file saved by the Trainer."
        )
        raise CheckpointError(msg)
    if checkpoint.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
        msg = (
            f"{path!r} uses checkpoint format {checkpoint['format_version']} from phalanx "
            f"{checkpoint.get('phalanx_version')}, newer than this phalanx understands ({FORMAT_VERSION}). "
            "Upgrade phalanx-core."
        )
        raise CheckpointError(msg)
    if fn == "fit" and ("loops" not in checkpoint or ("optimizer_states" not in checkpoint and not deferred)):
        msg = (
            f"{path!r} holds weights only (no optimizer state or loop position), so training cannot resume "
            "from it. Load the weights with module.load_state_dict(torch.load(path)['state_dict']) and call "
            "fit() without ckpt_path, or resume from a full checkpoint (save_weights_only=False)."
        )
        raise CheckpointError(msg)
    return checkpoint


def check_matches_module(checkpoint: dict[str, Any], module: torch.nn.Module, path: str) -> None:
    """Refuse a checkpoint of another model, listing what differs.

    Raises:
        CheckpointError: Missing/unexpected keys (with strict loading) or differently shaped tensors.
    """
    strict = getattr(module, "strict_loading", True)
    differences = compare_state_dicts(shapes(module.state_dict()), shapes(checkpoint["state_dict"]), names=strict)
    if differences:
        saved_from = checkpoint.get("module_class", "an unknown class")
        msg = (
            f"Checkpoint {path!r} (saved from {saved_from}) does not match {type(module).__qualname__}: "
            f"{differences.describe()}. Fix: pass a checkpoint of this model, or set module.strict_loading = False "
            "for key differences."
        )
        raise CheckpointError(msg)


def restore(run: Run, path: str) -> None:
    """The one restore path, run after ``strategy.setup``: read, check, load weights, then the rest.

    After setup every strategy's model and optimizers exist in their final (wrapped, sharded)
    form, so a sharded strategy loads straight into its shards. Strategies that restore state
    living only in their own objects (``restore_checkpoint_after_setup``: FSDP, DeepSpeed) check
    the checkpoint against the model themselves; for the others the Trainer does it here.
    """
    checkpoint = load_checkpoint(run.trainer, path, fn=run.fn.value)
    if not run.strategy.restore_checkpoint_after_setup:
        check_matches_module(checkpoint, run.module, path)
    restore_module(run, checkpoint, path)
    if run.fn.value == "fit":
        restore_training_state(run, checkpoint, path)


def restore_module(run: Run, checkpoint: dict[str, Any], path: str) -> None:
    """Load the weights (after ``on_load_checkpoint`` lets the Module adapt the dict)."""
    module = run.module
    module.on_load_checkpoint(checkpoint)
    try:
        run.strategy.load_model_state_dict(checkpoint, strict=getattr(module, "strict_loading", True))
    except RuntimeError as error:
        first = str(error).splitlines()[0]
        msg = f"Loading the weights of {path!r} into {type(module).__qualname__} failed: {first}. Pass a checkpoint of this model."
        raise CheckpointError(msg) from error


def restore_training_state(run: Run, checkpoint: dict[str, Any], path: str) -> None:
    """Restore callbacks, precision, optimizers, schedulers, metrics and the loop position."""
    trainer, module, strategy = run.trainer, run.module, run.strategy
    states = checkpoint.get("callbacks", {})
    for callback in trainer.callbacks:
        if callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])
        callback.on_load_checkpoint(trainer, module, checkpoint)
    strategy.precision_plugin.load_state_dict(checkpoint.get("precision_plugin", {}))
    if strategy.restore_optimizer:
        strategy.load_optimizer_state_dict(checkpoint)
        schedulers = checkpoint.get("lr_schedulers", [])
        configs = strategy.lr_scheduler_configs
        check_scheduler_count(len(schedulers), len(configs), source=path)
        for config, state in zip(configs, schedulers):
            config.scheduler.load_state_dict(state)
    grads = checkpoint.get("accumulated_grads")
    if grads:
        for name, param in module.named_parameters():
            if name in grads:
                param.grad = grads[name].to(device=param.device, dtype=param.dtype)
    loop_state = checkpoint["loops"]["fit"]
    saved_world = checkpoint.get("world_size", trainer.world_size)
    # With a recorded data position the fit loop regroups the rest of the epoch over the new ranks
    # (and warns itself where it cannot); a checkpoint without one (a single process wrote it, or
    # an earlier version) can only skip batches of the new shard. An "epoch_end" checkpoint has
    # consumed its whole epoch: nothing to re-shard.
    if (
        saved_world != trainer.world_size
        and "data_position" not in loop_state
        and loop_state.get("batches_done", 0) > 0
        and loop_state.get("phase") != "epoch_end"
    ):
        warnings.warn(
            f"{path!r} was saved mid-epoch with world_size={saved_world}, now {trainer.world_size}, without the "
            f"epoch's data position: each rank skips {loop_state['batches_done']} batches of its new shard, so the "
            "rest of this epoch sees different data than the original run would have.",
            stacklevel=2,
        )
    datamodule = run.datamodule
    if datamodule is not None and type(datamodule).__qualname__ in checkpoint:
        datamodule.load_state_dict(checkpoint[type(datamodule).__qualname__])
    run.fit_loop.load_state_dict(loop_state, checkpoint.get("rng_states"))
    max_epochs = run.config.max_epochs
    if max_epochs not in (None, -1) and run.fit_loop.epoch > max_epochs:
        msg = (
            f"You restored a checkpoint with current_epoch={run.fit_loop.epoch}, but you have set "
            f"Trainer(max_epochs={max_epochs}): {path!r} is already past the end of this fit. Raise max_epochs "
            "to train on, or drop ckpt_path to start anew."
        )
        raise MisconfigurationError(msg)
    run.metrics.load_state_dict(checkpoint.get("metrics", {}), strategy.root_device)
