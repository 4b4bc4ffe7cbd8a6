"""The mesh layout: how many ranks each parallel dimension gets, and what "auto" means.

Kept free of torch so the sizes can be checked in the user's process before anything is launched:
a wrong product is a configuration error, not a hang in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = [
    "CONTEXT_PARALLEL",
    "DATA_PARALLEL",
    "DATA_PARALLEL_CONTEXT_PARALLEL",
    "DATA_PARALLEL_REPLICATE",
    "DATA_PARALLEL_SHARD",
    "DATA_PARALLEL_SHARD_CONTEXT_PARALLEL",
    "EXPERT_DATA_PARALLEL",
    "EXPERT_DATA_PARALLEL_CONTEXT_PARALLEL",
    "EXPERT_PARALLEL",
    "PIPELINE_PARALLEL",
    "TENSOR_PARALLEL",
    "MeshLayout",
    "check_expert_parallel_size",
    "check_size",
    "resolve_layout",
]

DATA_PARALLEL = "data_parallel"
DATA_PARALLEL_REPLICATE = "data_parallel_replicate"
DATA_PARALLEL_SHARD = "data_parallel_shard"
CONTEXT_PARALLEL = "context_parallel"
TENSOR_PARALLEL = "tensor_parallel"
PIPELINE_PARALLEL = "pipeline_parallel"
#: Flattened dims: FSDP shards over data x context parallel, since cp ranks hold the same samples'
#: other tokens and their gradients must be reduced together with the data-parallel ones.
DATA_PARALLEL_CONTEXT_PARALLEL = "data_parallel_context_parallel"
DATA_PARALLEL_SHARD_CONTEXT_PARALLEL = "data_parallel_shard_context_parallel"
#: Expert parallel borrows its ranks from data parallel (the shard dim under HSDP), which is then
#: ``expert_data_parallel`` (outer: ranks holding the same experts) x ``expert_parallel`` (inner:
#: ranks holding different experts); ``data_parallel`` is their flattened product.
EXPERT_PARALLEL = "expert_parallel"
EXPERT_DATA_PARALLEL = "expert_data_parallel"
EXPERT_DATA_PARALLEL_CONTEXT_PARALLEL = "expert_data_parallel_context_parallel"


@dataclass(frozen=True)
class MeshLayout:
    """Resolved sizes of the mesh dimensions; their product is the world size.

    The mesh is ordered ``(pipeline_parallel, data_parallel[_replicate, _shard], context_parallel,
    tensor_parallel)``, each dimension only when used (``data_parallel`` and ``tensor_parallel``
    always): tensor-parallel ranks are adjacent, so on one machine they share the fastest links,
    context parallel (a K/V all-gather per attention layer) next, and the pipeline dimension is
    outermost, since it moves the least data (one activation per microbatch). With hybrid sharding
    the data-parallel dimension is split into ``data_parallel_replicate`` (outer) and
    ``data_parallel_shard``; ``data_parallel`` is then their flattened product. With expert
    parallel the (shard) data-parallel dimension is split once more, into ``expert_data_parallel``
    (outer) and ``expert_parallel`` (inner, adjacent ranks: the all-to-all of every MoE layer runs
    over them); the data still differs over all of them.
    """

    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int = 1
    context_parallel: int = 1
    data_parallel_replicate: int = 1
    expert_parallel: int = 1

    @property
    def expert_data_parallel(self) -> int:
        """Data-shard ranks that hold the same experts: ``data_parallel_shard / expert_parallel``."""
        return self.data_parallel_shard // self.expert_parallel

    @property
    def data_parallel_shard(self) -> int:
        """Ranks FSDP shards over inside one replica (all data-parallel ranks without HSDP)."""
        return self.data_parallel // self.data_parallel_replicate

    @property
    def hybrid(self) -> bool:
        return self.data_parallel_replicate > 1

    def _dims(self) -> list[tuple[str, int]]:
        dims: list[tuple[str, int]] = []
        if self.pipeline_parallel > 1:
            dims.append((PIPELINE_PARALLEL, self.pipeline_parallel))
        if self.hybrid:
            dims.append((DATA_PARALLEL_REPLICATE, self.data_parallel_replicate))
        if self.expert_parallel > 1:
            dims += [(EXPERT_DATA_PARALLEL, self.expert_data_parallel), (EXPERT_PARALLEL, self.expert_parallel)]
        elif self.hybrid:
            dims.append((DATA_PARALLEL_SHARD, self.data_parallel_shard))
        else:
            dims.append((DATA_PARALLEL, self.data_parallel))
        if self.context_parallel > 1:
            dims.append((CONTEXT_PARALLEL, self.context_parallel))
        dims.append((TENSOR_PARALLEL, self.tensor_parallel))
        return dims

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh shape passed to ``init_device_mesh``."""
        return tuple(size for _, size in self._dims())

    @property
    def dim_names(self) -> tuple[str, ...]:
        """The mesh dimension names, in the order of :attr:`shape`."""
        return tuple(name for name, _ in self._dims())

    @property
    def flattened(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Flattened dimensions the strategy adds to the mesh: ``(name, source dims)``, in creation order."""
        out: list[tuple[str, tuple[str, ...]]] = []
        replicate = (DATA_PARALLEL_REPLICATE,) if self.hybrid else ()
        shard: tuple[str, ...] = (DATA_PARALLEL_SHARD,)
        if self.expert_parallel > 1:
            shard = (EXPERT_DATA_PARALLEL, EXPERT_PARALLEL)
            if self.hybrid:
                out.append((DATA_PARALLEL_SHARD, shard))
            out.append((DATA_PARALLEL, replicate + shard))
        elif self.hybrid:
            out.append((DATA_PARALLEL, (DATA_PARALLEL_REPLICATE, DATA_PARALLEL_SHARD)))
        if self.context_parallel > 1:
            if self.hybrid:
                out.append((DATA_PARALLEL_SHARD_CONTEXT_PARALLEL, (*shard, CONTEXT_PARALLEL)))
                out.append((DATA_PARALLEL_CONTEXT_PARALLEL, (*replicate, *shard, CONTEXT_PARALLEL)))
            else:
                whole = shard if self.expert_parallel > 1 else (DATA_PARALLEL,)
                out.append((DATA_PARALLEL_CONTEXT_PARALLEL, (*whole, CONTEXT_PARALLEL)))
            if self.expert_parallel > 1:
                out.append((EXPERT_DATA_PARALLEL_CONTEXT_PARALLEL, (EXPERT_DATA_PARALLEL, CONTEXT_PARALLEL)))
        return tuple(out)

    @property
    def fsdp_dims(self) -> tuple[str, ...]:
        """The mesh dims to pass to ``fully_shard``: 1-D (FSDP) or 2-D (replicate, shard: HSDP)."""
        shard = DATA_PARALLEL_SHARD_CONTEXT_PARALLEL if self.context_parallel > 1 else DATA_PARALLEL_SHARD
        if self.hybrid:
            return (DATA_PARALLEL_REPLICATE, shard)
        return (DATA_PARALLEL_CONTEXT_PARALLEL if self.context_parallel > 1 else DATA_PARALLEL,)

    @property
    def expert_fsdp_dims(self) -> tuple[str, ...]:
        """The mesh dims to pass to ``fully_shard`` for expert weights: the ranks holding the same experts.

        Without expert parallel these are :attr:`fsdp_dims` (experts are ordinary weights).
        """
        if self.expert_parallel == 1:
            return self.fsdp_dims
        shard = EXPERT_DATA_PARALLEL_CONTEXT_PARALLEL if self.context_parallel > 1 else EXPERT_DATA_PARALLEL
        return (DATA_PARALLEL_REPLICATE, shard) if self.hybrid else (shard,)

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    def coordinates(self, global_rank: int) -> dict[str, int]:
        """This rank's index along each dimension (the mesh is row-major over :attr:`shape`)."""
        tp = global_rank % self.tensor_parallel
        rest = global_rank // self.tensor_parallel
        cp = rest % self.context_parallel
        rest //= self.context_parallel
        dp = rest % self.data_parallel
        pp = rest // self.data_parallel
        shard = dp % self.data_parallel_shard
        return {
            DATA_PARALLEL: dp,
            DATA_PARALLEL_REPLICATE: dp // self.data_parallel_shard,
            DATA_PARALLEL_SHARD: shard,
            EXPERT_DATA_PARALLEL: shard // self.expert_parallel,
            EXPERT_PARALLEL: shard % self.expert_parallel,
            CONTEXT_PARALLEL: cp,
            TENSOR_PARALLEL: tp,
            PIPELINE_PARALLEL: pp,
        }


def check_size(name: str, value: Any, *, allow_auto: bool) -> int | str:
    """Validate one size argument: a positive int, or "auto" where allowed.

    Raises:
        MisconfigurationError: Naming the argument, the value and the accepted forms.
    """
    if allow_auto and value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        choices = 'a positive int or "auto"' if allow_auto else "a positive int"
        msg = f"ModelParallelStrategy({name}={value!r}) is invalid: pass {choices}."
        raise MisconfigurationError(msg)
    return value


def _suggest(world: int, tp: int, cp: int, pp: int) -> str:
    """A combination that multiplies to ``world``, keeping as many of the user's sizes as possible."""
    for keep_tp, keep_cp, keep_pp in ((tp, cp, pp), (tp, cp, 1), (tp, 1, 1), (1, cp, 1), (1, 1, 1)):
        fixed = keep_tp * keep_cp * keep_pp
        if world % fixed == 0:
            return (
                f"data_parallel_size={world // fixed}, tensor_parallel_size={keep_tp}, "
                f"context_parallel_size={keep_cp}, pipeline_parallel_size={keep_pp}"
            )
    return f"data_parallel_size={world}, tensor_parallel_size=1"  # pragma: no cover - (1, 1, 1) always divides


def resolve_layout(
    data_parallel_size: int | str,
    tensor_parallel_size: int | str,
    pipeline_parallel_size: int,
    *,
    num_nodes: int,
    num_processes: int,
    context_parallel_size: int = 1,
    data_parallel_replicate_size: int = 1,
    data_parallel_shard_size: int | None = None,
    expert_parallel_size: int = 1,
) -> MeshLayout:
    """Turn the user's sizes into a layout for ``num_nodes`` x ``num_processes`` ranks.

    Lightning's meaning of "auto" when both are "auto": data parallel across nodes, tensor parallel
    within a node (``tensor_parallel = devices / (pipeline_parallel x context_parallel)``). When
    only one is "auto" it takes what is left of the world, so ``data_parallel_size=2`` on 4
    devices means 2 x 2. ``data_parallel_shard_size`` given: data parallel is ``replicate x
    shard``; otherwise the shard size is what ``data_parallel / replicate`` leaves.
    ``expert_parallel_size`` takes no ranks of its own: it must divide the (shard) data-parallel
    size, whose ranks it splits into groups that hold different experts.

    Raises:
        MisconfigurationError: The sizes do not multiply to the world size, or "auto" cannot be
            filled evenly; the message names every size, the product, the world and a valid choice.
            Or ``expert_parallel_size`` does not divide the (shard) data-parallel size.
    """
    world = num_nodes * num_processes
    pp, cp, rep = pipeline_parallel_size, context_parallel_size, data_parallel_replicate_size
    dp, tp = data_parallel_size, tensor_parallel_size
    given = (
        f"data_parallel_size={dp!r}, data_parallel_replicate_size={rep}, data_parallel_shard_size="
        f"{data_parallel_shard_size!r}, tensor_parallel_size={tp!r}, context_parallel_size={cp}, "
        f"pipeline_parallel_size={pp}"
    )
    where = f"{world} processes ({num_nodes} node(s) x {num_processes} device(s))"
    fix = (
        f"Fix: choose sizes whose product is {world}, e.g. {_suggest(world, tp if isinstance(tp, int) else 1, cp, pp)}"
    )
    if data_parallel_shard_size is not None:
        if dp != "auto" and dp != rep * data_parallel_shard_size:
            msg = (
                f"ModelParallelStrategy({given}): data_parallel_size must be data_parallel_replicate_size x "
                f"data_parallel_shard_size = {rep * data_parallel_shard_size}. Fix: leave data_parallel_size='auto'."
            )
            raise MisconfigurationError(msg)
        dp = rep * data_parallel_shard_size
    if dp == "auto" and tp == "auto":
        if num_processes % (pp * cp):
            msg = (
                f"ModelParallelStrategy({given}) on {where}: with both sizes 'auto' tensor parallel spans one "
                f"node's devices divided by pipeline_parallel_size x context_parallel_size, but {num_processes} is "
                f"not divisible by {pp * cp}. Fix: give data_parallel_size and tensor_parallel_size explicitly, or "
                "change devices."
            )
            raise MisconfigurationError(msg)
        dp, tp = num_nodes, num_processes // (pp * cp)
    elif dp == "auto" or tp == "auto":
        fixed = int(tp if dp == "auto" else dp) * pp * cp
        if world % fixed:
            msg = (
                f"ModelParallelStrategy({given}) on {where}: the 'auto' size would be {world}/{fixed}, which is not "
                f"an integer. {fix}, or change devices/num_nodes."
            )
            raise MisconfigurationError(msg)
        if dp == "auto":
            dp = world // fixed
        else:
            tp = world // fixed
    dp, tp = int(dp), int(tp)
    if dp % rep:
        msg = (
            f"ModelParallelStrategy({given}) on {where}: data_parallel_replicate_size={rep} does not divide the "
            f"data-parallel size {dp}. Fix: choose data_parallel_replicate_size x data_parallel_shard_size = {dp} "
            f"(e.g. data_parallel_replicate_size=1, data_parallel_shard_size={dp})."
        )
        raise MisconfigurationError(msg)
    layout = MeshLayout(dp, tp, pp, context_parallel=cp, data_parallel_replicate=rep)
    if layout.world_size != world:
        msg = (
            f"ModelParallelStrategy({given}): data_parallel ({rep} replicate x {dp // rep} shard) x tensor_parallel x "
            f"context_parallel x pipeline_parallel = {dp} x {tp} x {cp} x {pp} = {layout.world_size}, but the job has "
            f"{where}. {fix}, or set devices/num_nodes so that devices x num_nodes = {layout.world_size}."
        )
        raise MisconfigurationError(msg)
    check_expert_parallel_size(expert_parallel_size, layout.data_parallel_shard, hybrid=layout.hybrid)
    return MeshLayout(
        dp, tp, pp, context_parallel=cp, data_parallel_replicate=rep, expert_parallel=expert_parallel_size
    )


def check_expert_parallel_size(ep: int, shard: int, *, hybrid: bool) -> None:
    """Expert parallel borrows data-parallel ranks: its size must divide the (shard) data-parallel size.

    Raises:
        MisconfigurationError: Naming the value, the sizes that divide and the fix.
    """
    if shard % ep == 0:
        return
    which = "data_parallel_shard_size" if hybrid else "data_parallel_size"
    divisors = [d for d in range(1, shard + 1) if shard % d == 0]
    msg = (
        f"ModelParallelStrategy(expert_parallel_size={ep}) must divide {which}={shard}: expert-parallel ranks are "
        f"data-parallel ranks, split into groups of expert_parallel_size that hold different experts. Valid "
        f"choices: {divisors}. Fix: choose one of them, or raise {which} (and devices) to a multiple of {ep}."
    )
    raise MisconfigurationError(msg)
