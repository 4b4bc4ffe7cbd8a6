"""Which distribution provides a well-known name, for error messages only.

The core never imports a plugin; but when a user asks for ``strategy="fsdp"`` without the plugin
installed, "unknown strategy" is a poor answer. This table lets the error say which package to
install. It is consulted only after a lookup failed, and only for the message.

It also explains names of plugins that are installed but not loaded (blocked by
``PHALANX_DISABLE_PLUGINS``, failed, incompatible): such a plugin was never imported, so what it
would register is unknown, and :func:`likely_provider` guesses it from this table and from the
plugin's entry-point name, both read from metadata alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

TYPE_CHECKING = False  # typing's own flag, without importing typing (mypy reads this name as True)
if TYPE_CHECKING:
    from typing import TypeVar

__all__ = ["install_hint", "likely_provider", "providing_distribution"]

if TYPE_CHECKING:
    _Candidate = TypeVar("_Candidate")

# Name prefixes of the first-party plugin packages, longest match wins. Kept in step with what the
# packages register by core/tests/test_hints.py, which runs each package's own registration hooks.
_NAME_PREFIXES: dict[str, str] = {
    "ddp": "phalanx-strategy-ddp",
    "fsdp": "phalanx-strategy-fsdp",
    "hsdp": "phalanx-strategy-fsdp",
    "deepspeed": "phalanx-strategy-deepspeed",
    "model_parallel": "phalanx-strategy-model-parallel",
    "xla": "phalanx-strategy-xla",
    "single_xla": "phalanx-strategy-xla",
    "tpu": "phalanx-strategy-xla",
    "ft_": "phalanx-strategy-torchft",
    "ray": "phalanx-ray",
}

_CLASS_NAMES: dict[str, str] = {
    "DDPStrategy": "phalanx-strategy-ddp",
    "FSDPStrategy": "phalanx-strategy-fsdp",
    "DeepSpeedStrategy": "phalanx-strategy-deepspeed",
    "ModelParallelStrategy": "phalanx-strategy-model-parallel",
    "XLAStrategy": "phalanx-strategy-xla",
    "SingleDeviceXLAStrategy": "phalanx-strategy-xla",
    "XLAFSDPStrategy": "phalanx-strategy-xla",
    "XLAAccelerator": "phalanx-strategy-xla",
    "XLAPrecision": "phalanx-strategy-xla",
    "XLACheckpointIO": "phalanx-strategy-xla",
    "FTDDPStrategy": "phalanx-strategy-torchft",
    "FTHSDPStrategy": "phalanx-strategy-torchft",
    "FTDiLoCoStrategy": "phalanx-strategy-torchft",
    "RayEnvironment": "phalanx-ray",
    "RayTrainReportCallback": "phalanx-ray",
}
#: The packages/ folder of a first-party distribution not named ``phalanx-<folder>``.
_FOLDERS: dict[str, str] = {"phalanx-ray": "launcher-ray"}


def providing_distribution(name: str) -> str | None:
    """Return the distribution known to provide a registry name or class name, if any."""
    if name in _CLASS_NAMES:
        return _CLASS_NAMES[name]
    matches = [prefix for prefix in _NAME_PREFIXES if name.startswith(prefix)]
    if not matches:
        return None
    return _NAME_PREFIXES[max(matches, key=len)]


def install_hint(distribution: str) -> str:
    """The command that installs a plugin distribution from this repository or an index."""
    folder = _FOLDERS.get(distribution, distribution.removeprefix("phalanx-"))
    return f"pip install {distribution} (from a checkout: pip install ./packages/{folder})"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def likely_provider(name: str, candidates: Iterable[tuple[str, str | None, _Candidate]]) -> _Candidate | None:
    """Pick, among plugins that did not load, the one that would most likely provide ``name``.

    Args:
        name: The registry or class name that was asked for and not found.
        candidates: ``(entry point name, distribution name, payload)`` of each plugin that did not
            load; the payload of the chosen one is returned.

    A candidate matches when this table says its distribution provides ``name``, or when ``name``
    starts with its entry-point name (``"localsgd_fast"`` from entry point ``localsgd``), the
    convention every in-repo plugin follows. The longest entry-point match wins.
    """
    hinted = providing_distribution(name)
    best: tuple[int, _Candidate] | None = None
    for entry_point, distribution, payload in candidates:
        if hinted is not None and distribution is not None and _canonical(distribution) == _canonical(hinted):
            return payload
        if name.lower().startswith(entry_point.lower()) and (best is None or len(entry_point) > best[0]):
            best = (len(entry_point), payload)
    return None if best is None else best[1]
