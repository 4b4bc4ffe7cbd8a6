"""Out-of-memory errors and freeing memory (Lightning's ``lightning.pytorch.utilities.memory``).

The batch-size finder and user code that retries with smaller batches need to tell an
out-of-memory error from any other ``RuntimeError``; these predicates recognise the messages CUDA,
cuDNN and the CPU allocator raise (and torch's ``OutOfMemoryError``, which is a ``RuntimeError``
carrying the CUDA message).
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from phalanx.utilities.apply_func import apply_to_collection

__all__ = [
    "garbage_collection_cuda",
    "is_cuda_out_of_memory",
    "is_cudnn_snafu",
    "is_oom_error",
    "is_out_of_cpu_memory",
    "recursive_detach",
]


def _single_message(exception: BaseException) -> str | None:
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return exception.args[0]
    return None


def recursive_detach(in_dict: Any, to_cpu: bool = False) -> Any:
    """``in_dict`` with every tensor in it (at any depth) detached, and moved to the CPU when ``to_cpu``."""

    def detach(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        return tensor.cpu() if to_cpu else tensor

    return apply_to_collection(in_dict, torch.Tensor, detach)


def is_cuda_out_of_memory(exception: BaseException) -> bool:
    """A CUDA allocation failed."""
    message = _single_message(exception)
    return message is not None and "CUDA" in message and "out of memory" in message


def is_cudnn_snafu(exception: BaseException) -> bool:
    """cuDNN refused a configuration, which in practice means it ran out of workspace memory."""
    message = _single_message(exception)
    return message is not None and "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED." in message


def is_out_of_cpu_memory(exception: BaseException) -> bool:
    """The CPU allocator could not allocate."""
    message = _single_message(exception)
    return message is not None and "DefaultCPUAllocator: can't allocate memory" in message


def is_oom_error(exception: BaseException) -> bool:
    """Any of the three out-of-memory errors above."""
    return is_cuda_out_of_memory(exception) or is_cudnn_snafu(exception) or is_out_of_cpu_memory(exception)


def garbage_collection_cuda() -> None:
    """Collect garbage and return cached CUDA memory to the driver (nothing to return without CUDA).

    Raises:
        RuntimeError: ``empty_cache`` failed for a reason other than running out of memory.
    """
    gc.collect()
    try:
        torch.cuda.empty_cache()
    except RuntimeError as exception:
        if not is_oom_error(exception):
            raise
