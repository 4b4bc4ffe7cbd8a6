"""Pipeline stages: how a Module declares them, checking they cover it, keeping only this rank's.

A Module trained with ``pipeline_parallel_size > 1`` defines ``pipeline_stages()``, returning its
layers split into consecutive stages (``nn.Module`` each, the output of stage ``i`` is the input of
stage ``i + 1``). Every parameter must belong to exactly one stage, so the split is checked before
anything is dropped. Each rank then keeps only its own stages: the other stages' submodules are
replaced by empty placeholders inside the Module, so ``self.parameters()`` (and therefore
``configure_optimizers``, state dicts and checkpoints) see this rank's part only, under the same
names the full model uses.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from phalanx.errors import MisconfigurationError

__all__ = ["DroppedStage", "declared_stages", "keep_only"]


class DroppedStage(nn.Module):
    """Stands in for a submodule that lives on another pipeline rank."""

    def forward(self, *args: object, **kwargs: object) -> None:
        msg = (
            "This submodule lives on another pipeline-parallel rank. Under pipeline parallel, run the model "
            "through self.trainer.strategy.run_pipeline(...) instead of calling it directly."
        )
        raise RuntimeError(msg)


def declared_stages(module: nn.Module, *, pipeline_size: int, multi: bool, schedule: str) -> list[nn.Module]:
    """The Module's ``pipeline_stages()``, checked in number and to cover every parameter.

    Single-stage schedules need one stage per pipeline rank; interleaved ones a multiple (at least
    two per rank).

    Raises:
        MisconfigurationError: No ``pipeline_stages``, the wrong number of stages, a parameter in no
            stage or in two, or a stage that is not part of the Module.
    """
    name = type(module).__qualname__
    hook = getattr(module, "pipeline_stages", None)
    if not callable(hook):
        msg = (
            f"pipeline_parallel_size > 1 needs the Module to declare its stages, but {name} has no "
            "pipeline_stages() method. Fix: define pipeline_stages(self) returning the model's layers split into "
            "consecutive nn.Module stages (see docs/model-parallel.md), or set pipeline_parallel_size=1."
        )
        raise MisconfigurationError(msg)
    stages = hook()
    if not isinstance(stages, Sequence) or not all(isinstance(s, nn.Module) for s in stages):
        msg = f"{name}.pipeline_stages() returned {type(stages).__name__}; return a list of nn.Module stages."
        raise MisconfigurationError(msg)
    stages = list(stages)
    count = len(stages)
    if (count != pipeline_size) if not multi else (count % pipeline_size or count < 2 * pipeline_size):
        want = f"{pipeline_size}" if not multi else f"a multiple of {pipeline_size} (at least {2 * pipeline_size})"
        msg = (
            f"{name}.pipeline_stages() returned {count} stage(s), but pipeline_schedule={schedule!r} with "
            f"pipeline_parallel_size={pipeline_size} runs {want}. Fix: split the model into {want} stages, or change "
            "pipeline_parallel_size / pipeline_schedule ('gpipe' and '1f1b' run one stage per pipeline rank, "
            "'interleaved_1f1b' several)."
        )
        raise MisconfigurationError(msg)
    _check_cover(module, stages, name)
    return stages


def _check_cover(module: nn.Module, stages: list[nn.Module], name: str) -> None:
    owner: dict[int, int] = {}
    for index, stage in enumerate(stages):
        for param in stage.parameters():
            if id(param) in owner and owner[id(param)] != index:
                msg = (
                    f"{name}.pipeline_stages(): a parameter belongs to stage {owner[id(param)]} and stage {index}. "
                    "Fix: give every layer to exactly one stage (weight tying across stages is not supported)."
                )
                raise MisconfigurationError(msg)
            owner[id(param)] = index
    names = {id(p): n for n, p in module.named_parameters()}
    uncovered = [n for n, p in module.named_parameters() if id(p) not in owner]
    foreign = [i for i, stage in enumerate(stages) if any(id(p) not in names for p in stage.parameters())]
    if uncovered:
        msg = (
            f"{name}.pipeline_stages() does not cover the model: parameters {uncovered[:6]}"
            f"{' ...' if len(uncovered) > 6 else ''} are in no stage. Fix: put every layer into one of the stages."
        )
        raise MisconfigurationError(msg)
    if foreign:
        msg = (
            f"{name}.pipeline_stages(): stage(s) {foreign} hold parameters that are not the Module's. Fix: build the "
            "stages from the Module's own submodules (e.g. nn.Sequential(self.layers[0], self.layers[1]))."
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
