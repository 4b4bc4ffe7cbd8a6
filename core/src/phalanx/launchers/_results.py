"""Bring a spawn/fork worker's results back to the main process.

The main process of ``ddp_spawn`` / ``ddp_fork`` does not train; its Module, Trainer and callbacks
are untouched copies. Local rank 0 therefore writes what the user will look at after ``fit`` (the
weights, ``callback_metrics``, the checkpoint callbacks' best/last paths, the stage's return value)
to a file, and the main process loads it into its own objects. A file instead of a queue: a pipe
fills up with a large state dict and deadlocks a worker that waits for a reader which waits for it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["CHECKPOINT_ATTRIBUTES", "collect", "load", "recover_in_main_process", "save"]

#: Attributes of checkpoint callbacks (duck-typed: any callback having them) copied back.
CHECKPOINT_ATTRIBUTES = (
    "best_model_path",
    "last_model_path",
    "best_model_score",
    "best_k_models",
    "kth_best_model_path",
)


def _module_of(strategy: Any, trainer: Any) -> Any:
    for owner, name in ((strategy, "module"), (strategy, "lightning_module"), (trainer, "lightning_module")):
        module = getattr(owner, name, None) if owner is not None else None
        if module is not None:
            return module
    return None


def _to_cpu(data: Any) -> Any:
    import torch

    from phalanx.utilities.apply_func import apply_to_collection

    return apply_to_collection(data, torch.Tensor, lambda t: t.detach().cpu())


def collect(strategy: Any, trainer: Any, result: Any) -> dict[str, Any]:
    """Gather local rank 0's results (every rank calls this; only rank 0's is saved)."""
    module = _module_of(strategy, trainer)
    payload: dict[str, Any] = {"result": _to_cpu(result)}
    if module is not None:
        payload["state_dict"] = _to_cpu(module.state_dict())
    if trainer is not None:
        metrics = getattr(trainer, "callback_metrics", None)
        if metrics is not None:
            payload["callback_metrics"] = _to_cpu(dict(metrics))
        # trainer.global_step / current_epoch after fit, as with ddp
        payload["loop"] = {"epoch": trainer.current_epoch, "global_step": trainer.global_step}
        callbacks = getattr(trainer, "callbacks", None) or []
        payload["callbacks"] = {
            index: {name: _to_cpu(getattr(cb, name)) for name in CHECKPOINT_ATTRIBUTES if hasattr(cb, name)}
            for index, cb in enumerate(callbacks)
            if any(hasattr(cb, name) for name in CHECKPOINT_ATTRIBUTES)
        }
    return payload


def save(payload: dict[str, Any], path: str) -> None:
    """Write atomically (temp file + rename): the main process never reads half a file."""
    import torch

    tmp = f"{path}.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load(path: str) -> dict[str, Any] | None:
    """Read rank 0's payload, or None when the stage produced none (no rank 0 on this node)."""
    import torch

    if not os.path.exists(path):
        return None
    # The file was written a moment ago by our own worker, and holds arbitrary return values.
    return torch.load(path, map_location="cpu", weights_only=False)  # type: ignore[no-any-return]


def recover_in_main_process(payload: dict[str, Any], strategy: Any, trainer: Any) -> Any:
    """Load the payload into the main process's Module, Trainer and callbacks; return the result."""
    module = _module_of(strategy, trainer)
    if module is not None and strategy is not None and strategy.module is None:
        # The stage connected the workers' copies only; connect this process's Module too, so that
        # trainer.save_checkpoint() & co. work here after fit, as they do after strategy="ddp".
        strategy.connect(module)
    state = payload.get("state_dict")
    if module is not None and state is not None:
        try:
            module.load_state_dict(state)
        except RuntimeError as err:
            warnings.warn(
                f"The weights trained in the worker processes do not fit the Module of the main process "
                f"({err}); it keeps its old weights. This happens when configure_model creates layers only "
                "in the workers. Use strategy='ddp' to train in this process, or save a checkpoint.",
                stacklevel=3,
            )
    loop = payload.get("loop") or {}
    if trainer is not None:
        trainer.receive_worker_results(
            callback_metrics=payload.get("callback_metrics"), epoch=loop.get("epoch"), global_step=loop.get("global_step")
        )
    callbacks = getattr(trainer, "callbacks", None) or []
    for index, values in payload.get("callbacks", {}).items():
        if index < len(callbacks):
            for name, value in values.items():
                setattr(callbacks[index], name, value)
    return payload.get("result")
