"""RichModelSummary: the ModelSummary table drawn with rich (Lightning's ``RichModelSummary``).

Same content as :class:`~phalanx.callbacks.model_summary.ModelSummary` (the same Summary builds
it, global parameter counts included), rendered as a rich table followed by the totals. rich is
optional: constructing the callback without it raises one error naming ``pip install rich``.
Pass it in place of the default summary: ``Trainer(callbacks=[RichModelSummary(max_depth=2)])``.
"""

from __future__ import annotations

from typing import Any

from phalanx.callbacks._rich import require_rich
from phalanx.callbacks.model_summary import ModelSummary, get_human_readable_count

__all__ = ["RichModelSummary"]


class RichModelSummary(ModelSummary):
    """Print the model summary as a rich table on global rank 0 when fit starts.

    Args:
        max_depth: Nesting depth of the layers listed (0 turns the callback off; -1: all).
        **summarize_kwargs: ``header_style`` (default ``"bold magenta"``) and any rich ``Table`` argument.

    Raises:
        ModuleNotFoundError: rich is not installed (the message says ``pip install rich``).
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        require_rich(type(self).__name__)
        super().__init__(max_depth, **summarize_kwargs)

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
        """Print the table and the totals with rich's console."""
        from rich import get_console
        from rich.table import Table

        console = get_console()
        header_style = summarize_kwargs.pop("header_style", "bold magenta")
        table = Table(header_style=header_style, **summarize_kwargs)
        for header, _ in summary_data:
            table.add_column(header.strip() or " ", justify="right" if header.strip() == "" else "left")
        rows = len(summary_data[0][1]) if summary_data else 0
        for i in range(rows):
            table.add_row(*(str(cells[i]) for _, cells in summary_data))
        console.print(table)
        totals = [
            ("Trainable params", get_human_readable_count(trainable_parameters)),
            ("Non-trainable params", get_human_readable_count(total_parameters - trainable_parameters)),
            ("Total params", get_human_readable_count(total_parameters)),
            ("Total estimated model params size (MB)", f"{model_size:,.3f}"),
            ("Modules in train mode", str(total_training_modes["train"])),
            ("Modules in eval mode", str(total_training_modes["eval"])),
            ("Total FLOPs", get_human_readable_count(total_flops)),
        ]
        grid = Table.grid(expand=True)
        grid.add_column()
        for label, value in totals:  # Lightning's "label: value" lines
            grid.add_row(f"[bold]{label}[/]: {value.strip()}")
        console.print(grid)
