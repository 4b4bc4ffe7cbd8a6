"""``lightning.pytorch.utilities.model_summary.model_summary``: the model summary table without a Trainer.

``ModelSummary(model, max_depth=1)`` here is the table itself (phalanx's
:class:`~phalanx.callbacks.model_summary.Summary`): ``str()`` of it is what the ``ModelSummary``
callback prints when fit starts. The callback of the same name is
:class:`phalanx.callbacks.ModelSummary`, as in Lightning.
"""

from __future__ import annotations

from typing import Any

from phalanx.callbacks.model_summary import (
    LEFTOVER_PARAMS_NAME,
    NOT_APPLICABLE,
    UNKNOWN_SIZE,
    LayerSummary,
    get_human_readable_count,
    summarize,
)
from phalanx.callbacks.model_summary import Summary as ModelSummary

__all__ = [
    "LEFTOVER_PARAMS_NAME",
    "NOT_APPLICABLE",
    "PARAMETER_NUM_UNITS",
    "UNKNOWN_SIZE",
    "LayerSummary",
    "ModelSummary",
    "get_formatted_model_size",
    "get_human_readable_count",
    "parse_batch_shape",
    "summarize",
]

#: The suffixes of :func:`get_human_readable_count`: ones, thousands, millions, billions, trillions.
PARAMETER_NUM_UNITS = [" ", "K", "M", "B", "T"]


def get_formatted_model_size(total_model_size: float) -> str:
    """A size in MB as the summary prints it: three decimals, thousands separated (``"1,234.568"``)."""
    return f"{total_model_size:,.3f}"


def parse_batch_shape(batch: Any) -> str | list[Any]:
    """The shape of ``batch`` as the summary's in/out size columns show it: a list per tensor, nested
    like the batch's lists and tuples, ``"?"`` for anything without a shape."""
    if hasattr(batch, "shape"):
        return list(batch.shape)
    if isinstance(batch, (list, tuple)):
        return [parse_batch_shape(item) for item in batch]
    return UNKNOWN_SIZE
