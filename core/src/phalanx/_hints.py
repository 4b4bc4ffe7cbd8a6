"""Which distribution provides a well-known name, for error messages only.

The core never imports a plugin; but when a user asks for ``strategy="fsdp"`` without the plugin
installed, "unknown strategy" is a poor answer. This table lets the error say which package to
install. It is consulted only after a lookup failed, and only for the message.
"""

from __future__ import annotations

__all__ = ["install_hint", "providing_distribution"]

# Name prefixes of the first-party plugin packages, longest match wins.
_NAME_PREFIXES: dict[str, str] = {
    "ddp": "phalanx-strategy-ddp",
    "fsdp": "phalanx-strategy-fsdp",
    "deepspeed": "phalanx-strategy-deepspeed",
    "xla": "phalanx-strategy-xla",
    "single_xla": "phalanx-strategy-xla",
    "tpu": "phalanx-strategy-xla",
}

_CLASS_NAMES: dict[str, str] = {
    "DDPStrategy": "phalanx-strategy-ddp",
    "FSDPStrategy": "phalanx-strategy-fsdp",
    "DeepSpeedStrategy": "phalanx-strategy-deepspeed",
    "XLAStrategy": "phalanx-strategy-xla",
    "SingleDeviceXLAStrategy": "phalanx-strategy-xla",
    "XLAFSDPStrategy": "phalanx-strategy-xla",
    "XLAAccelerator": "phalanx-strategy-xla",
}


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
    folder = distribution.removeprefix("phalanx-")
    return f"pip install {distribution} (from a checkout: pip install ./packages/{folder})"
