"""``lightning.pytorch.utilities.model_summary``: the model summary table and its helpers.

See :mod:`.model_summary`; ``ModelSummary`` here is the table, not the callback.
"""

from __future__ import annotations

from phalanx.utilities.model_summary.model_summary import (
    LayerSummary,
    ModelSummary,
    get_formatted_model_size,
    get_human_readable_count,
    parse_batch_shape,
    summarize,
)

__all__ = [
    "LayerSummary",
    "ModelSummary",
    "get_formatted_model_size",
    "get_human_readable_count",
    "parse_batch_shape",
    "summarize",
]
