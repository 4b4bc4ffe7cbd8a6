"""Expert parallel (MoE): experts sharded over ``expert_parallel`` ranks, tokens moved by all-to-all.

The expert layout this module works with: one module holds *stacked* expert weights, every
parameter shaped ``[num_experts, ...]``, and is called as ``experts(x, num_tokens_per_expert)``
with ``x`` the routed tokens grouped by expert (expert 0's rows first) and
``num_tokens_per_expert`` an int tensor ``[num_experts]``; it returns one output row per input row,
in the same order. :class:`GroupedExperts` (a two-layer FFN per expert) and
:class:`StackedExperts` (any identical ``nn.Module`` experts, e.g. an ``nn.ModuleList``) follow
it; :class:`MoE` is a router + experts block users can adopt.

:class:`ExpertParallel` is a ``ParallelStyle``: ``parallelize_module(experts,
device_mesh["expert_parallel"], ExpertParallel())`` turns each stacked weight into a DTensor
sharded on dim 0 (rank ``r`` of ``ep`` holds experts ``r * E/ep .. (r+1) * E/ep - 1``) and wraps the
call: the grouped tokens of every rank of the expert-parallel group are sent to the ranks that
hold their experts (``all_to_all_single``: first the counts, then the rows), regrouped by local
expert, computed, and sent back (the reverse all-to-all). Sharding on dim 0 as DTensors makes DCP
checkpoints reshard between expert-parallel sizes like any other sharded weight.

Gradients: the tokens an expert sees come from all ``ep`` ranks of its group, so its local
gradient is already the *sum* over those ranks' losses. FSDP over the ranks that hold the same
experts (``strategy.expert_fsdp_mesh``) averages over ``dp / ep`` of them, which leaves the
expert gradients ``ep`` times the data-parallel mean the dense weights get. The style divides the
gradient flowing into the experts' outputs by ``ep`` and multiplies the one leaving their inputs
by ``ep``: the expert weights' gradients are divided by ``ep`` and the tokens' gradients (router,
dense layers) are unchanged. FSDP's ``set_gradient_divide_factor`` would do the same with a
pre-multiplied sum, which gloo does not support.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle
from torch.func import functional_call

from phalanx.errors import MisconfigurationError
from phalanx_strategy_model_parallel._layout import (
    EXPERT_DATA_PARALLEL,
    EXPERT_DATA_PARALLEL_CONTEXT_PARALLEL,
    EXPERT_PARALLEL,
    MeshLayout,
)

__all__ = ["ExpertParallel", "GroupedExperts", "MoE", "StackedExperts", "prepare_expert_parallel"]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's experts: the local shard of a DTensor weight, the tensor itself otherwise."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` in backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class _Route:
    """One call's routing: the split sizes of both all-to-alls and the regrouping permutation."""

    def __init__(self, counts: torch.Tensor, group: dist.ProcessGroup, ep: int) -> None:
        per_rank = counts.to(torch.int64).reshape(ep, -1)  # [destination rank, its local expert]
        received = torch.empty_like(per_rank)
        dist.all_to_all_single(received, per_rank, group=group)  # [source rank, my local expert]
        per_rank, received = per_rank.cpu(), received.cpu()  # split sizes are host numbers
        self.input_splits = per_rank.sum(1).tolist()
        self.output_splits = received.sum(1).tolist()
        self.local_counts = received.sum(0)
        # The received rows are ordered (source rank, local expert); the experts need them grouped
        # by local expert: segment (e, src) starts at start[src, e] in the received rows.
        sizes = received.reshape(-1)
        start = torch.cumsum(sizes, 0) - sizes
        sizes_by_expert = received.t().reshape(-1)
        start_by_expert = start.reshape(received.shape).t().reshape(-1)
        grouped_start = torch.cumsum(sizes_by_expert, 0) - sizes_by_expert
        total = int(sizes.sum())
        self.index = torch.arange(total) + torch.repeat_interleave(start_by_expert - grouped_start, sizes_by_expert)
        self.inverse = torch.empty_like(self.index)
        self.inverse[self.index] = torch.arange(total)


class ExpertParallel(ParallelStyle):
    """Shard stacked experts on dim 0 over a 1-D ``expert_parallel`` mesh; dispatch and combine tokens by all-to-all.

    Apply it in ``configure_model`` to the module holding the stacked experts, before
    ``fully_shard`` (experts over ``strategy.expert_fsdp_mesh``, the rest over
    ``strategy.fsdp_mesh``)::

        parallelize_module(block.moe.experts, self.device_mesh["expert_parallel"], ExpertParallel())

    The module must follow the layout of :mod:`this module <phalanx_strategy_model_parallel._expert_parallel>`
    (every parameter ``[num_experts, ...]``, called as ``experts(x, num_tokens_per_expert)``),
    and read its weights through ``.to_local()`` when they are DTensors, as :class:`GroupedExperts`
    does; it then sees only this rank's experts and the tokens routed to them.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if device_mesh.ndim != 1:
            msg = (
                f"ExpertParallel needs a 1-D mesh, got one with dims {device_mesh.mesh_dim_names}. "
                "Fix: pass self.device_mesh['expert_parallel']."
            )
            raise MisconfigurationError(msg)
        ep = device_mesh.size()
        num_experts = check_stacked_experts(module, ep)
        stack: list[_Route] = []
        scale = float(ep)
        group = device_mesh.get_group()

        def partition(_name: str, submodule: nn.Module, mesh: DeviceMesh) -> None:
            for name, param in list(submodule.named_parameters(recurse=False)):
                sharded = distribute_tensor(param.data, mesh, [Shard(0)])
                submodule.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))

        def dispatch(_module: nn.Module, inputs: tuple[Any, ...], _mesh: DeviceMesh) -> tuple[Any, ...]:
            x, counts, *rest = inputs
            if counts.numel() != num_experts:
                msg = (
                    f"ExpertParallel: num_tokens_per_expert has {counts.numel()} entries, but the experts are "
                    f"{num_experts}. Fix: pass one count per expert (e.g. torch.bincount(ids, minlength={num_experts}))."
                )
                raise MisconfigurationError(msg)
            route = _Route(counts, group, ep)
            stack.append(route)
            received = all_to_all_single_autograd(x, route.output_splits, route.input_splits, group)
            grouped = _ScaleGrad.apply(received[route.index.to(received.device)], scale)
            return (grouped, route.local_counts.to(counts.device), *rest)

        def combine(_module: nn.Module, output: torch.Tensor, _mesh: DeviceMesh) -> torch.Tensor:
            route = stack.pop()
            output = _ScaleGrad.apply(output, 1.0 / scale)[route.inverse.to(output.device)]
            return all_to_all_single_autograd(output, route.input_splits, route.output_splits, group)

        # torch annotates input_fn / output_fn as returning None, but uses what they return
        distribute_module(module, device_mesh, partition, input_fn=dispatch, output_fn=combine)  # type: ignore[arg-type]
        return module


def check_stacked_experts(module: nn.Module, ep: int) -> int:
    """The number of experts of a stacked-experts module; refuse other layouts and sizes that do not divide.

    Raises:
        MisconfigurationError: No parameters, parameters of different leading sizes, parameters
            that are already DTensors, or ``num_experts`` not divisible by ``ep``.
    """
    params = dict(module.named_parameters())
    leading = {name: (tuple(p.shape)[:1] or (0,))[0] for name, p in params.items()}
    if not params or len(set(leading.values())) != 1:
        msg = (
            f"ExpertParallel({type(module).__qualname__}): expects stacked expert weights, every parameter shaped "
            f"[num_experts, ...]; got {dict(list(leading.items())[:6]) or 'no parameters'} as leading sizes. Fix: "
            "apply it to the experts module (e.g. GroupedExperts, or StackedExperts.from_modules(module_list))."
        )
        raise MisconfigurationError(msg)
    already = [name for name, p in params.items() if isinstance(p, DTensor)]
    if already:
        msg = (
            f"ExpertParallel({type(module).__qualname__}): {already[:4]} are already DTensors (parallelized or "
            "fully_shard-ed). Fix: apply ExpertParallel first, then fully_shard over strategy.expert_fsdp_mesh."
        )
        raise MisconfigurationError(msg)
    num_experts = next(iter(leading.values()))
    if num_experts % ep:
        choices = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        msg = (
            f"expert_parallel_size={ep} does not divide the {num_experts} experts of {type(module).__qualname__}: "
            f"every rank must hold the same number. Valid expert_parallel_size values: {choices}. Fix: choose one "
            f"of them, or a number of experts divisible by {ep}."
        )
        raise MisconfigurationError(msg)
    return num_experts


class GroupedExperts(nn.Module):
    """``num_experts`` two-layer FFNs with stacked weights: ``w1 [E, dim, hidden]``, ``w2 [E, hidden, dim]``.

    Expert ``e`` maps a row ``x`` to ``activation(x @ w1[e]) @ w2[e]``. Each expert runs as one
    matmul over its grouped rows (a loop over experts; grouped-GEMM kernels would batch it on GPUs).

    Args:
        num_experts: Experts ``E``.
        dim: Input and output width.
        hidden: Width inside each expert.
        activation: Applied between the two layers.
    """

    def __init__(
        self, num_experts: int, dim: int, hidden: int, activation: Callable[[torch.Tensor], torch.Tensor] = F.gelu
    ) -> None:
        super().__init__()
        self.activation = activation
        self.w1 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in ``±1/sqrt(fan_in)`` per layer, as ``nn.Linear`` draws its weights."""
        nn.init.uniform_(self.w1, -1 / math.sqrt(self.w1.shape[1]), 1 / math.sqrt(self.w1.shape[1]))
        nn.init.uniform_(self.w2, -1 / math.sqrt(self.w2.shape[1]), 1 / math.sqrt(self.w2.shape[1]))

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` grouped by expert, ``num_tokens_per_expert[e]`` of them for expert ``e``."""
        w1, w2 = _local(self.w1), _local(self.w2)
        chunks = x.split(num_tokens_per_expert.tolist())
        return torch.cat([self.activation(c @ w1[e]) @ w2[e] for e, c in enumerate(chunks)])


class StackedExperts(nn.Module):
    """Identical expert modules (an ``nn.ModuleList`` of FFNs) as stacked weights, so EP can shard them.

    Every parameter of the experts becomes one parameter ``[num_experts, *shape]`` under the same
    name (``experts.3.up.weight`` becomes ``up.weight[3]``); the forward runs the first expert's
    code with each expert's slice (``torch.func.functional_call``), so the outputs are those of
    the original list. Build it from real (not meta) modules; the weights are copied.

    Args:
        experts: The expert modules, all with the same parameter names and shapes and no buffers.

    Raises:
        MisconfigurationError: No experts, differing parameters, or buffers.
    """

    _template: nn.Module

    def __init__(self, experts: Sequence[nn.Module]) -> None:
        super().__init__()
        shapes = [{n: tuple(p.shape) for n, p in e.named_parameters()} for e in experts]
        if (
            not experts
            or any(s != shapes[0] for s in shapes)
            or any(next(e.buffers(), None) is not None for e in experts)
        ):
            msg = (
                f"StackedExperts needs one or more experts with the same parameter names and shapes and no buffers; "
                f"got {len(experts)} expert(s) with parameters {shapes[:2]}. Fix: pass identical expert modules "
                "(keep normalisation buffers outside the experts)."
            )
            raise MisconfigurationError(msg)
        self.__dict__["_template"] = copy.deepcopy(experts[0]).to("meta")  # code only, not a submodule
        for name in shapes[0]:
            *path, leaf = name.split(".")
            holder: nn.Module = self
            for part in path:
                if not hasattr(holder, part):
                    holder.add_module(part, nn.Module())
                holder = getattr(holder, part)
            values = [dict(e.named_parameters())[name] for e in experts]
            holder.register_parameter(
                leaf, nn.Parameter(torch.stack([v.detach() for v in values]), requires_grad=values[0].requires_grad)
            )

    @classmethod
    def from_modules(cls, experts: Sequence[nn.Module]) -> StackedExperts:
        """``StackedExperts(experts)``: reads as what it does where a ``ModuleList`` is replaced."""
        return cls(experts)

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` grouped by expert; each group through its expert's weights."""
        weights = {name: _local(p) for name, p in self.named_parameters()}
        chunks = x.split(num_tokens_per_expert.tolist())
        outputs = [
            functional_call(self._template, {n: w[e] for n, w in weights.items()}, (chunk,))
            for e, chunk in enumerate(chunks)
        ]
        return torch.cat(outputs)


class MoE(nn.Module):
    """A mixture-of-experts block: a linear router with top-k, stacked experts, a load-balancing loss.

    Each token goes to its ``top_k`` experts by router probability (softmax over all experts);
    their outputs are summed with the top-k probabilities renormalised to 1. After every forward,
    ``aux_loss`` holds the Switch-Transformer load-balancing loss ``E * sum_e f_e * P_e`` (``f_e``:
    the fraction of token-to-expert assignments that went to ``e``; ``P_e``: the mean router
    probability of ``e``); add ``coefficient * aux_loss`` to the training loss.

    Under data parallel the fractions ``f_e`` are counted over the whole global batch: when
    ``load_balance_group`` is set (``ModelParallelStrategy`` sets it to the data (x context)
    parallel group in setup), the counts are all-reduced over it. Each rank's ``aux_loss`` uses
    its own ``P_e``, so the mean of the ranks' losses, and the averaged gradient, equal those of
    one process on the global batch.

    Args:
        dim: Token width.
        hidden: Width inside each expert.
        num_experts: Experts ``E``.
        top_k: Experts per token.
        experts: The experts module (the stacked layout); default ``GroupedExperts(num_experts, dim, hidden)``.
    """

    def __init__(
        self, dim: int, hidden: int, num_experts: int, top_k: int = 2, experts: nn.Module | None = None
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            msg = f"MoE(top_k={top_k}, num_experts={num_experts}): top_k must be in 1..{num_experts}. Fix: lower top_k."
            raise MisconfigurationError(msg)
        self.num_experts, self.top_k = num_experts, top_k
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = experts if experts is not None else GroupedExperts(num_experts, dim, hidden)
        self.load_balance_group: dist.ProcessGroup | None = None
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim]`` to the same shape; sets :attr:`aux_loss`."""
        tokens = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.router(tokens), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts)
        routed = self.experts(tokens[order // self.top_k], counts)
        unsorted = torch.empty_like(routed).index_copy(0, order, routed)
        out = (unsorted.reshape(-1, self.top_k, routed.shape[-1]) * weights.unsqueeze(-1)).sum(dim=1)
        self.aux_loss = self._load_balancing_loss(probs, counts)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _load_balancing_loss(self, probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        stats = torch.cat([counts.to(probs.dtype), probs.new_tensor([counts.sum()])]).detach()
        if self.load_balance_group is not None:
            dist.all_reduce(stats, group=self.load_balance_group)
        fraction = stats[:-1] / stats[-1]
        return self.num_experts * (fraction * probs.mean(dim=0)).sum()


def prepare_expert_parallel(
    module: nn.Module, layout: MeshLayout, batch_group: dist.ProcessGroup | None, *, gradient_clip_val: Any = None
) -> None:
    """After ``configure_model``: check where expert weights were sharded; point MoE blocks at the batch group.

    Raises:
        MisconfigurationError: ``expert_parallel_size > 1`` and no weight is sharded over
            ``expert_parallel``; expert weights not ``fully_shard``-ed over ``expert_fsdp_mesh``;
            other weights sharded over the expert data-parallel ranks only; the Trainer's
            ``gradient_clip_val`` (the core's clipping cannot combine norms of different meshes).
    """
    for submodule in module.modules():
        if isinstance(submodule, MoE) and submodule.load_balance_group is None:
            submodule.load_balance_group = batch_group
    if layout.expert_parallel == 1:
        return
    if gradient_clip_val:
        msg = (
            f"Trainer(gradient_clip_val={gradient_clip_val}) with expert_parallel_size={layout.expert_parallel}: "
            "torch's clip_grad_norm_ cannot combine the norms of expert weights and dense weights, which live on "
            "different meshes. Fix: remove gradient_clip_val and call "
            "phalanx_strategy_model_parallel.clip_grad_norm_(self.parameters(), max_norm) in "
            "on_before_optimizer_step."
        )
        raise MisconfigurationError(msg)
    experts, unsharded, dense_on_expert_mesh = [], [], []
    for name, param in module.named_parameters():
        dims = (param.device_mesh.mesh_dim_names or ()) if isinstance(param, DTensor) else ()
        if EXPERT_PARALLEL in dims:
            experts.append(name)
            if not set(layout.expert_fsdp_dims) <= set(dims):
                unsharded.append(f"{name} (mesh {dims})")
        elif {EXPERT_DATA_PARALLEL, EXPERT_DATA_PARALLEL_CONTEXT_PARALLEL} & set(dims):
            dense_on_expert_mesh.append(name)
    if not experts:
        msg = (
            f"expert_parallel_size={layout.expert_parallel}, but no parameter of {type(module).__qualname__} is sharded "
            "over device_mesh['expert_parallel'], so the expert-parallel ranks would each hold every expert. Fix: in "
            "configure_model, parallelize_module(<stacked experts>, self.device_mesh['expert_parallel'], "
            "ExpertParallel()) before fully_shard (see docs/model-parallel.md), or set expert_parallel_size=1."
        )
        raise MisconfigurationError(msg)
    if unsharded:
        msg = (
            f"expert_parallel_size={layout.expert_parallel}: {unsharded[:4]}{' ...' if len(unsharded) > 4 else ''} are "
            "not fully_shard-ed over the ranks that hold the same experts, so their gradients would not be averaged "
            "(or be averaged over ranks holding other experts). Fix: fully_shard(<experts>, "
            "mesh=self.trainer.strategy.expert_fsdp_mesh) right after ExpertParallel, before fully_shard of the "
            "enclosing block and root."
        )
        raise MisconfigurationError(msg)
    if dense_on_expert_mesh:
        msg = (
            f"expert_parallel_size={layout.expert_parallel}: {dense_on_expert_mesh[:4]} are not experts but are sharded "
            "over strategy.expert_fsdp_mesh, so their gradients would miss the expert-parallel ranks' data. Fix: "
            "fully_shard them over self.trainer.strategy.fsdp_mesh; expert_fsdp_mesh is for ExpertParallel weights."
        )
        raise MisconfigurationError(msg)
