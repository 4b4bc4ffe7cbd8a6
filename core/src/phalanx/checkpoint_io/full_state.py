"""Full checkpoints of a sharded model: gathered into one ordinary file, distributed back into shards.

Part of the plugin-author API. A strategy whose parameters are DTensor shards (``fsdp``,
``model_parallel``, a vendor's) writes a *full* checkpoint as one file of plain CPU tensors that
any strategy can read, and loads such a file (its own, or one written by ``ddp`` /
``single_device``) into whatever shards this run has. The steps are the same whoever shards the
model, so they live here once:

- :func:`gather_model` / :func:`gather_optimizer`: every tensor at full size on CPU (collective);
- :func:`save_full`: rank 0 writes the file, optionally after collecting pipeline stages that
  other ranks hold;
- :func:`load_full_model` / :func:`load_full_optimizers`: check the file against the model, then
  distribute each full tensor into this rank's shards (collective).

Optimizer state is keyed by parameter *name* while it moves between layouts (positions mean
nothing once parameters are sharded differently); :func:`to_index_keys` turns it back into torch's
position-keyed form where a file should load in a plain ``Optimizer.load_state_dict``.
(A *sharded* checkpoint, one shard file per rank, is :mod:`phalanx.checkpoint_io.dcp`.)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from phalanx.checkpoint_io._dcp_format import MODEL_KEY, OPTIMIZER_KEY
from phalanx.checkpoint_io._dcp_state import check_model_matches, load_optimizer_hyperparameters
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.checkpoint_io.checks import check_optimizer_count, shapes
from phalanx.errors import CheckpointError

__all__ = [
    "FULL",
    "gather_model",
    "gather_optimizer",
    "load_full_model",
    "load_full_optimizers",
    "optimizer_fqns",
    "save_full",
    "to_fqn_keys",
    "to_index_keys",
    "to_plain",
]

#: Full (unsharded) state dicts, gathered to rank 0's CPU one tensor at a time (the other ranks
#: receive empty dicts: torch keeps them from holding a copy each).
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
#: Full state dicts on every rank (for collecting pipeline stages from the ranks that hold them).
_FULL_EVERYWHERE = StateDictOptions(full_state_dict=True)
#: Trainer entries a full file does not store: mid-accumulation gradients live in the strategy's
#: own buffers, not in ``param.grad``, so the Trainer's copy would be wrong.
_DROPPED = ("accumulated_grads",)


def to_plain(obj: Any) -> Any:
    """Replace every tensor of a (nested) state by a plain, detached CPU tensor; a DTensor (which a
    one-rank mesh may hand back) by its full value."""
    if isinstance(obj, DTensor):
        return obj.full_tensor().cpu()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, Mapping):
        return {key: to_plain(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [to_plain(value) for value in obj]
    return obj


def gather_model(model: nn.Module, *, every_rank: bool = False) -> dict[str, Any]:
    """The model's full state by name, plain CPU tensors, on rank 0 (on every rank with
    ``every_rank``; the others get ``{}``). Collective over the model's meshes."""
    options = _FULL_EVERYWHERE if every_rank else FULL
    return to_plain(get_model_state_dict(model, options=options))  # type: ignore[no-any-return]


def gather_optimizer(model: nn.Module, optimizer: Optimizer, *, every_rank: bool = False) -> dict[str, Any]:
    """One optimizer's full state keyed by parameter name, plain CPU tensors, as :func:`gather_model`."""
    options = _FULL_EVERYWHERE if every_rank else FULL
    return to_plain(get_optimizer_state_dict(model, optimizer, options=options))  # type: ignore[no-any-return]


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


def to_index_keys(state: Mapping[str, Any], fqns: list[str]) -> dict[str, Any]:
    """Name-keyed optimizer state -> torch's position-keyed form (what ``Optimizer.load_state_dict`` reads)."""
    index = {fqn: position for position, fqn in enumerate(fqns)}
    groups = [{**group, "params": [index[p] for p in group["params"]]} for group in state["param_groups"]]
    return {"state": {index[fqn]: value for fqn, value in state["state"].items()}, "param_groups": groups}


def _keyed_by_name(state: Mapping[str, Any]) -> bool:
    return all(isinstance(p, str) for group in state.get("param_groups", []) for p in group["params"])


def to_fqn_keys(state: Mapping[str, Any], fqns: list[str]) -> dict[str, Any]:
    """Position-keyed optimizer state (from any phalanx or torch checkpoint) -> the name-keyed form.

    Raises:
        CheckpointError: The state numbers another count of parameters than the optimizer has.
    """
    if _keyed_by_name(state):
        return dict(state)
    groups = state.get("param_groups", [])
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


def _merge_optimizer(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One name-keyed optimizer state from the parts pipeline stages hold (each names its own parameters)."""
    merged: dict[str, Any] = {"state": {}, "param_groups": []}
    for part in parts:
        merged["state"].update(part.get("state", {}))
        for index, group in enumerate(part.get("param_groups", [])):
            if index == len(merged["param_groups"]):
                merged["param_groups"].append({**group, "params": list(group["params"])})
            else:
                known = merged["param_groups"][index]["params"]
                known.extend(p for p in group["params"] if p not in known)
    return merged


def save_full(
    checkpoint: dict[str, Any],
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    is_global_zero: bool,
    barrier: Callable[[], None],
    positional_optimizer_state: bool = True,
    stage_holder: bool | None = None,
) -> None:
    """Gather the full state and write it as one ordinary phalanx file from rank 0 (collective).

    Args:
        checkpoint: The Trainer's checkpoint dict; its model and optimizer entries are replaced by
            the gathered full states.
        positional_optimizer_state: Write optimizer state keyed by position, as torch's
            ``Optimizer.state_dict`` does, so ``ddp`` / ``single_device`` load the file unchanged.
            Needs every parameter on every rank; with pipeline stages pass False (keyed by name).
        stage_holder: Only where ranks hold different parts of the model (pipeline stages):
            whether this rank holds a part no lower rank already sends (its stage's first
            replica). The parts are collected on rank 0 before writing. None: every rank holds
            the whole model.
    """
    stages = stage_holder is not None
    model_state = gather_model(model, every_rank=stages)
    optimizer_states = [gather_optimizer(model, optimizer, every_rank=stages) for optimizer in optimizers]
    parts = [(model_state, optimizer_states)]
    if stages:
        payload = (model_state, optimizer_states) if stage_holder else None
        gathered: list[Any] = [None] * dist.get_world_size() if is_global_zero else []
        dist.gather_object(payload, gathered if is_global_zero else None, dst=0)
        parts = [part for part in gathered if part is not None]
    if is_global_zero:
        full = {key: value for key, value in checkpoint.items() if key not in _DROPPED}
        full[MODEL_KEY] = {name: value for state, _ in parts for name, value in state.items()}
        if optimizers:
            merged = [_merge_optimizer([states[i] for _, states in parts]) for i in range(len(optimizers))]
            if positional_optimizer_state:
                merged = [to_index_keys(state, optimizer_fqns(model, opt)) for state, opt in zip(merged, optimizers)]
            full[OPTIMIZER_KEY] = merged
        if os.path.isdir(os.fspath(path)):
            shutil.rmtree(os.fspath(path))
        checkpoint_io.save_checkpoint(full, path)
    barrier()


def load_full_model(
    model: nn.Module, state_dict: Mapping[str, Any], *, source: str, strict: bool = True, partial: bool = False
) -> None:
    """Check a full state dict (every rank holds it) against the model, then distribute it into this
    rank's shards (collective).

    Args:
        partial: This rank holds only part of the model (pipeline stages): it takes the entries it
            holds, and the others are expected.

    Raises:
        CheckpointError: The state dict belongs to another model (the message names what differs).
    """
    check_model_matches(model, shapes(state_dict), source=source, strict=strict, partial=partial)
    if partial:
        local = set(get_model_state_dict(model))
        state_dict = {name: value for name, value in state_dict.items() if name in local}
    options = StateDictOptions(full_state_dict=True, strict=strict and not partial)
    set_model_state_dict(model, dict(state_dict), options=options)


def load_full_optimizers(
    model: nn.Module,
    optimizers: list[Optimizer],
    states: list[Mapping[str, Any]],
    *,
    source: str,
    partial: bool = False,
) -> None:
    """Load full optimizer states, keyed by name or (from ``ddp`` / ``single_device`` files) by
    position, into this rank's sharded optimizers (collective).

    Args:
        partial: This rank holds only part of the model (pipeline stages): it takes the entries of
            its own parameters; position-keyed state cannot be placed then.

    Raises:
        CheckpointError: A different number of optimizers, of parameters, or position-keyed state
            for a rank that holds part of the model.
    """
    check_optimizer_count(len(states), len(optimizers), source=source)
    local = set(get_model_state_dict(model)) if partial else set()
    for optimizer, state in zip(optimizers, states):
        if not state.get("state"):
            load_optimizer_hyperparameters(optimizer, state)
            continue
        if partial and not _keyed_by_name(state):
            msg = (
                f"The optimizer state in {source!r} is keyed by position (written by another strategy), so it cannot "
                "be matched to the parameters of this rank's pipeline stage. Fix: load its weights only (fit "
                "without ckpt_path after loading state_dict), or resume from a checkpoint of this strategy."
            )
            raise CheckpointError(msg)
        named = to_fqn_keys(state, optimizer_fqns(model, optimizer))
        if partial:
            named = {
                "state": {name: value for name, value in named["state"].items() if name in local},
                "param_groups": [
                    {**group, "params": [p for p in group["params"] if p in local]} for group in named["param_groups"]
                ],
            }
        set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))
