"""Context parallel: split each sequence over ranks, let every attention see the whole sequence.

The strategy cuts the batch's sequence dimension into ``2 x cp`` chunks and gives rank ``i``
chunks ``i`` and ``2cp - 1 - i``: under a causal mask early tokens attend to few keys and late
ones to many, so pairing an early chunk with a late one gives every rank the same attention work.

While a training step (and its backward, for recomputed activations) runs, an
``AttentionOverride`` (:mod:`phalanx.utilities.attention`) replaces each
``F.scaled_dot_product_attention`` call, also the one inside ``nn.MultiheadAttention``: the local keys and
values are all-gathered over the context-parallel group with an autograd-aware functional
collective (its backward is a reduce-scatter, so dK and dV reach the rank that owns each token)
and attention runs over the gathered sequence, causal with respect to each token's global
position (see ``ContextParallelAttention._causal``). This works on every device and backend; torch's ring attention
(``context_parallel()``) is not used: it fails on CPU in torch 2.13 and is left out here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import all_gather_single_autograd

from phalanx.errors import MisconfigurationError
from phalanx.utilities.attention import AttentionOverride
from phalanx.utilities.attention import scaled_dot_product_attention as _SDPA

__all__ = [
    "ContextParallelAttention",
    "SeqDims",
    "check_seq_dims",
    "context_parallel_positions",
    "load_balanced_positions",
    "split_batch",
]

#: ``int``: every tensor with that many dims or more is split along it; a mapping: for dict
#: batches, only the listed keys, each along its dim (None: not split).
SeqDims = int | Mapping[str, int | None]

_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_ACTIVE: list[ContextParallelAttention] = []


def check_seq_dims(value: Any) -> SeqDims:
    """Validate ``context_parallel_seq_dims``.

    Raises:
        MisconfigurationError: Naming the value and the accepted forms.
    """
    ok_int = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    ok_map = isinstance(value, Mapping) and all(
        isinstance(k, str) and (v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0))
        for k, v in value.items()
    )
    if not (ok_int or ok_map):
        msg = (
            f"ModelParallelStrategy(context_parallel_seq_dims={value!r}) is invalid: pass the sequence dimension as a "
            "non-negative int (default 1: batch x sequence x ...), or a dict from batch key to dim (None: do not "
            "split that key), e.g. {'input_ids': 1, 'labels': 1}."
        )
        raise MisconfigurationError(msg)
    return value


def load_balanced_positions(
    seq_len: int, cp_size: int, cp_rank: int, device: torch.device | None = None
) -> torch.Tensor:
    """Global positions of the tokens rank ``cp_rank`` holds, for a full sequence of ``seq_len``."""
    chunk = seq_len // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk, device=device)
    last = 2 * cp_size - 1 - cp_rank
    return torch.cat([first, torch.arange(last * chunk, (last + 1) * chunk, device=device)])


def context_parallel_positions(local_seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The global positions of this rank's tokens, for RoPE or learned position embeddings.

    Call it in ``forward`` with the sequence length the model sees. Inside a context-parallel
    training step the tokens are two chunks from far apart in the sequence, so ``arange`` would be
    wrong; outside one (no context parallel, validation, plain PyTorch) this is
    ``torch.arange(local_seq_len)``, so a model using it runs unchanged everywhere.
    """
    dev = torch.device(device) if device is not None else None
    if not _ACTIVE:
        return torch.arange(local_seq_len, device=dev)
    mode = _ACTIVE[-1]
    return load_balanced_positions(local_seq_len * mode.size, mode.size, mode.rank, dev)


def _split(tensor: torch.Tensor, dim: int, size: int, rank: int, name: str) -> torch.Tensor:
    length = tensor.shape[dim]
    parts = 2 * size
    if length % parts:
        lower, upper = length // parts * parts, (length // parts + 1) * parts
        valid = f"{lower} or {upper}" if lower else f"{upper}"
        msg = (
            f"context_parallel_size={size} splits the sequence into {parts} chunks (two per rank, for causal load "
            f"balance), but {name} has length {length} along dim {dim}, which is not a multiple of {parts}. Valid "
            f"lengths are multiples of {parts} (e.g. {valid}). Fix: pad the sequences to a multiple of {parts} in the "
            "dataset or collate function, or change context_parallel_size."
        )
        raise MisconfigurationError(msg)
    chunks = tensor.chunk(parts, dim=dim)
    return torch.cat([chunks[rank], chunks[parts - 1 - rank]], dim=dim)


def split_batch(batch: Any, seq_dims: SeqDims, size: int, rank: int, _path: str = "batch") -> Any:
    """This rank's share of every sequence in ``batch`` (tensors, lists, tuples and dicts of them).

    Raises:
        MisconfigurationError: A sequence length not divisible by ``2 x size``, or a dict mapping
            for a batch that is not a dict.
    """
    if isinstance(seq_dims, Mapping):
        if not isinstance(batch, Mapping):
            msg = (
                f"context_parallel_seq_dims={dict(seq_dims)!r} names batch keys, but the batch is a "
                f"{type(batch).__name__}. Fix: return dict batches, or pass one int (the sequence dim of every tensor)."
            )
            raise MisconfigurationError(msg)
        out = dict(batch)
        for key, dim in seq_dims.items():
            if dim is not None and key in out:
                out[key] = split_batch(out[key], dim, size, rank, f"batch[{key!r}]")
        return type(batch)(out) if type(batch) is not dict else out  # type: ignore[call-arg]
    if isinstance(batch, torch.Tensor):
        return _split(batch, seq_dims, size, rank, _path) if batch.dim() > seq_dims else batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(
            *(split_batch(v, seq_dims, size, rank, f"{_path}.{f}") for f, v in zip(batch._fields, batch))
        )
    if isinstance(batch, (list, tuple)):
        return type(batch)(split_batch(v, seq_dims, size, rank, f"{_path}[{i}]") for i, v in enumerate(batch))
    if isinstance(batch, Mapping):
        return {k: split_batch(v, seq_dims, size, rank, f"{_path}[{k!r}]") for k, v in batch.items()}
    return batch


class ContextParallelAttention(AttentionOverride):
    """Active during a step: every ``F.scaled_dot_product_attention`` attends over the whole sequence
    (also the call inside ``nn.MultiheadAttention``: :class:`phalanx.utilities.attention.AttentionOverride`).

    Counts the calls it replaced, so the strategy can refuse a model that never called it (its
    attention, if any, would silently see only this rank's tokens).
    """

    def __init__(self, group: ProcessGroup, size: int, rank: int) -> None:
        super().__init__()
        self.group = group
        self.size = size
        self.rank = rank
        self.calls = 0

    def __enter__(self) -> ContextParallelAttention:
        _ACTIVE.append(self)
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)
        super().__exit__(*exc)

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-gather along the sequence dim (-2) with autograd: the backward reduce-scatters dK / dV."""
        return all_gather_single_autograd(tensor.contiguous(), tensor.dim() - 2, self.group)

    def attend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = dict(zip(_SDPA_NAMES, args)) | kwargs
        query, key, value = call.pop("query"), call.pop("key"), call.pop("value")
        if call.get("attn_mask") is not None:
            msg = (
                "F.scaled_dot_product_attention(attn_mask=...) under context parallel: the mask would have to cover "
                "the whole sequence for this rank's tokens, which the strategy cannot infer. Fix: use is_causal=True "
                "(or no mask) in the model, or context_parallel_size=1."
            )
            raise MisconfigurationError(msg)
        if query.shape[-2] != key.shape[-2]:
            msg = (
                f"F.scaled_dot_product_attention got {query.shape[-2]} queries and {key.shape[-2]} keys under context "
                "parallel; only self-attention over the split sequence is supported. Fix: context_parallel_size=1 "
                "for models with cross-attention."
            )
            raise MisconfigurationError(msg)
        self.calls += 1
        local = key.shape[-2]
        key, value = self._gather(key), self._gather(value)
        if not call.pop("is_causal", False):
            return _SDPA(query, key, value, **call)
        return self._causal(query, key, value, local, call)

    def _causal(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, local: int, call: dict[str, Any]
    ) -> torch.Tensor:
        """Causal attention of this rank's two query chunks over the gathered, reordered keys.

        No mask tensor: a boolean mask would make SDPA fall back to the kernel that keeps the whole
        ``L/cp x L`` attention matrix for backward. Instead chunk ``i`` attends to the keys of
        chunks ``0..i`` with ``is_causal=True`` after ``i x chunk`` zero queries are put in front
        of it, so torch's top-left causal alignment lines each query up with its global position;
        the padded rows' outputs are dropped (their gradient is zero). Memory stays linear in the
        sequence length; the padded rows cost extra compute.
        """
        chunk, parts = local // 2, 2 * self.size
        # gathered order: rank 0's chunks (0, parts-1), rank 1's (1, parts-2), ...; put it in global order
        order = [0] * parts
        for rank in range(self.size):
            order[rank], order[parts - 1 - rank] = 2 * rank, 2 * rank + 1
        key = torch.cat([key.narrow(-2, j * chunk, chunk) for j in order], dim=-2)
        value = torch.cat([value.narrow(-2, j * chunk, chunk) for j in order], dim=-2)
        outputs = []
        for half, index in enumerate((self.rank, parts - 1 - self.rank)):
            q = query.narrow(-2, half * chunk, chunk)
            if index:
                pad = q.new_zeros((*q.shape[:-2], index * chunk, q.shape[-1]))
                q = torch.cat([pad, q], dim=-2)
            end = (index + 1) * chunk
            out = _SDPA(q, key.narrow(-2, 0, end), value.narrow(-2, 0, end), is_causal=True, **call)
            outputs.append(out.narrow(-2, index * chunk, chunk))
        return torch.cat(outputs, dim=-2)
