"""Activation checkpointing, one option for every sharding strategy: full per block, or selective.

Activations dominate training memory for long sequences. Recomputing a block's forward during its
backward frees what the block kept for backward; *full* checkpointing keeps only each block's
input, *selective* (torchtitan's op-level policy) also keeps the outputs of the matrix
multiplications, which are the expensive ops to recompute, and recomputes the cheap rest
(activations, norms, softmax). The recomputation runs the same kernels on the same inputs, so the
losses are bit-identical to training without it; only memory and time change.

Strategies take the option as ``activation_checkpointing_policy``: a block class, a set of them
or a predicate (full checkpointing, Lightning's forms; FSDP also takes torch's ``ModuleWrapPolicy``), or an
:class:`ActivationCheckpointing` naming the mode. The block's ``forward`` is replaced on the
instance, so parameter names (and checkpoints) stay those of the model without checkpointing, and
the strategy's own per-block hooks (FSDP2's all-gathers) stay outside the recomputed region.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from phalanx.errors import MisconfigurationError

__all__ = [
    "MODES",
    "ActivationCheckpointing",
    "apply_activation_checkpointing",
    "resolve_activation_checkpointing",
    "resolve_blocks",
    "selective_policy",
]

#: ``"full"``: recompute the whole block; ``"selective"``: keep matmul outputs, recompute the rest.
MODES = ("full", "selective")

_ACCEPTED = (
    "None, an nn.Module subclass, a set/list/tuple of them, a predicate "
    "module -> bool, or ActivationCheckpointing(blocks, mode='full'|'selective')"
)


@dataclass(frozen=True)
class ActivationCheckpointing:
    """Which blocks recompute their activations in backward, and how much of them.

    Attributes:
        blocks: Block classes (e.g. ``{TransformerBlock}``) or a predicate ``module -> bool``.
        mode: ``"full"`` or ``"selective"`` (save matmul outputs, recompute everything else).
        save_ops: For ``"selective"``: the ops whose outputs are kept (default: the matmuls).
    """

    blocks: Any
    mode: str = "full"
    save_ops: tuple[Any, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            msg = (
                f"ActivationCheckpointing(mode={self.mode!r}) is not a mode; choose one of {list(MODES)}: 'full' "
                "recomputes each block, 'selective' keeps matmul outputs and recomputes the rest."
            )
            raise MisconfigurationError(msg)
        object.__setattr__(self, "blocks", _block_predicate(self.blocks, "ActivationCheckpointing(blocks=...)"))

    def applies_to(self, module: nn.Module) -> bool:
        """Whether ``module`` is one of the blocks."""
        return bool(self.blocks(module))

    def describe(self) -> str:
        """Short readable form, for ``repr`` and logs."""
        classes = getattr(self.blocks, "classes", None)
        names = sorted(c.__name__ for c in classes) if classes else [getattr(self.blocks, "__name__", "predicate")]
        return f"{self.mode}:{','.join(names)}"


@dataclass(frozen=True)
class _Classes:
    classes: frozenset[type[nn.Module]]

    def __call__(self, module: nn.Module) -> bool:
        return isinstance(module, tuple(self.classes))


def _is_module_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, nn.Module)


def _block_predicate(value: Any, option: str) -> Callable[[nn.Module], bool]:
    if isinstance(value, _Classes):
        return value
    classes = getattr(value, "classes", None)  # a strategy's own frozen class policy
    if isinstance(classes, frozenset) and all(_is_module_class(c) for c in classes):
        value = set(classes)
    if _is_module_class(value):
        return _Classes(frozenset({value}))
    if isinstance(value, (set, frozenset, list, tuple)) and value and all(_is_module_class(v) for v in value):
        return _Classes(frozenset(value))
    if callable(value) and not isinstance(value, (nn.Module, str, type)):
        return value  # type: ignore[no-any-return]
    msg = f"{option}: {value!r} has type {type(value).__name__}; accepted: {_ACCEPTED}. Fix: e.g. {{MyBlock}}."
    raise MisconfigurationError(msg)


def resolve_blocks(value: Any, *, option: str) -> Callable[[nn.Module], bool] | None:
    """A block selection (class, set of classes, or predicate) as a predicate.

    Shared by the strategies' per-block options (regional compile), so every one accepts the same
    forms. ``None`` stays None.

    Raises:
        MisconfigurationError: ``value`` is none of the accepted forms; ``option`` names it.
    """
    return None if value is None else _block_predicate(value, option)


def resolve_activation_checkpointing(value: Any, *, owner: str) -> ActivationCheckpointing | None:
    """Normalise a strategy's ``activation_checkpointing_policy`` argument (at construction).

    A bare class set or predicate means full checkpointing of those blocks, as in Lightning. An
    object with a frozenset of module classes as ``classes`` (a strategy's own class policy) counts
    as that set.

    Args:
        value: What the user passed.
        owner: The strategy's class name, for the error.

    Raises:
        MisconfigurationError: ``value`` is none of the accepted forms.
    """
    option = f"{owner}(activation_checkpointing_policy={value!r})"
    if value is None or isinstance(value, ActivationCheckpointing):
        return value
    if isinstance(value, str):
        msg = (
            f"{option} names no blocks; accepted: {_ACCEPTED}. Fix: e.g. "
            f"activation_checkpointing_policy=ActivationCheckpointing({{MyBlock}}, mode={value!r})."
        )
        raise MisconfigurationError(msg)
    return ActivationCheckpointing(_block_predicate(value, option), mode="full")


def selective_policy(save_ops: tuple[Any, ...] = ()) -> Callable[..., Any]:
    """The op-level policy of selective checkpointing: keep ``save_ops`` outputs, recompute others."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    saved = set(save_ops) or {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        del ctx, args, kwargs
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_activation_checkpointing(model: nn.Module, config: ActivationCheckpointing | None, *, owner: str) -> int:
    """Make every matching block of ``model`` (the root excluded) recompute in backward.

    Args:
        model: The model, before the strategy shards or wraps it.
        config: What to checkpoint; ``None`` does nothing.
        owner: The strategy's name, for the error.

    Returns:
        How many blocks were set up.

    Raises:
        MisconfigurationError: No submodule matches (the option would silently do nothing).
    """
    if config is None:
        return 0
    blocks = [m for name, m in model.named_modules() if name and config.applies_to(m)]
    if not blocks:
        have = sorted({type(m).__name__ for m in model.modules()})
        msg = (
            f"{owner}(activation_checkpointing_policy={config.describe()}) matches no submodule of "
            f"{type(model).__name__}; its module classes are {have}. Fix: name classes from that list."
        )
        raise MisconfigurationError(msg)
    for block in blocks:
        if block.__dict__.get("_phalanx_checkpointed"):
            continue
        block.__dict__["forward"] = _checkpointed(block.forward, config)
        block.__dict__["_phalanx_checkpointed"] = True
    return len(blocks)


def _checkpointed(forward: Callable[..., Any], config: ActivationCheckpointing) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context_fn: Any = None
    if config.mode == "selective":
        context_fn = functools.partial(create_selective_checkpoint_contexts, selective_policy(config.save_ops))

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if context_fn is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    return run
