"""Import deepspeed with the right accelerator, and keep its global state in step with ours.

DeepSpeed picks its accelerator (cuda, cpu, ...) once, the first time anything asks for it, and
caches it process-wide; the choice decides which ops, dtypes and communication backend it uses.
The strategy therefore decides first and imports deepspeed only afterwards: with the cpu
accelerator it sets ``DS_ACCELERATOR=cpu`` (inherited by re-launched ranks) and, if deepspeed was
already imported with another accelerator, installs the CPU one explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = ["DS_ACCELERATORS", "communication_backend", "import_deepspeed", "reset_comm_backend", "skip_shm_comm_build"]

#: DeepSpeed's shared-memory all-reduce op for CPU (``ShareMemCommBuilder``).
_SHM_OP = "deepspeed_shm_comm"

#: phalanx accelerator name -> DeepSpeed accelerator name.
DS_ACCELERATORS = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}


def import_deepspeed(accelerator: str | None = None) -> ModuleType:
    """Import deepspeed after making it use ``accelerator`` ("cpu" / "cuda"); None keeps its choice.

    Raises:
        MisconfigurationError: An accelerator DeepSpeed has no support for in phalanx.
        ImportError: deepspeed is not installed (the message says how to install it).
    """
    wanted = None
    if accelerator is not None:
        if accelerator not in DS_ACCELERATORS:
            msg = (
                f"DeepSpeedStrategy cannot run on accelerator {accelerator!r}; valid accelerators are "
                f"{sorted(DS_ACCELERATORS)}. Fix: Trainer(accelerator='cpu') or accelerator='cuda'."
            )
            raise MisconfigurationError(msg)
        wanted = DS_ACCELERATORS[accelerator]
        current = os.environ.get("DS_ACCELERATOR")
        if current is not None and current != wanted:
            msg = (
                f"DS_ACCELERATOR={current!r} is set in the environment, but the Trainer runs on {accelerator!r}, "
                f"which needs DeepSpeed's {wanted!r} accelerator. Fix: unset DS_ACCELERATOR or set it to {wanted!r}."
            )
            raise MisconfigurationError(msg)
        os.environ["DS_ACCELERATOR"] = wanted
    try:
        import deepspeed
    except ImportError as error:
        msg = (
            f"DeepSpeedStrategy needs the deepspeed package ({error}). Install it after torch, without build "
            "isolation: pip install ninja && pip install --no-build-isolation 'deepspeed>=0.14'"
        )
        raise ImportError(msg) from error
    if wanted is not None:
        _ensure_accelerator(wanted)
    return deepspeed


def _ensure_accelerator(wanted: str) -> None:
    """Install DeepSpeed's ``wanted`` accelerator if it already chose another one."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    active = get_accelerator()
    if active.device_name() == wanted:
        return
    if wanted == "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        set_accelerator(CPU_Accelerator())
    else:
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

        set_accelerator(CUDA_Accelerator())


def communication_backend(requested: str | None) -> str:
    """The process-group backend: the one requested, else DeepSpeed's choice (ccl when installed, else gloo on CPU)."""
    if requested:
        return requested
    from deepspeed.accelerator import get_accelerator

    return str(get_accelerator().communication_backend_name())


def reset_comm_backend() -> None:
    """Forget deepspeed.comm's handle on the process group we are about to destroy.

    Without this, a second Trainer run in the same process would find DeepSpeed convinced that its
    (destroyed) backend is still the one to use.
    """
    try:
        from deepspeed import comm
        from deepspeed.comm import comm as comm_impl
    except ImportError:  # pragma: no cover - deepspeed not importable: nothing to reset
        return
    module: Any = comm_impl
    module.cdb = None
    if hasattr(comm, "cdb"):
        comm.cdb = None
    _reset_group_cache()


def _reset_group_cache() -> None:
    """Drop the process groups ``deepspeed.utils.groups`` cached (world, data parallel, expert...).

    They refer to the destroyed default group; the next engine would otherwise ask torch for ranks
    in a group it no longer knows ("Group ... is not registered").
    """
    import torch.distributed as dist

    try:
        from deepspeed.utils import groups
    except ImportError:  # pragma: no cover
        return
    for name, value in list(vars(groups).items()):
        if isinstance(value, dist.ProcessGroup):
            setattr(groups, name, None)
        elif isinstance(value, dict) and name.startswith("_") and name.endswith(("GROUP", "GROUP_RANKS")):
            value.clear()
    for name in ("mpu", "mesh_device", "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK"):
        if hasattr(groups, name):
            setattr(groups, name, None)


@contextmanager
def skip_shm_comm_build(skip: bool) -> Generator[None, None, None]:
    """While DeepSpeed creates its communication backend, mark the CPU shm op as unusable.

    On the CPU accelerator DeepSpeed's TorchBackend JIT-compiles a shared-memory all-reduce op
    (ninja + g++) the first time a process group is set up. Only DeepSpeed's inference kernels
    call it (``inference_all_reduce``); ZeRO training never does. The build takes minutes on a
    small machine, and a build that is interrupted leaves a lock file on which every later run
    waits forever. DeepSpeed's own compatibility table is the switch it consults before building,
    so the op is marked incompatible for the duration of the call and restored afterwards.
    """
    if not skip:
        yield
        return
    import deepspeed.ops

    table: dict[str, bool] = deepspeed.ops.__compatible_ops__
    previous = table.get(_SHM_OP)
    table[_SHM_OP] = False
    try:
        yield
    finally:
        if previous is None:
            table.pop(_SHM_OP, None)
        else:
            table[_SHM_OP] = previous
