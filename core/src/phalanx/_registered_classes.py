"""Lightning's class names for components a plugin package provides (``XLAPrecision``, ``XLAAccelerator``).

Lightning imports every class from one package; in phalanx some live in a plugin package that may
not be installed. A Lightning path such as ``phalanx.plugins.precision.XLAPrecision`` resolves the
name through the registries: the first registered entry whose target class has that name. When no
installed plugin provides it, the error names the distribution to install, exactly as
``from phalanx.strategies import DDPStrategy`` does. Nothing is imported until a name is asked for.
"""

from __future__ import annotations

import os

from phalanx._hints import install_hint, providing_distribution
from phalanx.errors import PluginUnavailableError
from phalanx.registry import GLOBAL_REGISTRIES, Registry

__all__ = ["registered_class"]

_DISABLE_ENV = "PHALANX_DISABLE_PLUGINS"


def registered_class(name: str, *, module: str, registries: tuple[Registry, ...] = ()) -> type:
    """The class named ``name`` that an installed plugin registered, in any registry.

    Args:
        name: A class name, e.g. ``"XLAPrecision"``.
        module: The module the name was asked from, for the messages.
        registries: Where to look (every registry when empty), e.g. the strategy registry alone.

    Raises:
        PluginUnavailableError: A known provider is not installed, or installed but not loaded (an
            ``ImportError``, so ``from module import name`` fails with the install line).
        AttributeError: No plugin is known to provide the name.
    """
    for registry in registries or GLOBAL_REGISTRIES:
        for entry in registry.entries():
            if entry.target_path.rpartition(":")[2].rpartition(".")[2] == name:
                return registry.import_class(entry.name)
    distribution = providing_distribution(name)
    if distribution is not None:
        from phalanx import _metadata

        if _metadata.version(distribution) is not None:
            msg = (
                f"cannot import {name!r} from {module!r}: {distribution} is installed but its plugin did not load "
                f"(blocked by {_DISABLE_ENV}={os.environ.get(_DISABLE_ENV, '')!r}, or it failed); fix: run "
                f"`phalanx plugins` for the reason, and remove its entry point from {_DISABLE_ENV} if it is blocked"
            )
        else:
            msg = f"cannot import {name!r} from {module!r}: it is provided by {distribution}, which is not installed; fix: {install_hint(distribution)}"
        raise PluginUnavailableError(msg, name=name)
    msg = f"module {module!r} has no attribute {name!r}"
    raise AttributeError(msg)
