"""A model's shapes without its weights: build it on the meta device and summarize it for estimates.

``phalanx plan``, ``Trainer.plan`` and the conformance kit's memory check describe a model here
as a :class:`~phalanx.memory.ModelSummary` before asking the plugins what it costs
(:mod:`phalanx.planning`). Kept apart from :mod:`phalanx.memory` because it imports torch, which
the data a plugin receives must not; it sits just above that module and asks no plugin. Tracing
activations uses ``torch.func.functional_call`` with meta stand-ins for every parameter and
buffer, so even a model with real weights is traced without allocating anything.

``F.scaled_dot_product_attention`` is traced as the fused kernels that run it in training (flash
and memory-efficient attention on GPUs, flash attention on CPU), which keep the query, key, value,
output and the row-wise log-sum-exp for backward; on the meta device torch would otherwise take
the math path, whose saved ``L x L`` attention matrix is not what a real run holds (at 4096 tokens
it made the trace 16x the measured bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx.memory import ModelSummary, ParameterShape
from phalanx.utilities.attention import AttentionOverride

__all__ = ["build_on_meta", "summarize_model"]

_META_FIX = (
    "Fix: build layers from shapes only (no torch.load, .item(), .numpy() or data-dependent Python in "
    "__init__), create tensors without a hard-coded device=, and move weight loading to after the "
    "model is built (or into Module.configure_model)."
)


def build_on_meta(factory: Callable[[], Any], *, where: str = "the factory") -> nn.Module:
    """Call ``factory`` with the meta device as default, so no parameter gets storage.

    A ``phalanx.Module`` whose layers are created in ``configure_model`` has that hook run too.
    A 70B-parameter configuration builds in seconds this way.

    Raises:
        MisconfigurationError: The factory fails on meta tensors, returns no ``nn.Module`` or
            creates a parameter with real storage; says why and how to fix it.
    """
    try:
        with torch.device("meta"):
            model = factory()
            configure = getattr(model, "configure_model", None) if isinstance(model, nn.Module) else None
            if callable(configure):
                configure()
    except MisconfigurationError:
        raise
    except Exception as err:
        msg = f"{where} cannot be built on the meta device: {type(err).__name__}: {err}. {_META_FIX}"
        raise MisconfigurationError(msg) from err
    if not isinstance(model, nn.Module):
        msg = (
            f"{where} returned {type(model).__name__} ({model!r:.80}), not a torch.nn.Module. Fix: return the "
            "model itself, e.g. `def build(): return MyModel(config)`."
        )
        raise MisconfigurationError(msg)
    real = [name for name, p in model.named_parameters() if not p.is_meta]
    if real:
        msg = (
            f"{where} created parameter {real[0]!r} (and {len(real) - 1} more) with real storage instead of on "
            f"the meta device, so planning would allocate the weights. {_META_FIX}"
        )
        raise MisconfigurationError(msg)
    return model


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _block_modules(module: nn.Module) -> list[nn.Module]:
    """The entries of the largest ModuleList / Sequential (by parameters), else the children; with parameters."""
    best: list[nn.Module] = []
    for sub in module.modules():
        if isinstance(sub, (nn.ModuleList, nn.Sequential)) and len(sub) > 1:
            found = list(sub)
            if sum(map(_numel, found)) > sum(map(_numel, best)):
                best = found
    if not best:
        best = list(module.children())
    return [child for child in best if _numel(child)]


def _first_leaf(module: nn.Module) -> nn.Module | None:
    for sub in module.modules():
        if not list(sub.children()):
            return sub
    return None


def _default_input_dtype(module: nn.Module) -> torch.dtype:
    return torch.int64 if isinstance(_first_leaf(module), nn.Embedding) else torch.float32


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class _FusedAttentionSaves(torch.autograd.Function):
    """What a fused attention kernel saves for backward: q, k, v, the output, the log-sum-exp.

    The output is laid out (batch, length, heads, dim) and returned as its (batch, heads, length,
    dim) view, as the flash kernels do: a model's usual ``transpose(1, 2).reshape(...)`` is then a
    view of it, not a copy.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        shape = (*query.shape[:-1], value.shape[-1])
        if query.dim() >= 4:
            output = query.new_empty((*shape[:-3], shape[-2], shape[-3], shape[-1])).transpose(-3, -2)
        else:
            output = query.new_empty(shape)
        logsumexp = query.new_empty(query.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(query, key, value, output, logsumexp)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:  # pragma: no cover - never run
        query, key, value, _, _ = ctx.saved_tensors
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


_SDPA_NAMES = ("query", "key", "value")


class _FusedAttention(AttentionOverride):
    """During the trace, every attention call saves what a fused kernel saves; ``attending`` tells
    the pack hook that the bytes it sees belong to attention."""

    def attend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        query, key, value = (kwargs[n] if n in kwargs else args[i] for i, n in enumerate(_SDPA_NAMES))
        return _FusedAttentionSaves.apply(query, key, value)  # type: ignore[no-any-return]


def _trace_activations(
    module: nn.Module, blocks: list[nn.Module], input_shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[int | None, str | None, tuple[tuple[int, int], ...], int]:
    """Bytes autograd saves in one meta forward pass, why when it cannot tell, per block (input,
    saved), and the bytes saved by attention calls."""
    stand_ins = {
        name: torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)
        for name, t in (*module.named_parameters(), *module.named_buffers())
    }
    owned = {id(t) for t in stand_ins.values()}
    saved: dict[int, torch.Tensor] = {}  # kept alive so that ids stay unique while tracing
    per_block: list[list[int]] = [[0, 0] for _ in blocks]  # input bytes, bytes saved inside
    current: list[int | None] = [None]
    attention = _FusedAttention()
    attention_bytes = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if id(tensor) not in owned and id(base) not in owned and id(base) not in saved:
            saved[id(base)] = base
            if current[0] is not None:
                per_block[current[0]][1] += _nbytes(base)
            if attention.attending:
                attention_bytes[0] += _nbytes(base)
        return tensor

    def entering(index: int) -> Callable[..., None]:
        def hook(_module: nn.Module, args: Any) -> None:
            current[0] = index
            per_block[index][0] = sum(_nbytes(t) for t in _tensors(args))

        return hook

    def leaving(*_: Any) -> None:
        current[0] = None

    handles = [
        hook
        for i, block in enumerate(blocks)
        for hook in (block.register_forward_pre_hook(entering(i)), block.register_forward_hook(leaving))
    ]
    sample = torch.zeros(input_shape, dtype=dtype, device="meta")
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), attention:
            output = torch.func.functional_call(module, stand_ins, (sample,), tie_weights=True, strict=False)
    except Exception as err:
        return None, f"forward on a meta input of shape {list(input_shape)} failed ({type(err).__name__}: {err})", (), 0
    finally:
        for handle in handles:
            handle.remove()
    for tensor in _tensors(output):
        base = tensor._base if tensor._base is not None else tensor
        saved.setdefault(id(base), base)
    blocks_saved = tuple((given, inside) for given, inside in per_block)
    return sum(map(_nbytes, saved.values())), None, blocks_saved, attention_bytes[0]


def summarize_model(
    module: nn.Module, *, input_shape: tuple[int, ...] | None = None, input_dtype: str | None = None
) -> ModelSummary:
    """Describe ``module`` (meta or real) for estimates; trace activations for ``input_shape``.

    Activations are the bytes autograd saves in one forward pass over a meta tensor of
    ``input_shape`` (integers in ``[0, 2)`` of ``input_dtype``, default ``int64`` when the model
    starts with an ``nn.Embedding``, else ``float32``); nothing is allocated.

    Raises:
        MisconfigurationError: ``input_dtype`` is not a torch dtype; names an example.
    """
    linear_weights = {id(m.weight) for m in module.modules() if isinstance(m, nn.Linear)}
    parameters = tuple(
        ParameterShape(
            name, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.requires_grad, id(p) in linear_weights
        )
        for name, p in module.named_parameters()
    )
    buffer_bytes = sum(map(_nbytes, module.buffers()))
    blocks = _block_modules(module)
    activations: int | None = None
    note: str | None = None
    per_block: tuple[tuple[int, int], ...] = ()
    attention = 0
    if input_shape is not None:
        if input_dtype is None:
            dtype = _default_input_dtype(module)
        else:
            found = getattr(torch, input_dtype, None)
            if not isinstance(found, torch.dtype):
                msg = (
                    f"input dtype {input_dtype!r} is not a torch dtype; pass e.g. --input-dtype int64 (token ids) "
                    "or float32."
                )
                raise MisconfigurationError(msg)
            dtype = found
        activations, note, per_block, attention = _trace_activations(module, blocks, tuple(input_shape), dtype)
    return ModelSummary(
        parameters=parameters,
        buffer_bytes=buffer_bytes,
        blocks=tuple(map(_numel, blocks)),
        activation_bytes=activations,
        input_shape=None if input_shape is None else tuple(input_shape),
        activation_note=note,
        block_activations=per_block,
        attention_bytes=attention,
    )
