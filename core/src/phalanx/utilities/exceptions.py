"""Lightning's exception names, for ported ``except`` clauses and ``pytest.raises``.

``from lightning.pytorch.utilities.exceptions import MisconfigurationException`` becomes
``from phalanx.utilities.exceptions import MisconfigurationException`` under the rename rule; it
is phalanx's :class:`~phalanx.errors.MisconfigurationError` (a ``ValueError``), the error phalanx
raises for a bad argument or setting (unknown names included), so a ported handler still catches
configuration mistakes. :class:`SIGTERMException` is what a preempted fit raises when it exits.
"""

from __future__ import annotations

from phalanx.errors import MisconfigurationError, SIGTERMException

__all__ = ["MisconfigurationError", "MisconfigurationException", "SIGTERMException"]

MisconfigurationException = MisconfigurationError
