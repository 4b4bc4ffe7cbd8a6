"""``Module.load_from_checkpoint``: a model rebuilt from any strategy's checkpoint.

``Module.load_from_checkpoint(path)`` rebuilds ``cls(**saved_hyperparameters, **overrides)`` and
loads the weights, wherever they came from: a single file (single_device, ddp, FSDP "full"), or a
directory of shards (FSDP, model_parallel, DeepSpeed, a vendor's format). Directories are turned
into one portable file by the ``phalanx_convert_checkpoint`` hooks (what ``phalanx checkpoint
convert`` runs), in a temporary folder that is removed afterwards: the core answers for its own
sharded format (:mod:`phalanx.checkpoint_io.dcp`, written by fsdp, model_parallel and any vendor
strategy that uses it) and plain files, each plugin for its own layout (DeepSpeed, XLA), so a new
strategy package makes its checkpoints loadable here without this module knowing its layout.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import tempfile
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from phalanx._module_hooks import ModuleHooks
from phalanx.checkpoint_io.checks import StateDictDifferences, compare_state_dicts, shapes
from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.hparams import load_hparams_file
from phalanx.utilities.model_helpers import is_overridden

__all__ = ["TRUSTED_INSTANTIATORS", "ModelIO", "load_from_checkpoint", "read_checkpoint", "restricted_classmethod"]

_T = TypeVar("_T")


class _RestrictedClassmethod(classmethod):  # type: ignore[type-arg]
    """A classmethod that refuses to run when called through an instance.

    ``model.load_from_checkpoint(path)`` on an instance returns a *new* model and leaves ``model``
    untouched, a silent mistake; Lightning raises ``TypeError`` there, and so does this.
    """

    def __get__(self, instance: Any, owner: type | None = None) -> Any:  # type: ignore[override]
        if instance is None:
            return super().__get__(None, owner)  # a bound classmethod, as usual
        method = self.__func__
        cls = type(instance)

        @functools.wraps(method)
        def refuse(*args: Any, **kwargs: Any) -> Any:
            msg = (
                f"{cls.__name__}.{method.__name__} is a classmethod and returns a new model; it was called on an "
                f"instance, which it would leave unchanged. Fix: model = {cls.__name__}.{method.__name__}(...)."
            )
            raise TypeError(msg)

        return refuse


if TYPE_CHECKING:
    restricted_classmethod = classmethod
else:
    restricted_classmethod = _RestrictedClassmethod


class ModelIO:
    """``load_from_checkpoint`` and ``strict_loading`` (mixed into ``phalanx.Module``)."""

    #: Class-level default: None means "not set by the user", which ``load_from_checkpoint``'s
    #: ``strict`` may then decide; ``strict_loading = ...`` sets the instance's own.
    _strict_loading: bool | None = None

    @property
    def strict_loading(self) -> bool:
        """Whether loading requires the checkpoint's keys to match the model's exactly (default True).

        Read by the Trainer (``ckpt_path=...``) and by :meth:`load_from_checkpoint`; set it to False
        for a model whose checkpoints deliberately hold a subset of its weights (e.g. a frozen
        backbone left out).
        """
        return self._strict_loading in (None, True)

    @strict_loading.setter
    def strict_loading(self, value: bool) -> None:
        self._strict_loading = value

    @restricted_classmethod
    def load_from_checkpoint(
        cls: type[_T],
        checkpoint_path: Any,
        map_location: Any = None,
        hparams_file: str | os.PathLike[str] | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> _T:
        """Build the model from a checkpoint's hyperparameters and load its weights.

        Args:
            checkpoint_path: A checkpoint file, a checkpoint directory of any installed strategy
                (FSDP, model_parallel, DeepSpeed shards), an fsspec URL of a file, or an open file.
            map_location: Where tensors go, as for ``torch.load``; by default they stay on the device
                they were saved from when it exists here, else go to the CPU. The model is moved to
                the device of the loaded weights.
            hparams_file: A ``.yaml``/``.yml`` or ``.csv`` file whose hyperparameters replace the
                checkpoint's (for checkpoints saved without ``save_hyperparameters``).
            strict: Require the checkpoint's keys to match the model's; defaults to
                :attr:`strict_loading`.
            weights_only: Load with ``torch.load(weights_only=...)`` (default True). Pass False only
                for a trusted file whose hyperparameters hold other objects than plain values.
            **kwargs: ``__init__`` arguments that override (or complete) the saved hyperparameters.

        Returns:
            A new model with the checkpoint's weights, in train mode like any new module.

        Raises:
            CheckpointError: The checkpoint is missing, corrupt, unrecognised, or of another model.
            MisconfigurationError: An ``__init__`` argument is neither saved nor given, ``strict``
                contradicts ``strict_loading``, or ``hparams_file`` is unusable.
            TypeError: Called on an instance instead of the class.
        """
        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, strict, weights_only, **kwargs)


# ---------------------------------------------------------------------- load_from_checkpoint
def load_from_checkpoint(
    cls: type[_T],
    checkpoint_path: Any,
    map_location: Any = None,
    hparams_file: str | os.PathLike[str] | None = None,
    strict: bool | None = None,
    weights_only: bool | None = None,
    **kwargs: Any,
) -> _T:
    """What :meth:`ModelIO.load_from_checkpoint` does, for any Module class ``cls`` (see there).

    ``cls`` may also be a DataModule class: it is rebuilt from its own saved hyperparameters (its
    ``CHECKPOINT_HYPER_PARAMS_KEY``) and given its saved ``state_dict``, as Lightning's
    ``LightningDataModule.load_from_checkpoint`` does; ``strict`` does not apply then.
    """
    source = _describe(checkpoint_path)
    checkpoint = read_checkpoint(checkpoint_path, map_location=map_location, weights_only=weights_only)
    key = getattr(cls, "CHECKPOINT_HYPER_PARAMS_KEY", "hyper_parameters")
    if hparams_file is not None:
        checkpoint[key] = load_hparams_file(hparams_file)
    instantiator = _trusted_instantiator(cls, {**(checkpoint.get(key) or {}), **kwargs})
    init_kwargs = _init_kwargs(cls, checkpoint, kwargs, source)
    obj: Any = instantiator(cls, init_kwargs) if instantiator is not None else cls(**init_kwargs)
    if isinstance(obj, torch.nn.Module):
        return cast("_T", _restore_module(obj, checkpoint, strict=strict, source=source))
    if type(obj).__qualname__ in checkpoint:  # a DataModule: hyperparameters and its own state
        obj.load_state_dict(checkpoint[type(obj).__qualname__])
    return cast("_T", obj)


def _restore_module(model: Any, checkpoint: dict[str, Any], *, strict: bool | None, source: str) -> Any:
    """Build lazily created layers, let the Module read the checkpoint, load the weights, move to their device."""
    strict = _resolve_strict(model, strict)
    if is_overridden("configure_model", model, ModuleHooks):
        model.configure_model()
    model.on_load_checkpoint(checkpoint)
    state_dict = checkpoint["state_dict"]
    _load_weights(model, state_dict, strict=strict, source=source, saved_from=checkpoint.get("module_class"))
    device = next((value.device for value in state_dict.values() if isinstance(value, torch.Tensor)), None)
    return model.to(device) if device is not None else model


def read_checkpoint(
    checkpoint_path: Any, *, map_location: Any = None, weights_only: bool | None = None
) -> dict[str, Any]:
    """Read a checkpoint of any strategy into one dict holding the full ``"state_dict"``.

    Raises:
        CheckpointError: Missing, unreadable, refused by ``weights_only``, a directory no installed
            plugin recognises, or a file that holds no ``"state_dict"``.
    """
    location = _default_map_location if map_location is None else map_location
    safe = True if weights_only is None else weights_only
    if hasattr(checkpoint_path, "read"):
        checkpoint = _torch_load(checkpoint_path, _describe(checkpoint_path), location, safe)
    else:
        path = os.fspath(checkpoint_path).removeprefix("file://")
        if "://" in path:
            checkpoint = _read_url(path, location, safe)
        elif os.path.isdir(path):
            checkpoint = _read_directory(path, location, safe)
        elif not os.path.exists(path):
            msg = f"Checkpoint {path!r} does not exist. Fix: check the path (ModelCheckpoint's best_model_path names saved files)."
            raise CheckpointError(msg)
        else:
            checkpoint = TorchCheckpointIO().load_checkpoint(path, location, weights_only=safe)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), Mapping):
        found = sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        msg = (
            f"{_describe(checkpoint_path)!r} is not a phalanx checkpoint: it holds {found}, no 'state_dict'. "
            "Fix: pass a file written by Trainer.save_checkpoint or ModelCheckpoint (a bare state dict loads with "
            "model.load_state_dict(torch.load(path)))."
        )
        raise CheckpointError(msg)
    return checkpoint


def _read_directory(path: str, map_location: Any, weights_only: bool) -> dict[str, Any]:
    """Convert a sharded checkpoint directory (local or a URL) into a temporary portable file and read that."""
    from phalanx.discovery import decide

    with tempfile.TemporaryDirectory(prefix="phalanx-load-") as folder:
        portable = os.path.join(folder, "portable.ckpt")
        if decide("phalanx_convert_checkpoint", source=path, destination=portable) is None:
            msg = (
                f"{path!r} is a directory that no installed plugin recognises as a checkpoint. Fix: pass a "
                "checkpoint file, or the directory a strategy wrote (its plugin must be installed; see "
                "`phalanx plugins`)."
            )
            raise CheckpointError(msg)
        return TorchCheckpointIO().load_checkpoint(portable, map_location, weights_only=weights_only)


def _read_url(url: str, map_location: Any, weights_only: bool) -> Any:
    from fsspec.core import url_to_fs  # a torch dependency; imported only for URLs

    try:
        filesystem, location = url_to_fs(url)
    except ImportError as error:
        msg = f"Cannot read {url!r}: {error}. Fix: install the fsspec filesystem package it names."
        raise ImportError(msg) from error
    if filesystem.isdir(location):  # a sharded checkpoint: the format that recognises it reads it remotely
        return _read_directory(url, map_location, weights_only)
    if not filesystem.exists(location):
        msg = f"Checkpoint {url!r} does not exist. Check the URL."
        raise CheckpointError(msg)
    with filesystem.open(location, "rb") as handle:
        return _torch_load(handle, url, map_location, weights_only)


def _torch_load(handle: Any, name: str, map_location: Any, weights_only: bool) -> Any:
    try:
        return torch.load(handle, map_location=map_location, weights_only=weights_only)
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        msg = (
            f"{name!r} is not a readable checkpoint ({type(error).__name__}: {first}). It may be truncated, not "
            "written by torch.save, or hold objects weights_only=True refuses (pass weights_only=False for a trusted file)."
        )
        raise CheckpointError(msg) from error


def _default_map_location(storage: Any, location: str) -> Any:
    """Keep tensors on the device they were saved from when it exists here; else load them on the CPU."""
    device_type = location.split(":")[0]
    available = {"cpu": True, "cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(device_type)
    if available is True or (callable(available) and available()):
        return None  # torch.load's default: restore where it was saved
    return storage.cpu()


#: The ``_instantiator`` paths a checkpoint's hyperparameters may name (LightningCLI saves
#: ``phalanx.cli.instantiate_module`` there so ``load_from_checkpoint`` rebuilds the model as the config
#: did). Any other path is refused: a checkpoint naming e.g. ``os.system`` would otherwise run it. Add a
#: path here, before loading, only for checkpoints you trust.
TRUSTED_INSTANTIATORS: set[str] = {"phalanx.cli.instantiate_module"}


def _trusted_instantiator(cls: type, hyperparameters: Mapping[str, Any]) -> Any:
    """The callable a checkpoint's ``_instantiator`` names, when it is trusted; None when it names none.

    Raises:
        ValueError: The path is not in :data:`TRUSTED_INSTANTIATORS`, or its ``_class_path`` is not an
            already imported subclass of ``cls`` (importing it could run any module's code).
    """
    path = hyperparameters.get("_instantiator")
    if path is None:
        return None
    if not isinstance(path, str) or path not in TRUSTED_INSTANTIATORS:
        msg = (
            f"The instantiator {path!r} from the checkpoint is not in the allowlist of trusted instantiators "
            f"{sorted(TRUSTED_INSTANTIATORS)} and was blocked, since loading would run it. Fix: if you trust "
            "this checkpoint, add the path to phalanx.saving.TRUSTED_INSTANTIATORS before loading."
        )
        raise ValueError(msg)
    class_path = hyperparameters.get("_class_path")
    if class_path is not None and not _is_imported_subclass(class_path, cls):
        msg = (
            f"The class {class_path!r} requested by the checkpoint is not an already imported subclass of "
            f"{cls.__name__} and was blocked, since importing it could run any code. Fix: if you trust this "
            "checkpoint, import the module that defines the class before loading."
        )
        raise ValueError(msg)
    module_name, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def _is_imported_subclass(class_path: Any, cls: type) -> bool:
    if not isinstance(class_path, str) or "." not in class_path:
        return False
    module_name, _, name = class_path.rpartition(".")
    module = sys.modules.get(module_name)
    found = getattr(module, name, None) if module is not None else None
    return isinstance(found, type) and issubclass(found, cls)


def _init_kwargs(cls: type, checkpoint: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    """The keyword arguments for ``cls(...)``: saved hyperparameters, then ``overrides`` (Lightning's rules).

    Raises:
        MisconfigurationError: A required ``__init__`` argument is neither saved nor given.
    """
    key = getattr(cls, "CHECKPOINT_HYPER_PARAMS_KEY", "hyper_parameters")
    saved = dict(checkpoint.get(key) or {})
    saved.update(overrides)
    parameters = _init_parameters(cls)
    arguments = dict(saved)
    name = checkpoint.get(getattr(cls, "CHECKPOINT_HYPER_PARAMS_NAME", "hparams_name"))
    if name and name in parameters:  # saved from save_hyperparameters(config): rebuild cls(config=...)
        arguments = {name: saved}
    arguments.update(overrides)
    arguments.pop("_instantiator", None)  # how to build the object, not an argument (see _trusted_instantiator)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(cls).parameters.values()):
        arguments = {k: v for k, v in arguments.items() if k in parameters}
    missing = [n for n, p in parameters.items() if p.default is inspect.Parameter.empty and n not in arguments]
    if missing:
        raise MisconfigurationError(_missing_message(cls, missing, source, checkpoint, key))
    return arguments


def _init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """``__init__``'s parameters that can be given by keyword (not ``self``, ``*args``, ``**kwargs``)."""
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p for p in inspect.signature(cls).parameters.values() if p.kind in keyword}


def _missing_message(cls: type, missing: list[str], source: str, checkpoint: dict[str, Any], key: str) -> str:
    names = ", ".join(repr(name) for name in missing)
    example = ", ".join(f"{name}=..." for name in missing)
    saved = checkpoint.get(key)
    why = (
        f"the checkpoint saved the hyperparameters {sorted(map(str, saved))} but not {'it' if len(missing) == 1 else 'them'}"
        if saved
        else "the checkpoint holds no hyperparameters (its Module did not call self.save_hyperparameters() in __init__)"
    )
    saved_from = checkpoint.get("module_class")
    other = "" if saved_from in (None, f"{cls.__module__}.{cls.__qualname__}") else f" It was saved from {saved_from}."
    return (
        f"Cannot build {cls.__qualname__} from {source!r}: __init__ needs {names}, and {why}.{other} "
        f"Fix: pass {'it as a keyword argument' if len(missing) == 1 else 'them as keyword arguments'}, "
        f"{cls.__qualname__}.load_from_checkpoint({source!r}, {example})."
    )


def _resolve_strict(model: Any, strict: bool | None) -> bool:
    """``strict``, else the model's ``strict_loading``; a contradiction between the two is refused."""
    # Set on the instance only when the user assigned strict_loading (the class default is None). Read
    # through vars(): the attribute belongs to ModelIO, defined above, not to another component.
    explicit = vars(model).get("_strict_loading")
    if explicit is not None and strict is not None and strict != model.strict_loading:
        msg = (
            f"load_from_checkpoint(strict={strict!r}) is in conflict with {type(model).__name__}.strict_loading="
            f"{model.strict_loading!r} set by the model. Fix: pass the same value, or leave strict unset."
        )
        raise MisconfigurationError(msg)
    return bool(model.strict_loading if strict is None else strict)


def _load_weights(model: Any, state_dict: Mapping[str, Any], *, strict: bool, source: str, saved_from: Any) -> None:
    """``model.load_state_dict`` with a message that says which keys differ and what to do.

    Raises:
        CheckpointError: Differently shaped tensors, or (with ``strict``) missing/unexpected keys.
    """
    if not state_dict:
        warnings.warn(f"The state dict in {source!r} contains no parameters (it is empty).", stacklevel=3)
    differences = compare_state_dicts(shapes(model.state_dict()), shapes(state_dict))
    if differences.reshaped or (strict and differences):
        raise CheckpointError(_mismatch_message(type(model), source, saved_from, differences))
    model.load_state_dict(state_dict, strict=strict)
    if differences:
        warnings.warn(
            f"Loaded {source!r} with strict=False: model keys not in the checkpoint {differences.missing[:10]}, "
            f"checkpoint keys not in the model {differences.unexpected[:10]}.",
            stacklevel=3,
        )


def _mismatch_message(cls: type, source: str, saved_from: Any, differences: StateDictDifferences) -> str:
    origin = f" (saved from {saved_from})" if saved_from else ""
    parts = [f"The checkpoint {source!r}{origin} does not match {cls.__qualname__}: {differences.describe()}."]
    other = f"{str(saved_from).rsplit('.', 1)[-1]}.load_from_checkpoint" if saved_from else "the class that saved it"
    parts.append(
        f"Fix: load it with {other}, pass the __init__ arguments that build the same layers as keywords, or "
        "(for missing/unexpected keys only) pass strict=False to load the keys both have."
    )
    return " ".join(parts)


def _describe(checkpoint_path: Any) -> str:
    if hasattr(checkpoint_path, "read"):
        return str(getattr(checkpoint_path, "name", "<file object>"))
    return os.fspath(checkpoint_path)
