"""ModelSummary: the table of a model's layers, parameter counts and modes printed when fit starts.

It answers, before any time is spent training, "is this the model I meant": which submodules
exist, how many parameters each holds, which are frozen or left in eval mode, and how big the
weights are. :func:`summarize` builds the same table without a Trainer. The layout is Lightning's,
so logs compare line by line.

Counts are of the whole model, whatever the strategy: a DTensor parameter (FSDP2, tensor
parallel) counts its global shape, a ZeRO-3 partitioned one its ``ds_numel``, a meta-device one
its shape; the size in MB is each parameter's count times its element size.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.utilities.apply_func import move_data_to_device

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = [
    "LayerSummary",
    "ModelSummary",
    "Summary",
    "format_summary_table",
    "get_human_readable_count",
    "summarize",
]

UNKNOWN_SIZE = "?"
LEFTOVER_PARAMS_NAME = "other params"
NOT_APPLICABLE = "n/a"
_UNITS = (" ", "K", "M", "B", "T")


def _numel(param: torch.Tensor) -> int:
    """Elements of the full parameter: ZeRO-3's ``ds_numel`` when partitioned; 0 for a lazy one."""
    if isinstance(param, nn.parameter.UninitializedParameter):
        warnings.warn(
            "The model has a lazy parameter (nn.parameter.UninitializedParameter), counted as 0: set "
            "`example_input_array` on the model or run one forward pass before fit to get exact counts",
            UserWarning,
            stacklevel=3,
        )
        return 0
    partitioned = getattr(param, "ds_numel", None)
    return int(partitioned) if partitioned is not None else param.numel()


class LayerSummary:
    """One row of the table: a submodule's type, parameter count, mode and, once the example input
    ran through the model, its input and output sizes."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._in_size: Any = None
        self._out_size: Any = None
        self._handle: Any = None
        if not isinstance(module, torch.jit.ScriptModule):
            self._handle = module.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        inputs = (*args, *kwargs.values())
        self._in_size = _shape(inputs[0] if len(inputs) == 1 else inputs)
        self._out_size = _shape(output)
        self.detach_hook()

    def detach_hook(self) -> None:
        """Remove the size-recording hook (the first forward does it, or the summary when done)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    @property
    def in_size(self) -> Any:
        """Input shape(s) seen by the example forward pass, or ``"?"``."""
        return self._in_size or UNKNOWN_SIZE

    @property
    def out_size(self) -> Any:
        """Output shape(s) of the example forward pass, or ``"?"``."""
        return self._out_size or UNKNOWN_SIZE

    @property
    def layer_type(self) -> str:
        """The module's class name."""
        return type(self.module).__name__

    @property
    def num_parameters(self) -> int:
        """Parameters of the module and its children."""
        return sum(_numel(p) for p in self.module.parameters())

    @property
    def training(self) -> bool:
        """Whether the module is in train mode."""
        return self.module.training


class Summary:
    """The summary of ``model``'s submodules down to ``max_depth``; ``str()`` gives the table.

    Args:
        model: The model (a :class:`~phalanx.Module` or any ``nn.Module``). When it has an
            ``example_input_array``, it is run once on it (``torch.no_grad``, eval mode, modes
            restored after) to fill the FLOPs and in/out size columns.
        max_depth: Nesting depth shown: 1 for direct children, -1 for all, 0 for no rows.
        forward_context: Context around that forward pass (the precision's autocast).

    Raises:
        MisconfigurationError: ``max_depth`` is not an int of -1 or more.
    """

    def __init__(
        self,
        model: nn.Module,
        max_depth: int = 1,
        *,
        forward_context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            msg = f"max_depth={max_depth!r} is not a depth: pass -1 (all layers), 0 (none) or a positive int"
            raise MisconfigurationError(msg)
        self.model = model
        self.max_depth = max_depth
        self._flops = FlopCounterMode(display=False, depth=max_depth + 1)
        self._forward_context = forward_context or nullcontext
        self.example_input_array = getattr(model, "example_input_array", None)
        self.layers = self._summarize()

    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        """The summarized (name, submodule) pairs, before depth filtering."""
        if self.max_depth == 0:
            return []
        if self.max_depth == 1:
            return list(self.model.named_children())
        return list(self.model.named_modules())[1:]  # not the root

    @property
    def layer_names(self) -> list[str]:
        return list(self.layers)

    @property
    def layer_types(self) -> list[str]:
        return [layer.layer_type for layer in self.layers.values()]

    @property
    def in_sizes(self) -> list[Any]:
        return [layer.in_size for layer in self.layers.values()]

    @property
    def out_sizes(self) -> list[Any]:
        return [layer.out_size for layer in self.layers.values()]

    @property
    def param_nums(self) -> list[int]:
        return [layer.num_parameters for layer in self.layers.values()]

    @property
    def training_modes(self) -> list[bool]:
        return [layer.training for layer in self.layers.values()]

    @property
    def total_training_modes(self) -> dict[str, int]:
        """Submodules (all depths, root excluded) in train and in eval mode."""
        modes = [module.training for module in self.model.modules()][1:]
        return {"train": modes.count(True), "eval": modes.count(False)}

    @property
    def total_parameters(self) -> int:
        return sum(_numel(p) for p in self.model.parameters())

    @property
    def trainable_parameters(self) -> int:
        return sum(_numel(p) for p in self.model.parameters() if p.requires_grad)

    @property
    def total_layer_params(self) -> int:
        return sum(self.param_nums)

    @property
    def model_size(self) -> float:
        """Estimated size of the parameters in MB (10**6 bytes): elements times element size."""
        return sum(_numel(p) * p.element_size() for p in self.model.parameters()) * 1e-6

    @property
    def total_flops(self) -> int:
        """FLOPs of one forward pass on ``example_input_array`` (0 without it)."""
        return int(self._flops.get_total_flops())

    @property
    def flop_counts(self) -> dict[str, int]:
        """FLOPs per summarized layer."""
        counts = self._flops.get_flop_counts()
        root = type(self.model).__name__
        return {name: int(sum(counts.get(f"{root}.{name}", {}).values())) for name in self.layers}

    def _summarize(self) -> dict[str, LayerSummary]:
        layers = {name: LayerSummary(module) for name, module in self.named_modules}
        try:
            if self.example_input_array is not None:
                self._forward_example_input()
        finally:
            for layer in layers.values():
                layer.detach_hook()
        if self.max_depth >= 1:
            layers = {name: layer for name, layer in layers.items() if name.count(".") < self.max_depth}
        return layers

    def _forward_example_input(self) -> None:
        """One forward pass on the example input, on the model's device, in eval mode and no_grad."""
        model = self.model
        device = next(iter([*model.parameters(), *model.buffers()]), torch.empty(0)).device
        data = move_data_to_device(self.example_input_array, device)
        modes = {module: module.training for module in model.modules()}
        model.eval()
        try:
            with torch.no_grad(), self._forward_context(), self._flops:
                if isinstance(data, (list, tuple)):
                    model(*data)
                elif isinstance(data, dict):
                    model(**data)
                else:
                    model(data)
        finally:
            for module, training in modes.items():
                module.training = training

    @property
    def summary_data(self) -> list[tuple[str, list[str]]]:
        """The table's columns as (header, cells), plus an ``other params`` row for parameters
        that belong to no listed layer (e.g. held by the root module itself)."""
        flops = self.flop_counts
        columns: list[tuple[str, list[str]]] = [
            (" ", [str(i) for i in range(len(self.layers))]),
            ("Name", self.layer_names),
            ("Type", self.layer_types),
            ("Params", [get_human_readable_count(n) for n in self.param_nums]),
            ("Mode", ["train" if mode else "eval" for mode in self.training_modes]),
            ("FLOPs", [get_human_readable_count(flops[name]) for name in self.layers]),
        ]
        if self.example_input_array is not None:
            columns += [("In sizes", [str(s) for s in self.in_sizes]), ("Out sizes", [str(s) for s in self.out_sizes])]
        leftover = self.total_parameters - self.total_layer_params
        if leftover > 0:
            extra = {"": " ", "Name": LEFTOVER_PARAMS_NAME, "Params": get_human_readable_count(leftover)}
            for header, cells in columns:
                cells.append(extra.get(header.strip(), NOT_APPLICABLE))
        return columns

    def __str__(self) -> str:
        return format_summary_table(
            self.total_parameters,
            self.trainable_parameters,
            self.model_size,
            self.total_training_modes,
            self.total_flops,
            *self.summary_data,
        )

    def __repr__(self) -> str:
        return str(self)


def summarize(module: nn.Module, max_depth: int = 1) -> Summary:
    """Summarize ``module`` down to ``max_depth`` (1: direct children; -1: all; 0: totals only)."""
    return Summary(module, max_depth=max_depth)


def format_summary_table(
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
    total_flops: int,
    *columns: tuple[str, list[str]],
) -> str:
    """Lay out ``columns`` (header, cells) as the ``|``-separated table, then the totals lines."""
    rows = len(columns[0][1]) if columns else 0
    widths = [max([len(header), *(len(str(cell)) for cell in cells)]) for header, cells in columns]
    rule = "-" * (sum(widths) + 3 * (1 + len(columns)))
    lines = [" | ".join(f"{header:<{w}}" for (header, _), w in zip(columns, widths)), rule]
    lines += [" | ".join(f"{cells[i]!s:<{w}}" for (_, cells), w in zip(columns, widths)) for i in range(rows)]
    lines.append(rule)
    totals = [
        (get_human_readable_count(trainable_parameters), "Trainable params"),
        (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
        (get_human_readable_count(total_parameters), "Total params"),
        (f"{model_size:,.3f}", "Total estimated model params size (MB)"),
        (total_training_modes["train"], "Modules in train mode"),
        (total_training_modes["eval"], "Modules in eval mode"),
        (get_human_readable_count(total_flops), "Total Flops"),
    ]
    lines += [f"{value!s:<10}{label}" for value, label in totals]
    return "\n".join(lines)


def get_human_readable_count(number: float) -> str:
    """``123`` -> ``"123  "``, ``1234`` -> ``"1.2 K"``, ``2e6`` -> ``"2.0 M"``, ``4e14`` -> ``"400 T"``."""
    if number < 0:
        msg = f"get_human_readable_count({number!r}): pass a count of zero or more"
        raise ValueError(msg)
    digits = int(math.floor(math.log10(number)) + 1) if number > 0 else 1
    groups = min(math.ceil(digits / 3), len(_UNITS))
    scaled = number * 10 ** (-3 * (groups - 1))
    if groups == 1 or scaled >= 100:
        return f"{int(scaled):,d} {_UNITS[groups - 1]}"
    return f"{scaled:,.1f} {_UNITS[groups - 1]}"


def _shape(data: Any) -> Any:
    if hasattr(data, "shape"):
        return list(data.shape)
    if isinstance(data, (list, tuple)):
        return [_shape(item) for item in data]
    return UNKNOWN_SIZE


class ModelSummary(Callback):
    """Print the model summary on global rank 0 when fit starts.

    Args:
        max_depth: Nesting depth of the layers listed (0 turns the callback off; -1: all).
        **summarize_kwargs: Passed on to :meth:`summarize`, for subclasses that render differently.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        self._max_depth = max_depth
        self._summarize_kwargs = summarize_kwargs

    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Build the summary on every rank (the example forward may be a collective), print on rank 0."""
        if not self._max_depth:
            return
        precision = trainer.strategy.precision_plugin
        summary = Summary(
            trainer.lightning_module, max_depth=self._max_depth, forward_context=precision.forward_context
        )
        if trainer.is_global_zero:
            self.summarize(
                summary.summary_data,
                summary.total_parameters,
                summary.trainable_parameters,
                summary.model_size,
                summary.total_training_modes,
                total_flops=summary.total_flops,
                **self._summarize_kwargs,
            )

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        """Print the table; override to render it elsewhere (Lightning's signature)."""
        table = format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *summary_data
        )
        print(table)
