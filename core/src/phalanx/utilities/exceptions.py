"""Lightning's exception names, for ported ``except`` clauses.

``from lightning.pytorch.utilities.exceptions import MisconfigurationException`` becomes
``from phalanx.utilities.exceptions import MisconfigurationException`` under the rename rule; it
is phalanx's :class:`~phalanx.errors.MisconfigurationError` (a ``ValueError``), the error phalanx
raises for a bad argument or setting, so a ported handler still catches configuration mistakes.
"""

from __future__ import annotations

from phalanx.errors import MisconfigurationError

__all__ = ["MisconfigurationError", "MisconfigurationException"]

MisconfigurationException = MisconfigurationError
