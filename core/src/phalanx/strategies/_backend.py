"""Process-group backend choice and validation, and process-group lifetime, for ParallelStrategy.

An unknown backend name would otherwise surface as an obscure error from inside
``init_process_group`` after every rank has started; checking at construction fails fast and says
which names exist.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from phalanx.errors import MisconfigurationError, closest_match

__all__ = ["default_backend", "destroy_process_group_at_exit", "validate_backend", "validate_backend_for_device"]

_exit_hook_registered = False


def _known_backends() -> list[str]:
    names = [str(name).lower() for name in getattr(dist.Backend, "backend_list", [])]
    return [name for name in names if name != "undefined"] or ["gloo", "nccl", "mpi"]


def default_backend(device: torch.device) -> str:
    """nccl for CUDA devices (fastest GPU collectives), gloo for everything else."""
    return "nccl" if device.type == "cuda" else "gloo"


def validate_backend(backend: str | None) -> str | None:
    """Return ``backend`` lower-cased, or raise naming the valid choices and the closest one.

    Accepts torch's per-device form too (``"cpu:gloo,cuda:nccl"``).
    """
    if backend is None:
        return None
    if not isinstance(backend, str) or not backend.strip():
        msg = f"process_group_backend={backend!r} must be a backend name such as 'gloo' or 'nccl'."
        raise MisconfigurationError(msg)
    known = _known_backends()
    value = backend.strip().lower()
    parts = [part.split(":", 1)[-1] for part in value.split(",")]
    for part in parts:
        if part not in known:
            close = closest_match(part, known)
            hint = f" Did you mean {close!r}?" if close else ""
            msg = (
                f"process_group_backend={backend!r}: {part!r} is not a torch.distributed backend; valid "
                f"choices: {', '.join(known)}.{hint} Fix: pass one of them, or leave it unset "
                "(gloo on CPU, nccl on CUDA)."
            )
            raise MisconfigurationError(msg)
    return value


def validate_backend_for_device(backend: str, device: torch.device) -> None:
    """Refuse nccl for CPU processes, or a backend this build of torch lacks, before rendezvous."""
    if backend == "nccl" and device.type != "cuda":
        msg = (
            f"process_group_backend='nccl' needs CUDA devices, but this process runs on {str(device)!r}. "
            "Fix: use process_group_backend='gloo' for CPU training, or accelerator='cuda'."
        )
        raise MisconfigurationError(msg)
    available = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    for part in (p.split(":", 1)[-1] for p in backend.split(",")):
        if available.get(part) is False:
            usable = [name for name, ok in available.items() if ok]
            msg = (
                f"process_group_backend={part!r} is not available in this build of torch "
                f"({torch.__version__}); available: {', '.join(usable) or 'none'}. Fix: pick one of those "
                "or install a torch build with it."
            )
            raise MisconfigurationError(msg)


def _destroy_at_exit() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_process_group_at_exit() -> None:
    """Destroy the default process group when the interpreter exits instead of now (idempotent).

    A sharded module's parameters are DTensors bound to the group; destroying it at the end of a
    run would leave the user's model unusable (no forward, no checkpoint, no ``trainer.test``).
    """
    global _exit_hook_registered
    if not _exit_hook_registered:
        import atexit

        atexit.register(_destroy_at_exit)
        _exit_hook_registered = True
