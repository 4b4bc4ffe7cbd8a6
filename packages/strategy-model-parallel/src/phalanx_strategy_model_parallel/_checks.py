"""Checks of the Module against the mesh, run in setup so a mistake fails before any step.

A tensor-parallel plan that shards a dimension the tensor-parallel size does not divide would run
with uneven shards (DTensor allows them) and silently unbalance compute and memory, and a Module
without ``configure_model`` would train unparallelized; both are refused with the fix. Under
context parallel a parameter whose gradient is not reduced over the context-parallel ranks would
train on a part of each sequence only, so it is refused too.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor, Shard

from phalanx.errors import MisconfigurationError

__all__ = ["check_configure_model", "check_context_parallel_sharding", "check_tensor_parallel_divisibility"]


def check_configure_model(module: nn.Module, *, tensor_parallel_size: int) -> bool:
    """Whether the Module defines ``configure_model``; refuse one that does not when tp > 1.

    On a pure data-parallel mesh a Module without ``configure_model`` is still served (the
    strategy shards it with ``fully_shard``, as FSDP would); with tensor parallel it would silently
    train unsplit, so it is refused.

    Raises:
        MisconfigurationError: Naming the class and what to write.
    """
    from phalanx import Module

    defined = getattr(type(module), "configure_model", None) is not getattr(Module, "configure_model", None)
    if not defined and tensor_parallel_size > 1:
        msg = (
            f"ModelParallelStrategy(tensor_parallel_size={tensor_parallel_size}) needs {type(module).__qualname__}.configure_model(): that is where the model is "
            "parallelized over self.device_mesh (tensor-parallel plans with parallelize_module, then fully_shard over "
            "self.device_mesh['data_parallel']). Fix: define configure_model (see docs/model-parallel.md), or use "
            "tensor_parallel_size=1 for a model that needs no tensor parallelism."
        )
        raise MisconfigurationError(msg)
    return defined


def check_tensor_parallel_divisibility(module: nn.Module, tensor_parallel_size: int) -> None:
    """Every dimension sharded over ``tensor_parallel`` must divide evenly by its size.

    Raises:
        MisconfigurationError: Naming the parameter, its shape, the sharded dimension and the size.
    """
    bad: list[str] = []
    for name, param in module.named_parameters():
        if not isinstance(param, DTensor):
            continue
        names = param.device_mesh.mesh_dim_names or ()
        for mesh_dim, placement in enumerate(param.placements):
            if mesh_dim < len(names) and names[mesh_dim] == "tensor_parallel" and isinstance(placement, Shard):
                size = param.device_mesh.size(mesh_dim)
                if param.shape[placement.dim] % size:
                    bad.append(f"{name} {tuple(param.shape)} dim {placement.dim}")
    if bad:
        msg = (
            f"tensor_parallel_size={tensor_parallel_size} does not divide the sharded dimension of {bad[:4]}"
            f"{' ...' if len(bad) > 4 else ''}. Fix: choose a tensor_parallel_size that divides these sizes (or "
            "change the hidden size), or leave these layers out of the tensor-parallel plan."
        )
        raise MisconfigurationError(msg)


def check_context_parallel_sharding(module: nn.Module, context_parallel_size: int) -> None:
    """Every parameter must be sharded (FSDP) over a mesh that includes the context-parallel ranks.

    Context-parallel ranks see different tokens of the same samples; only ``fully_shard`` over the
    strategy's ``fsdp_mesh`` (data x context parallel) averages their gradients. A parameter on
    ``device_mesh["data_parallel"]``, or not sharded at all, would silently diverge per cp rank.

    Raises:
        MisconfigurationError: Naming the parameters and the mesh to use.
    """
    bad: list[str] = []
    for name, param in module.named_parameters():
        names = (param.device_mesh.mesh_dim_names or ()) if isinstance(param, DTensor) else ()
        if not any("context_parallel" in str(dim) for dim in names):
            bad.append(f"{name} (mesh {tuple(names) or 'none'})")
    if bad:
        msg = (
            f"context_parallel_size={context_parallel_size}: the gradients of {bad[:4]}{' ...' if len(bad) > 4 else ''} "
            "would not be averaged over the context-parallel ranks (they see other tokens of the same samples). "
            "Fix: in configure_model, fully_shard over self.trainer.strategy.fsdp_mesh (data x context parallel) "
            "instead of self.device_mesh['data_parallel'], or do not define configure_model and let the strategy shard."
        )
        raise MisconfigurationError(msg)
