"""``"float8"``: Linear layers compute their matmuls in float8 through torchao, weights stay float32.

Float8 training (torchao's ``Float8Linear``) casts a Linear's input, weight and output gradient to
float8 with a dynamic scale right before each matmul; the master weights, the optimizer and every
other op stay in float32. On GPUs with float8 tensor cores (H100 and newer) that is the speed-up;
elsewhere it runs functionally (the casts and scaled matmuls are emulated), which is what lets the
numerics be tested on a CPU. Under FSDP2 the layers are converted before ``fully_shard``, and with
``fsdp_float8_all_gather`` the weights are all-gathered as float8 (half the bytes of bf16).

This is a precision plugin, as Lightning's TransformerEngine precision is: it decides how the
module computes, and every strategy calls ``convert_module`` before wrapping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision

__all__ = ["RECIPES", "Float8Precision", "float8_config"]

#: torchao's scaling recipes: one scale per tensor, or one per row (better accuracy, newer GPUs).
RECIPES = ("tensorwise", "rowwise")

#: torchao's float8 matmuls need both dimensions of every converted weight divisible by this.
_MULTIPLE = 16


def _import_torchao() -> Any:
    try:
        import torchao.float8 as float8
    except ImportError as error:
        msg = (
            "precision='float8' converts Linear layers with torchao's Float8Linear, but the package 'torchao' is "
            f"not importable ({error}). Fix: pip install torchao (a version built for your torch), or use "
            "precision='bf16-mixed'."
        )
        raise MisconfigurationError(msg) from error
    return float8


def float8_config(recipe: str, *, fsdp_float8_all_gather: bool) -> Any:
    """torchao's ``Float8LinearConfig`` for ``recipe`` (shared with code that converts by hand)."""
    float8 = _import_torchao()
    if recipe == "rowwise":
        return float8.Float8LinearConfig.from_recipe_name("rowwise")
    return float8.Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_float8_all_gather)


class Float8Precision(Precision):
    """Linear layers in float8 (torchao), everything else float32.

    Args:
        recipe: ``"tensorwise"`` (one dynamic scale per tensor; supports the FSDP2 float8
            all-gather) or ``"rowwise"``.
        fsdp_float8_all_gather: Under FSDP2, all-gather weights as float8 (tensorwise only).
        skip: Qualified names of Linear layers to leave in float32 (e.g. ``("head",)``): layers
            whose dimensions are not multiples of 16, or a small output layer where float8's
            error matters most.
        module_filter_fn: Instead of ``skip``: ``(module, name) -> bool`` choosing the layers.

    Raises:
        MisconfigurationError: An unknown recipe; torchao missing (at construction).
    """

    precision: str = "float8"
    #: Only the module changes; backward and the optimizer step are plain PyTorch's.
    passes_step_through = True

    def __init__(
        self,
        recipe: str = "tensorwise",
        *,
        fsdp_float8_all_gather: bool = True,
        skip: Iterable[str] = (),
        module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
    ) -> None:
        if recipe not in RECIPES:
            msg = f"Float8Precision(recipe={recipe!r}) is not a torchao recipe; choose one of {list(RECIPES)}."
            raise MisconfigurationError(msg)
        _import_torchao()
        self.recipe = recipe
        self.fsdp_float8_all_gather = fsdp_float8_all_gather and recipe == "tensorwise"
        self.skip = frozenset(skip)
        self.module_filter_fn = module_filter_fn
        self.converted: list[str] = []

    def _chosen(self, module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        if self.module_filter_fn is not None:
            return bool(self.module_filter_fn(module, name))
        return name not in self.skip

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Swap the chosen Linear layers for torchao's Float8Linear (in place, before any wrapping).

        Raises:
            MisconfigurationError: A chosen layer's dimensions are not multiples of 16 (named, with
                the fix), or no Linear layer is left to convert.
        """
        chosen = [(name, m) for name, m in module.named_modules() if self._chosen(m, name)]
        bad = [(name, m) for name, m in chosen if m.in_features % _MULTIPLE or m.out_features % _MULTIPLE]
        if bad:
            shown = ", ".join(f"{name or '<root>'} ({m.in_features} -> {m.out_features})" for name, m in bad)
            skipped = tuple(name for name, _ in bad)
            msg = (
                f"precision='float8' cannot convert {shown}: float8 matmuls need in_features and out_features "
                f"divisible by {_MULTIPLE}. Fix: make those dimensions multiples of {_MULTIPLE}, or keep the layers "
                f"in float32 with precision=Float8Precision(skip={skipped!r})."
            )
            raise MisconfigurationError(msg)
        if not chosen:
            msg = (
                f"precision='float8' found no Linear layer to convert in {type(module).__name__}. Fix: use "
                "precision='32-true' or 'bf16-mixed', or check Float8Precision(skip=..., module_filter_fn=...)."
            )
            raise MisconfigurationError(msg)
        convert = {name for name, _ in chosen}
        float8 = _import_torchao()
        float8.convert_to_float8_training(
            module,
            config=float8_config(self.recipe, fsdp_float8_all_gather=self.fsdp_float8_all_gather),
            module_filter_fn=lambda _module, fqn: fqn in convert,
        )
        self.converted = sorted(convert)
        return module

    def __repr__(self) -> str:
        return (
            f"Float8Precision(recipe={self.recipe!r}, fsdp_float8_all_gather={self.fsdp_float8_all_gather!r}, "
            f"skip={sorted(self.skip)!r})"
        )
