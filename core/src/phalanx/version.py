"""The version of phalanx-core, in a module of its own.

Core modules that record the version (checkpoints, ``phalanx env``) import it from here rather
than from the root package: ``phalanx/__init__.py`` is the top-level façade, and a lower layer
reaching up to it would tie the layers in a loop. This module imports nothing, so reading the
version stays free. Keep it equal to ``version`` in ``core/pyproject.toml``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
