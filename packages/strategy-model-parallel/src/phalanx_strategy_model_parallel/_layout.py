"""The mesh layout: how many ranks each parallel dimension gets, and what "auto" means.

Kept free of torch so the sizes can be checked in the user's process before anything is launched:
a wrong product is a configuration error, not a hang in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = ["DATA_PARALLEL", "PIPELINE_PARALLEL", "TENSOR_PARALLEL", "MeshLayout", "check_size", "resolve_layout"]

DATA_PARALLEL = "data_parallel"
TENSOR_PARALLEL = "tensor_parallel"
PIPELINE_PARALLEL = "pipeline_parallel"


@dataclass(frozen=True)
class MeshLayout:
    """Resolved sizes of the mesh dimensions; their product is the world size.

    The mesh is ordered ``(pipeline_parallel, data_parallel, tensor_parallel)`` (pipeline only when
    used): tensor-parallel ranks are adjacent, so on one machine they share the fastest links, and
    the pipeline dimension is outermost, since it moves the least data (one activation per
    microbatch).
    """

    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh shape passed to ``init_device_mesh``."""
        if self.pipeline_parallel > 1:
            return (self.pipeline_parallel, self.data_parallel, self.tensor_parallel)
        return (self.data_parallel, self.tensor_parallel)

    @property
    def dim_names(self) -> tuple[str, ...]:
        """The mesh dimension names, in the order of :attr:`shape`."""
        if self.pipeline_parallel > 1:
            return (PIPELINE_PARALLEL, DATA_PARALLEL, TENSOR_PARALLEL)
        return (DATA_PARALLEL, TENSOR_PARALLEL)

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.tensor_parallel * self.pipeline_parallel

    def coordinates(self, global_rank: int) -> dict[str, int]:
        """This rank's index along each dimension (the mesh is row-major over :attr:`shape`)."""
        tp = global_rank % self.tensor_parallel
        dp = (global_rank // self.tensor_parallel) % self.data_parallel
        pp = global_rank // (self.tensor_parallel * self.data_parallel)
        return {DATA_PARALLEL: dp, TENSOR_PARALLEL: tp, PIPELINE_PARALLEL: pp}


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


def resolve_layout(
    data_parallel_size: int | str,
    tensor_parallel_size: int | str,
    pipeline_parallel_size: int,
    *,
    num_nodes: int,
    num_processes: int,
) -> MeshLayout:
    """Turn the user's sizes into a layout for ``num_nodes`` x ``num_processes`` ranks.

    Lightning's meaning of "auto" when both are "auto": data parallel across nodes, tensor parallel
    within a node (``tensor_parallel = devices / pipeline_parallel``). When only one is "auto" it
    takes what is left of the world, so ``data_parallel_size=2`` on 4 devices means 2 x 2.

    Raises:
        MisconfigurationError: The sizes do not multiply to the world size, or "auto" cannot be
            filled evenly; the message names every size and how to fix it.
    """
    world = num_nodes * num_processes
    pp = pipeline_parallel_size
    dp, tp = data_parallel_size, tensor_parallel_size
    given = f"data_parallel_size={dp!r}, tensor_parallel_size={tp!r}, pipeline_parallel_size={pp}"
    where = f"{world} processes ({num_nodes} node(s) x {num_processes} device(s))"
    if dp == "auto" and tp == "auto":
        if num_processes % pp:
            msg = (
                f"ModelParallelStrategy({given}) on {where}: with both sizes 'auto' tensor parallel spans one "
                f"node's devices divided by pipeline_parallel_size, but {num_processes} is not divisible by {pp}. "
                "Fix: give data_parallel_size and tensor_parallel_size explicitly, or change devices."
            )
            raise MisconfigurationError(msg)
        dp, tp = num_nodes, num_processes // pp
    elif dp == "auto" or tp == "auto":
        fixed = int(tp if dp == "auto" else dp) * pp
        if world % fixed:
            msg = (
                f"ModelParallelStrategy({given}) on {where}: the 'auto' size would be {world}/{fixed}, which is not "
                f"an integer. Fix: choose sizes whose product is {world}, or change devices/num_nodes."
            )
            raise MisconfigurationError(msg)
        if dp == "auto":
            dp = world // fixed
        else:
            tp = world // fixed
    layout = MeshLayout(int(dp), int(tp), pp)
    if layout.world_size != world:
        msg = (
            f"ModelParallelStrategy({given}): data_parallel_size x tensor_parallel_size x pipeline_parallel_size = "
            f"{layout.data_parallel} x {layout.tensor_parallel} x {pp} = {layout.world_size}, but the job has {where}. "
            f"Fix: choose sizes whose product is {world} (e.g. data_parallel_size='auto'), or set devices/num_nodes "
            f"so that devices x num_nodes = {layout.world_size}."
        )
        raise MisconfigurationError(msg)
    return layout
