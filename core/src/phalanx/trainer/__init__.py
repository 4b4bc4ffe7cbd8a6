"""The Trainer and its loops; the public names are ``phalanx.Trainer`` and ``phalanx.trainer.trainer.Trainer``.

As ``lightning.pytorch.trainer`` does, the package also offers ``Trainer`` and ``seed_everything``
(``from phalanx.trainer import Trainer``), resolved on first use so that importing one of the
torch-free modules below it (``phalanx.trainer.states``) does not build the Trainer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.trainer.trainer import Trainer
    from phalanx.utilities.seed import seed_everything

__all__ = ["Trainer", "seed_everything"]

_WHERE = {"Trainer": "phalanx.trainer.trainer", "seed_everything": "phalanx.utilities.seed"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    msg = f"module 'phalanx.trainer' has no attribute {name!r}"
    raise AttributeError(msg)
