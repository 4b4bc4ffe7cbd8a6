"""What every conformance kit shares: opting out of a check, resolving the plugin under test.

A kit is a pytest base class. The plugin author names the plugin in a class attribute, either as
the name a ``_plugin.py`` registers (then the kit also checks the registration) or as a class or
factory (a plugin registered by import, or one configuration of it); the kit builds a fresh
instance for every check, so no check sees what another one left in the object.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pytest

__all__ = ["ConformanceKit", "build", "environment_diff", "import_paths", "import_spec", "target_spec"]

#: Variables others set in the test process: pytest's bookkeeping, torch when it imports inductor.
_NOT_OURS = frozenset({"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"})


def build(value: Any, registry: Any, params: Mapping[str, Any], *, what: str) -> Any:
    """A fresh instance of the plugin named by ``value``: a registered name, a class or a factory.

    Raises:
        TypeError: ``value`` is empty or neither a name nor callable; the message names the
            attribute to set.
    """
    if isinstance(value, str) and value:
        return registry.get(value, **params)
    if callable(value):
        return value(**params)
    msg = f"{what}={value!r} is not usable: set the class attribute `{what}` to the registered name, a class or a factory."
    raise TypeError(msg)


def target_spec(value: Any) -> str:
    """``value`` as a ``"module:qualname"`` a fresh process can import (names stay names).

    The generated scripts run in other processes; a class defined in the author's test module
    reaches them through this spec and the test process's ``sys.path`` (see :func:`import_spec`).
    """
    if isinstance(value, str):
        return value
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not module or "<locals>" in qualname:
        msg = (
            f"{value!r} cannot be imported by another process (it is defined inside a function); "
            "define the class or factory at module level, or register it and pass its name."
        )
        raise TypeError(msg)
    return f"{module}:{qualname}"


def import_spec(spec: str) -> Any:
    """Import what :func:`target_spec` described."""
    import importlib

    module, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def import_paths() -> list[str]:
    """This process's import path, for a generated script that imports the author's test module."""
    return [entry for entry in sys.path if entry and os.path.isdir(entry)]


@pytest.mark.phalanx_conformance
class ConformanceKit:
    """Shared behaviour of the kits: opt-out flags and the unchanged-environment guard.

    Subclasses fill :attr:`_OPT_OUTS` (test name -> the boolean class attribute that turns it off);
    the phalanx pytest plugin deselects an opted-out check through :meth:`opted_out`, as for
    :class:`~phalanx.testing.StrategyConformance`.
    """

    _OPT_OUTS: ClassVar[dict[str, str]] = {}

    @classmethod
    def opted_out(cls, test_name: str) -> str | None:
        """The flag that turns ``test_name`` off for this class, or None."""
        flag = cls._OPT_OUTS.get(test_name)
        return flag if flag is not None and not getattr(cls, flag) else None

    @pytest.fixture(autouse=True)
    def _conformance_guard(self, request: pytest.FixtureRequest) -> Iterator[None]:
        """Skip an opted-out check the plugin did not deselect; fail when a check changed ``os.environ``."""
        flag = self.opted_out(request.node.originalname)
        if flag is not None:
            pytest.skip(f"{type(self).__name__}.{flag} = False")
        before = dict(os.environ)
        yield
        changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)} - _NOT_OURS
        for key in changed:
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)
        assert not changed, (
            f"the test process's environment changed: {sorted(changed)}; a plugin must not leave variables set"
        )


def environment_diff(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Names of variables added, removed or changed between two snapshots of ``os.environ``."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and k not in _NOT_OURS)
