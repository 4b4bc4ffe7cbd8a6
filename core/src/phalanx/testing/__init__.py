"""Tools for plugin authors to prove their strategies behave: the conformance kit.

``StrategyConformance`` is imported lazily so that the pytest plugin (loaded into every pytest run
of an environment with phalanx installed) costs nothing until a suite uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.testing.conformance import (
        START_METHODS_CHECKED,
        ScriptResult,
        StrategyConformance,
        reference_run,
        run_command,
        run_script,
    )

__all__ = ["START_METHODS_CHECKED", "ScriptResult", "StrategyConformance", "reference_run", "run_command", "run_script"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from phalanx.testing import conformance

        return getattr(conformance, name)
    msg = f"module 'phalanx.testing' has no attribute {name!r}"
    raise AttributeError(msg)
