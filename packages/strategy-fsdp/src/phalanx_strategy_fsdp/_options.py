"""Validation of FSDPStrategy's plain options, at construction, with messages that say the fix.

A bad value here would otherwise surface after every rank has started and joined the process
group, as a hang or an error from inside ``fully_shard``; checking up front fails in the user's
process, before anything is launched.
"""

from __future__ import annotations

from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = ["STATE_DICT_TYPES", "mesh_shape", "validate_device_mesh", "validate_options"]

STATE_DICT_TYPES = ("sharded", "full")
_MESH_ACCEPTED = (
    "None (shard over all ranks), 'hybrid' (replicate across nodes, shard within a node), or a pair "
    "(replicate, shard) of positive ints whose product is the world size, e.g. (2, 4) for 8 ranks"
)


def validate_device_mesh(device_mesh: Any) -> str | tuple[int, int] | None:
    """Normalise ``device_mesh`` (the size check needs the world size and happens at setup).

    Raises:
        MisconfigurationError: Not one of the accepted forms.
    """
    if device_mesh is None or device_mesh == "hybrid":
        return device_mesh  # type: ignore[no-any-return]
    if (
        isinstance(device_mesh, (tuple, list))
        and len(device_mesh) == 2
        and all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in device_mesh)
    ):
        return (int(device_mesh[0]), int(device_mesh[1]))
    msg = f"FSDPStrategy(device_mesh={device_mesh!r}) is not a mesh; accepted: {_MESH_ACCEPTED}."
    raise MisconfigurationError(msg)


def mesh_shape(device_mesh: str | tuple[int, int] | None, *, world_size: int, num_nodes: int) -> tuple[int, ...]:
    """The device-mesh shape for this job: 1-D ``(world,)`` or 2-D ``(replicate, shard)``.

    Raises:
        MisconfigurationError: A 2-D shape whose product is not the world size.
    """
    if device_mesh is None:
        return (world_size,)
    if device_mesh == "hybrid":
        nodes = max(1, num_nodes)
        if world_size % nodes:
            msg = (
                f"device_mesh='hybrid' replicates across num_nodes={nodes}, but the world size {world_size} is not a "
                "multiple of it. Fix: run the same number of devices on every node, or pass device_mesh=(r, s)."
            )
            raise MisconfigurationError(msg)
        return (nodes, world_size // nodes)
    assert isinstance(device_mesh, tuple)
    replicate, shard = device_mesh
    if replicate * shard != world_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        choices = ", ".join(f"({d}, {world_size // d})" for d in divisors)
        msg = (
            f"FSDPStrategy(device_mesh={device_mesh!r}) has {replicate * shard} positions but the job has "
            f"world size {world_size}. Fix: pick one of {choices} (replicate, shard)."
        )
        raise MisconfigurationError(msg)
    return (replicate, shard)


def validate_options(*, state_dict_type: Any, reshard_after_forward: Any, cpu_offload: Any) -> None:
    """Check the scalar options.

    Raises:
        MisconfigurationError: Naming the first bad value and the valid choices.
    """
    if state_dict_type not in STATE_DICT_TYPES:
        msg = (
            f"FSDPStrategy(state_dict_type={state_dict_type!r}) is not supported; choose one of {list(STATE_DICT_TYPES)}: "
            "'sharded' (every rank writes its shard to a directory; resumable on any number of ranks) or 'full' "
            "(rank 0 writes one file that every strategy can load)."
        )
        raise MisconfigurationError(msg)
    valid_reshard = isinstance(reshard_after_forward, bool) or (
        isinstance(reshard_after_forward, int) and reshard_after_forward >= 1
    )
    if not valid_reshard:
        msg = (
            f"FSDPStrategy(reshard_after_forward={reshard_after_forward!r}) must be True (free parameters after "
            "forward), False (keep them until backward) or a positive int (reshard to that many ranks)."
        )
        raise MisconfigurationError(msg)
    if not isinstance(cpu_offload, bool):
        msg = f"FSDPStrategy(cpu_offload={cpu_offload!r}) must be True or False (or use strategy='fsdp_cpu_offload')."
        raise MisconfigurationError(msg)

