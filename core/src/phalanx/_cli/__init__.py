"""The pieces of the ``phalanx`` command; :mod:`phalanx.cli` wires them into one parser.

Private to the core: the command line is the public interface, not these modules.
"""

from __future__ import annotations

__all__: list[str] = []
