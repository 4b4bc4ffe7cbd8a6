"""Pipeline stages: how a Module declares them, checking they cover it, keeping only this rank's.

A Module trained with ``pipeline_parallel_size > 1`` defines ``pipeline_stages()``, returning its
layers as consecutive blocks (``nn.Module`` each, the output of block ``i`` is the input of block
``i + 1``). Every parameter must belong to exactly one block, so the split is checked before
anything is dropped. The schedule fixes the number of stages, ``pipeline_parallel_size x
stages_per_rank`` (:func:`~phalanx_strategy_model_parallel._pipeline.stages_per_rank`); the blocks
are grouped into that many stages of consecutive blocks (:func:`group_blocks`: as even as
possible, earlier stages taking one block more), so a Module returning exactly that many blocks
decides the split itself. Each rank then keeps only its own stages: the other stages' submodules
are replaced by empty placeholders inside the Module, so ``self.parameters()`` (and therefore
``configure_optimizers``, state dicts and checkpoints) see this rank's part only, under the same
names the full model uses.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from phalanx.errors import MisconfigurationError

__all__ = ["DroppedStage", "declared_blocks", "group_blocks", "keep_only"]


class DroppedStage(nn.Module):
    """Stands in for a submodule that lives on another pipeline rank."""

    def forward(self, *args: object, **kwargs: object) -> None:
        msg = (
            "This submodule lives on another pipeline-parallel rank. Under pipeline parallel, run the model "
            "through self.trainer.strategy.run_pipeline(...) instead of calling it directly."
        )
        raise RuntimeError(msg)


def declared_blocks(module: nn.Module) -> list[nn.Module]:
    """The Module's ``pipeline_stages()``, checked to cover every parameter exactly once.

    Raises:
        MisconfigurationError: No ``pipeline_stages``, not a list of modules, a parameter in no
            block or in two, or a block that is not part of the Module.
    """
    name = type(module).__qualname__
    hook = getattr(module, "pipeline_stages", None)
    if not callable(hook):
        msg = (
            f"pipeline_parallel_size > 1 needs the Module to declare its stages, but {name} has no "
            "pipeline_stages() method. Fix: define pipeline_stages(self) returning the model's layers as a list of "
            "consecutive nn.Module blocks (see docs/model-parallel.md), or set pipeline_parallel_size=1."
        )
        raise MisconfigurationError(msg)
    blocks = hook()
    if not isinstance(blocks, Sequence) or not all(isinstance(b, nn.Module) for b in blocks):
        msg = f"{name}.pipeline_stages() returned {type(blocks).__name__}; return a list of nn.Module blocks."
        raise MisconfigurationError(msg)
    blocks = list(blocks)
    _check_cover(module, blocks, name)
    return blocks


def group_blocks(
    blocks: list[nn.Module], num_stages: int, *, name: str, schedule: str, pipeline_size: int, layout: str
) -> list[nn.Module]:
    """``num_stages`` stages of consecutive blocks, sizes differing by at most one (earlier ones larger).

    A stage of one block is that block; a stage of several is an ``nn.Sequential`` of them (it holds
    the Module's own submodules, so parameter names do not change).

    Raises:
        MisconfigurationError: Fewer blocks than stages, naming both counts, the layout and the fixes.
    """
    count = len(blocks)
    if count < num_stages:
        per_rank = num_stages // pipeline_size
        where = {
            "single": "one stage per rank",
            "loop": f"{per_rank} stages per rank (rank r runs stages r, r + {pipeline_size}, ...)",
            "v": f"2 stages per rank (rank r runs stages r and {num_stages - 1} - r)",
        }[layout]
        msg = (
            f"{name}.pipeline_stages() returned {count} block(s), but pipeline_schedule={schedule!r} with "
            f"pipeline_parallel_size={pipeline_size} runs {num_stages} stages ({where}), and a stage needs at least "
            f"one block. Fix: return at least {num_stages} blocks (split the model finer, e.g. one per layer), use a "
            f"smaller pipeline_parallel_size, or a schedule with one stage per rank ('gpipe', '1f1b')."
        )
        raise MisconfigurationError(msg)
    base, extra = divmod(count, num_stages)
    stages: list[nn.Module] = []
    start = 0
    for index in range(num_stages):
        size = base + (1 if index < extra else 0)
        group = blocks[start : start + size]
        stages.append(group[0] if size == 1 else nn.Sequential(*group))
        start += size
    return stages


def _check_cover(module: nn.Module, blocks: list[nn.Module], name: str) -> None:
    owner: dict[int, int] = {}
    for index, block in enumerate(blocks):
        for param in block.parameters():
            if id(param) in owner and owner[id(param)] != index:
                msg = (
                    f"{name}.pipeline_stages(): a parameter belongs to block {owner[id(param)]} and block {index}. "
                    "Fix: give every layer to exactly one block (weight tying across stages is not supported)."
                )
                raise MisconfigurationError(msg)
            owner[id(param)] = index
    names = {id(p): n for n, p in module.named_parameters()}
    uncovered = [n for n, p in module.named_parameters() if id(p) not in owner]
    foreign = [i for i, block in enumerate(blocks) if any(id(p) not in names for p in block.parameters())]
    if uncovered:
        msg = (
            f"{name}.pipeline_stages() does not cover the model: parameters {uncovered[:6]}"
            f"{' ...' if len(uncovered) > 6 else ''} are in no block. Fix: put every layer into one of the blocks."
        )
        raise MisconfigurationError(msg)
    if foreign:
        msg = (
            f"{name}.pipeline_stages(): block(s) {foreign} hold parameters that are not the Module's. Fix: build the "
            "blocks from the Module's own submodules (e.g. nn.Sequential(self.layers[0], self.layers[1]))."
        )
        raise MisconfigurationError(msg)


def keep_only(module: nn.Module, mine: list[nn.Module]) -> list[str]:
    """Replace every submodule whose parameters all live on other ranks; returns their names.

    Raises:
        MisconfigurationError: A module holds parameters of this rank's stage and another's directly
            (not through submodules), so it cannot be split.
    """
    owned = {id(p) for stage in mine for p in stage.parameters()}
    dropped: list[str] = []

    def visit(parent: nn.Module, prefix: str) -> None:
        own = [(n, p) for n, p in parent.named_parameters(recurse=False)]
        if own and any(id(p) in owned for _, p in own) != all(id(p) in owned for _, p in own):
            msg = (
                f"{prefix or type(parent).__name__} holds parameters of two pipeline stages directly. Fix: split "
                "stages at submodule boundaries."
            )
            raise MisconfigurationError(msg)
        for child_name, child in list(parent.named_children()):
            params = list(child.parameters())
            path = f"{prefix}.{child_name}" if prefix else child_name
            if params and not any(id(p) in owned for p in params):
                setattr(parent, child_name, DroppedStage())
                dropped.append(path)
            elif params:
                visit(child, path)

    visit(module, "")
    return dropped
