"""``lightning.pytorch.core.saving``: hyperparameter files beside a checkpoint.

A logger writes the Module's hyperparameters to ``hparams.yaml`` in its log directory, and
``Module.load_from_checkpoint(path, hparams_file=...)`` reads one back. These are the functions
behind both, under Lightning's names, for scripts that write or read such files themselves: YAML
files, and the two-column ``key,value`` CSV files of older loggers. Loading a checkpoint itself is
:mod:`phalanx.saving` (``Module.load_from_checkpoint``).
"""

from __future__ import annotations

import ast
import csv
import logging
import os
import warnings
from argparse import Namespace
from collections.abc import Mapping, MutableMapping
from enum import Enum
from typing import Any

__all__ = [
    "CHECKPOINT_PAST_HPARAMS_KEYS",
    "convert",
    "load_hparams_from_tags_csv",
    "load_hparams_from_yaml",
    "save_hparams_to_tags_csv",
    "save_hparams_to_yaml",
    "update_hparams",
]

log = logging.getLogger(__name__)

#: Keys under which checkpoints of old Lightning versions kept the hyperparameters.
CHECKPOINT_PAST_HPARAMS_KEYS = ("hparams", "module_arguments")


def _open(path: str | os.PathLike[str], mode: str) -> Any:
    import fsspec  # a path may be any fsspec URL, as for every other path phalanx takes

    return fsspec.open(os.fspath(path), mode, newline="" if "b" not in mode else None)


def _exists(path: str | os.PathLike[str]) -> bool:
    from fsspec.core import url_to_fs

    filesystem, resolved = url_to_fs(os.fspath(path))
    return bool(filesystem.exists(resolved))


def _omegaconf() -> Any:
    try:
        import omegaconf
    except ImportError:
        return None
    return omegaconf


def _as_dict(hparams: Any) -> dict[str, Any]:
    if isinstance(hparams, Namespace):
        return dict(vars(hparams))
    omegaconf = _omegaconf()
    if omegaconf is not None and isinstance(hparams, omegaconf.Container):
        return dict(omegaconf.OmegaConf.to_container(hparams, resolve=True))
    if isinstance(hparams, Mapping):
        return dict(hparams)
    msg = f"hparams of type {type(hparams).__name__} cannot be written; pass a dict, an argparse.Namespace or an OmegaConf config"
    raise TypeError(msg)


def convert(val: str) -> Any:
    """A CSV cell read back as the Python literal it spells (``"0.1"`` -> ``0.1``), else the string itself."""
    try:
        return ast.literal_eval(val)
    except (ValueError, SyntaxError) as error:
        log.debug("kept %r as a string: %s", val, error)
        return val


def load_hparams_from_tags_csv(tags_csv: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``key,value`` CSV (header row first); a missing file warns and gives ``{}``."""
    if not _exists(tags_csv):
        warnings.warn(f"Missing Tags: {os.fspath(tags_csv)}.", UserWarning, stacklevel=2)
        return {}
    with _open(tags_csv, "r") as handle:
        return {row["key"]: convert(row["value"]) for row in csv.DictReader(handle, delimiter=",")}


def save_hparams_to_tags_csv(tags_csv: str | os.PathLike[str], hparams: Mapping[str, Any] | Namespace) -> None:
    """Write ``hparams`` as a ``key,value`` CSV.

    Raises:
        RuntimeError: The file's folder does not exist.
    """
    folder = os.path.dirname(os.fspath(tags_csv))
    if folder and not _exists(folder):
        msg = f"Missing folder: {folder}. Create it first, or write the file elsewhere."
        raise RuntimeError(msg)
    with _open(tags_csv, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=["key", "value"], delimiter=",")
        writer.writeheader()
        for key, value in _as_dict(hparams).items():
            writer.writerow({"key": key, "value": value})


def load_hparams_from_yaml(config_yaml: str | os.PathLike[str], use_omegaconf: bool = True) -> Any:
    """Read a YAML hyperparameter file; a missing file warns and gives ``{}``.

    With ``use_omegaconf`` and OmegaConf installed, the result is an OmegaConf ``DictConfig`` (as
    Lightning returns it); otherwise a plain dict.
    """
    import yaml

    if not _exists(config_yaml):
        warnings.warn(f"Missing Tags: {os.fspath(config_yaml)}.", UserWarning, stacklevel=2)
        return {}
    with _open(config_yaml, "r") as handle:
        hparams = yaml.full_load(handle)
    omegaconf = _omegaconf()
    if use_omegaconf and omegaconf is not None and hparams is not None:
        return omegaconf.OmegaConf.create(hparams)
    return hparams if hparams is not None else {}


def save_hparams_to_yaml(
    config_yaml: str | os.PathLike[str], hparams: Mapping[str, Any] | Namespace, use_omegaconf: bool = True
) -> None:
    """Write ``hparams`` to a YAML file, skipping (with a warning) values YAML cannot write and read back.

    An ``Enum`` value is written as its member name.

    Args:
        config_yaml: The file to write (any fsspec URL).
        hparams: A dict, an ``argparse.Namespace`` or, with OmegaConf installed, an OmegaConf config.
        use_omegaconf: Write an OmegaConf config through OmegaConf (keeps interpolations) when it is installed.

    Raises:
        RuntimeError: The file's folder does not exist.
    """
    import yaml

    folder = os.path.dirname(os.fspath(config_yaml))
    if folder and not _exists(folder):
        msg = f"Missing folder: {folder}. Create it first, or write the file elsewhere."
        raise RuntimeError(msg)
    omegaconf = _omegaconf()
    if use_omegaconf and omegaconf is not None and isinstance(hparams, omegaconf.Container):
        with _open(config_yaml, "w") as handle:
            omegaconf.OmegaConf.save(hparams, handle, resolve=True)
        return
    writable: dict[str, Any] = {}
    for key, value in _as_dict(hparams).items():
        value = value.name if isinstance(value, Enum) else value
        try:  # written only if it reads back: a lambda dumps as a name no later process can resolve
            yaml.full_load(yaml.dump(value))
        except (TypeError, ValueError, yaml.YAMLError):
            warnings.warn(
                f"Skipping {key!r} parameter because it is not possible to safely dump to YAML.",
                UserWarning,
                stacklevel=2,
            )
            continue
        writable[key] = value
    with _open(config_yaml, "w") as handle:
        yaml.dump(writable, handle)


def update_hparams(hparams: MutableMapping[str, Any], updates: Mapping[str, Any]) -> None:
    """Apply ``updates`` to ``hparams`` in place, merging nested dicts key by key instead of replacing them."""
    for key, value in updates.items():
        if key in hparams and isinstance(hparams[key], MutableMapping) and isinstance(value, Mapping):
            update_hparams(hparams[key], value)
        else:
            hparams[key] = value
