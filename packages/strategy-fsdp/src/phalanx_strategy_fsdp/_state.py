"""Optimizer-state plumbing of full checkpoints: names versus positions.

torch's own ``optimizer.state_dict()`` keys each parameter by its position, which is meaningless
once parameters are sharded differently, so FSDP checkpoints key it by parameter name (FQN); full
files are translated back to positions so that a ``single_device`` or ``ddp`` run can load them
unchanged. (Whether a checkpoint fits the model is checked by the core's
:func:`phalanx.checkpoint_io.dcp.check_model_matches`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from phalanx.errors import CheckpointError

__all__ = ["full_to_plain", "optimizer_fqns", "to_fqn_keys", "to_index_keys"]


def full_to_plain(obj: Any) -> Any:
    """Replace DTensors (which a one-rank mesh may hand back) by plain CPU tensors, recursively."""
    if isinstance(obj, DTensor):
        return obj.full_tensor().cpu()
    if isinstance(obj, Mapping):
        return {key: full_to_plain(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [full_to_plain(value) for value in obj]
    return obj


def optimizer_fqns(model: nn.Module, optimizer: Optimizer) -> list[str]:
    """Parameter names in the order torch numbers an optimizer's parameters (across its groups).

    Raises:
        CheckpointError: The optimizer holds a parameter that is not part of the model.
    """
    names = {id(param): name for name, param in model.named_parameters(remove_duplicate=False)}
    fqns = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in names:
                msg = (
                    f"{type(optimizer).__name__} optimizes a parameter of shape {tuple(param.shape)} that is not part "
                    "of the model, so its state cannot be named in a checkpoint. Fix: build the optimizer from "
                    "self.parameters() (or named submodules) in configure_optimizers."
                )
                raise CheckpointError(msg)
            fqns.append(names[id(param)])
    return fqns


def to_index_keys(state: dict[str, Any], fqns: list[str]) -> dict[str, Any]:
    """Name-keyed optimizer state -> torch's position-keyed form (what ``Optimizer.load_state_dict`` reads)."""
    index = {fqn: position for position, fqn in enumerate(fqns)}
    groups = [{**group, "params": [index[p] for p in group["params"]]} for group in state["param_groups"]]
    return {"state": {index[fqn]: value for fqn, value in state["state"].items()}, "param_groups": groups}


def to_fqn_keys(state: Mapping[str, Any], fqns: list[str]) -> dict[str, Any]:
    """Position-keyed optimizer state (from any phalanx/torch checkpoint) -> the name-keyed form.

    Raises:
        CheckpointError: The state numbers more parameters than the optimizer has.
    """
    groups = state.get("param_groups", [])
    if all(isinstance(p, str) for group in groups for p in group["params"]):
        return dict(state)
    count = sum(len(group["params"]) for group in groups)
    if count != len(fqns):
        msg = (
            f"The checkpoint's optimizer state covers {count} parameters but this optimizer has {len(fqns)}; it "
            "belongs to another model or optimizer setup. Fix: resume with the configure_optimizers the "
            "checkpoint was trained with, or load the weights only."
        )
        raise CheckpointError(msg)
    order = [p for group in groups for p in group["params"]]
    name_of = {saved: fqns[position] for position, saved in enumerate(order)}
    return {
        "state": {name_of[key]: value for key, value in state.get("state", {}).items()},
        "param_groups": [{**group, "params": [name_of[p] for p in group["params"]]} for group in groups],
    }
