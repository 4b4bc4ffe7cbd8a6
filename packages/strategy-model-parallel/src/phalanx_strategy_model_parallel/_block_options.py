"""Per-block options of ModelParallelStrategy: activation checkpointing and regional compile.

The Module parallelizes itself in ``configure_model`` (tensor parallel plans, ``fully_shard`` per
block), so the strategy applies these afterwards, on the materialised blocks: the block's
``forward`` is replaced on the instance, which runs inside the hooks FSDP2 and tensor parallelism
put on the block's ``__call__``. Checkpointing goes first and compile wraps the checkpointed
forward (torchtitan's order), so the compiled graph contains the recomputation policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx.utilities.activation_checkpointing import (
    ActivationCheckpointing,
    apply_activation_checkpointing,
    resolve_activation_checkpointing,
    resolve_blocks,
)
from phalanx.utilities.compile import compile_modules

__all__ = ["BlockOptions", "apply_block_options", "resolve_block_options"]


@dataclass(frozen=True)
class BlockOptions:
    """What to do to each block, resolved at construction.

    Attributes:
        activation_checkpointing: Blocks to recompute in backward (full or selective), or None.
        compile_blocks: Blocks whose ``forward`` is compiled on its own, or None.
        compile_kwargs: Options for that ``torch.compile``.
    """

    activation_checkpointing: ActivationCheckpointing | None = None
    compile_blocks: Callable[[nn.Module], bool] | None = None
    compile_kwargs: dict[str, Any] = field(default_factory=dict)


def resolve_block_options(
    *, activation_checkpointing_policy: Any = None, compile_policy: Any = None, compile_kwargs: Any = None
) -> BlockOptions:
    """Check the per-block options of ``ModelParallelStrategy(...)``; fails in the user's process.

    Raises:
        MisconfigurationError: A policy in none of the accepted forms, or ``compile_kwargs`` not a dict.
    """
    if compile_kwargs is not None and not isinstance(compile_kwargs, dict):
        msg = (
            f"ModelParallelStrategy(compile_kwargs={compile_kwargs!r}) must be a dict of torch.compile options, "
            "e.g. {'mode': 'max-autotune'}, or None."
        )
        raise MisconfigurationError(msg)
    return BlockOptions(
        activation_checkpointing=resolve_activation_checkpointing(
            activation_checkpointing_policy, owner="ModelParallelStrategy"
        ),
        compile_blocks=resolve_blocks(
            compile_policy, option=f"ModelParallelStrategy(compile_policy={compile_policy!r})"
        ),
        compile_kwargs=dict(compile_kwargs or {}),
    )


def apply_block_options(options: BlockOptions, module: nn.Module, *, is_global_zero: bool) -> None:
    """Checkpoint, then compile, the chosen blocks of ``module`` (after it is parallelized).

    Raises:
        MisconfigurationError: A policy matches no submodule of ``module``.
    """
    apply_activation_checkpointing(module, options.activation_checkpointing, owner="ModelParallelStrategy")
    chosen = options.compile_blocks
    if chosen is None:
        return
    blocks = [m for name, m in module.named_modules() if name and chosen(m)]
    if not blocks:
        have = sorted({type(m).__name__ for m in module.modules()})
        msg = (
            f"ModelParallelStrategy(compile_policy=...) matches no submodule of {type(module).__name__}; its module "
            f"classes are {have}. Fix: name classes from that list."
        )
        raise MisconfigurationError(msg)
    compile_modules(blocks, strategy_name="model_parallel", is_global_zero=is_global_zero, **options.compile_kwargs)
