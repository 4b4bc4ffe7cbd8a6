"""Optional logger backends: import one when a logger is built, or say exactly what to install.

TensorBoard, MLflow and Weights & Biases are heavy, optional packages (``phalanx-core[tensorboard]``,
``[mlflow]``, ``[wandb]``). ``import phalanx.loggers`` imports none of them; a logger imports its
backend when it is constructed, so a missing one fails at the line that asked for it, with one
error naming the package and the ``pip install`` that fixes it, instead of an ``AttributeError``
deep inside the first ``log_metrics`` call.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingBackendError", "import_backend"]


class MissingBackendError(ModuleNotFoundError):
    """A logger's backend package is not installed (or cannot be imported)."""


def import_backend(module: str, *, logger: str, extra: str, distribution: str) -> ModuleType:
    """Import ``module`` for ``logger``; raise :class:`MissingBackendError` naming the fix when it fails.

    Args:
        module: The module to import (``"tensorboard"``, ``"mlflow"``, ``"wandb"``).
        logger: The logger class asking, for the message (``"TensorBoardLogger"``).
        extra: The ``phalanx-core`` extra that installs it (``"tensorboard"``).
        distribution: The PyPI distribution that provides ``module`` (``"mlflow-skinny"``).

    Raises:
        MissingBackendError: ``module`` is not installed, or importing it failed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        msg = (
            f"{logger} needs the {distribution!r} package (module {module!r}), which cannot be imported: {error}. "
            f"Fix: pip install 'phalanx-core[{extra}]' (or pip install {distribution}), "
            "or choose another logger such as CSVLogger, which needs nothing extra."
        )
        raise MissingBackendError(msg, name=module) from error
