"""Where phalanx writes: local (or mounted) paths and fsspec URLs, checked where the user gives them.

Every path argument (``default_root_dir``, ``ModelCheckpoint(dirpath=)``, the loggers' ``save_dir``,
``fit(ckpt_path=)``, ``save_checkpoint``) may be a URL such as ``"s3://bucket/run"``; checkpoints
and logs then go through fsspec (see ``phalanx.checkpoint_io.storage``). Handed to ``os.path``,
such a URL would be a relative path: a run pointed at a bucket would fill a local folder named
``s3:`` while the bucket stays empty. So a URL whose file system is not installed is refused where
it is given, naming the package to install. ``file://`` URLs are local paths.
"""

from __future__ import annotations

import os
import re
from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = [
    "check_filesystem",
    "check_path",
    "filesystem",
    "is_remote",
    "join",
    "parent_and_name",
    "remote_error",
    "url_scheme",
]

#: Shown first when a scheme is unknown: the stores people mean most often.
_COMMON_SCHEMES = ("s3", "gs", "az", "abfs", "hdfs", "hf", "memory", "file")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(value: Any) -> str | None:
    """The scheme of a URL (``"s3"`` for ``"s3://b/k"``), or None for a plain path."""
    found = _URL.match(os.fspath(value)) if isinstance(value, (str, os.PathLike)) else None
    return found.group(1).lower() if found else None


def is_remote(value: Any) -> bool:
    """Whether ``value`` is a URL served by fsspec rather than a local path (``file://`` is local)."""
    return url_scheme(value) not in (None, "file")


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """``base`` joined with ``parts``: ``/`` for URLs, ``os.path.join`` for local paths."""
    text = os.fspath(base)
    if not is_remote(text):
        return os.path.join(text, *parts)
    return "/".join([text.rstrip("/"), *(p.strip("/") for p in parts)])


def parent_and_name(value: str | os.PathLike[str]) -> tuple[str, str]:
    """``("s3://b/run", "last.ckpt")`` for ``"s3://b/run/last.ckpt"``; ``os.path.split`` for local paths."""
    text = os.fspath(value)
    if not is_remote(text):
        return os.path.split(text.rstrip(os.sep) or text)
    head, _, name = text.rstrip("/").rpartition("/")
    return head, name


def filesystem(value: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec file system for ``value`` and the path within it."""
    from fsspec.core import url_to_fs

    return url_to_fs(os.fspath(value), **(storage_options or {}))


def _package_for(scheme: str) -> str:
    """The pip package that provides ``scheme`` ("s3fs" for s3), from fsspec's own registry."""
    from fsspec.registry import known_implementations

    known = known_implementations.get(scheme, {})
    top = str(known.get("class", "")).split(".")[0]
    if top and top != "fsspec":
        return top
    return str(known.get("err", "")) or f"an fsspec implementation of {scheme}://"


def check_filesystem(value: str | os.PathLike[str], *, argument: str) -> None:
    """Fail now, naming the package to install, when no installed file system serves ``value``.

    Called where the user hands phalanx a URL (``Trainer(...)``, ``ModelCheckpoint(...)``, a
    logger), so a missing ``s3fs`` is one error before any training, never a local folder
    named ``s3:``.

    Raises:
        MisconfigurationError: Unknown scheme, or its implementation does not import.
    """
    scheme = url_scheme(value)
    if scheme is None or scheme == "file":
        return
    try:
        import fsspec
    except ImportError as error:
        msg = f"{argument} got {os.fspath(value)!r}, a URL; writing to URLs needs fsspec. Fix: pip install fsspec."
        raise MisconfigurationError(msg) from error
    from fsspec.registry import known_implementations, registry

    if scheme not in known_implementations and scheme not in registry:
        available = set(known_implementations) | set(registry)
        common = [name for name in _COMMON_SCHEMES if name in available]
        msg = (
            f"{argument} got {os.fspath(value)!r}: fsspec knows no file system for {scheme}://. Valid schemes "
            f"include {common} and {len(available) - len(common)} more (fsspec.available_protocols()). Fix: "
            "correct the URL (e.g. 's3://bucket/run'), or install the package that registers this scheme."
        )
        raise MisconfigurationError(msg)
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as error:
        package = _package_for(scheme)
        msg = (
            f"{argument} got {os.fspath(value)!r}, a {scheme}:// URL, but its file system is not installed "
            f"({error}). Fix: pip install {package} (or pass a local path)."
        )
        raise MisconfigurationError(msg) from error


def check_path(value: str | os.PathLike[str], *, argument: str) -> str:
    """``value`` as phalanx stores it: a local path (``file://`` stripped) or a URL fsspec can serve.

    Args:
        value: The path the user passed.
        argument: How the user passed it, for the message (``"Trainer(default_root_dir=...)"``).

    Raises:
        MisconfigurationError: A URL whose scheme no installed file system serves (e.g. ``s3://``
            without ``s3fs``); the message names the package to install.
    """
    text = os.fspath(value)
    scheme = url_scheme(text)
    if scheme is None:
        return text
    if scheme == "file":
        return text[len("file://") :]
    check_filesystem(text, argument=argument)
    return text.rstrip("/")


def remote_error(url: str, error: BaseException, *, action: str, untouched: bool = True) -> str:
    """One message for a store that failed: the URL, what phalanx was doing, the backend's words."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    kept = " The previous checkpoint is untouched." if untouched else ""
    return (
        f"Could not {action} {url!r}: {type(error).__name__}: {first}.{kept} Fix: check the URL, that the "
        "endpoint is reachable, and the store's credentials in its own configuration (e.g. AWS_ENDPOINT_URL, "
        "AWS_PROFILE or AWS_ACCESS_KEY_ID for s3://)."
    )
