"""Hyperparameter and attribute helpers under Lightning's names (``lightning.pytorch.utilities.parsing``).

Two groups of helpers that ported code and callbacks call directly:

* reading constructor arguments from the call stack (:func:`get_init_args`,
  :func:`collect_init_args`, :func:`parse_class_init_keys`) and recording them
  (:func:`save_hyperparameters`, the function form of ``Module.save_hyperparameters``);
* finding a setting wherever a user keeps it (:func:`lightning_getattr` & co.): on the Module, in
  its ``hparams``, on the DataModule or in the DataModule's ``hparams``, as the tuner's
  ``batch_size`` / ``lr`` search does.
"""

from __future__ import annotations

import inspect
import pickle
import types
import warnings
from collections.abc import MutableMapping, Sequence
from typing import Any

from phalanx.hparams import AttributeDict, HyperparametersMixin

__all__ = [
    "AttributeDict",
    "clean_namespace",
    "collect_init_args",
    "get_init_args",
    "is_picklable",
    "lightning_getattr",
    "lightning_hasattr",
    "lightning_setattr",
    "parse_class_init_keys",
    "save_hyperparameters",
]


def is_picklable(obj: object) -> bool:
    """Whether ``pickle.dumps(obj)`` succeeds (checkpoints and spawned workers pickle hyperparameters)."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True


def clean_namespace(hparams: MutableMapping[str, Any]) -> None:
    """Remove, with a warning each, the entries of ``hparams`` that cannot be pickled."""
    for key in [key for key, value in hparams.items() if not is_picklable(value)]:
        warnings.warn(
            f"Hyperparameter {key!r} removed: it cannot be pickled. Fix: leave it out with "
            f"save_hyperparameters(ignore=[{key!r}]).",
            UserWarning,
            stacklevel=2,
        )
        del hparams[key]


def parse_class_init_keys(cls: type) -> tuple[str, str | None, str | None]:
    """The names ``cls.__init__`` gives to ``self``, to ``*args`` and to ``**kwargs`` (None when absent)."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())  # type: ignore[misc]
    var_positional = next((p.name for p in parameters if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    var_keyword = next((p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    return parameters[0].name, var_positional, var_keyword


def _init_frame_arguments(frame: types.FrameType) -> tuple[Any, dict[str, Any]] | None:
    """``(self, arguments)`` when ``frame`` runs an ``__init__``; ``**kwargs`` entries count as arguments."""
    code = frame.f_code
    if code.co_name != "__init__" or code.co_argcount < 1:
        return None
    local = frame.f_locals
    positional = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    var_positional = code.co_varnames[len(positional)] if code.co_flags & inspect.CO_VARARGS else None
    index = len(positional) + (1 if var_positional else 0)
    var_keyword = code.co_varnames[index] if code.co_flags & inspect.CO_VARKEYWORDS else None
    arguments = {name: local[name] for name in positional[1:] if name in local}
    if var_keyword and isinstance(local.get(var_keyword), dict):
        arguments.update(local[var_keyword])
    return local.get(positional[0]), arguments


def get_init_args(frame: types.FrameType) -> dict[str, Any]:
    """The arguments of the ``__init__`` that ``frame`` runs (``self``, ``*args`` and ``**kwargs``'s own
    name left out, ``**kwargs``'s entries included); ``{}`` for any other frame."""
    found = _init_frame_arguments(frame)
    return found[1] if found is not None else {}


def collect_init_args(
    frame: types.FrameType, path_args: list[dict[str, Any]], inside: bool = False, classes: tuple[type, ...] = ()
) -> list[dict[str, Any]]:
    """The arguments of each ``__init__`` in a ``super().__init__`` chain, base class first.

    Walks outwards from ``frame`` to the first ``__init__`` frame (of an instance of ``classes``,
    when given) and on through the consecutive ones, appending each one's arguments to
    ``path_args``; the last entry is the most derived class's call.
    """
    while frame is not None:
        found = _init_frame_arguments(frame)
        if found is not None and (not classes or isinstance(found[0], classes)):
            path_args.append(found[1])
            inside = True
        elif inside:
            break
        if frame.f_back is None:
            break
        frame = frame.f_back
    return path_args


def save_hyperparameters(
    obj: Any,
    *args: Any,
    ignore: Sequence[str] | str | None = None,
    frame: types.FrameType | None = None,
    given_hparams: dict[str, Any] | None = None,
) -> None:
    """``obj.save_hyperparameters(*args, ignore=...)`` for the ``__init__`` running in ``frame`` (the caller's).

    ``given_hparams``: record these values instead of reading the constructor call (names in
    ``args`` then select among them).

    Raises:
        TypeError: ``obj`` has no hyperparameters (it is not a Module, DataModule or other
            ``HyperparametersMixin``).
    """
    if not isinstance(obj, HyperparametersMixin):
        msg = f"save_hyperparameters needs a Module, DataModule or HyperparametersMixin; got {type(obj).__name__}"
        raise TypeError(msg)
    if frame is None:
        current = inspect.currentframe()
        frame = current.f_back if current is not None else None
    if given_hparams is None:
        obj.save_hyperparameters(*args, ignore=ignore, frame=frame)
        return
    ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
    chosen = {key: value for key, value in given_hparams.items() if key not in ignored}
    names = [arg for arg in args if isinstance(arg, str)]
    if names:
        chosen = {name: chosen[name] for name in names if name in chosen}
    obj.save_hyperparameters(chosen, frame=frame)


def _holders(model: Any, attribute: str) -> list[Any]:
    """Everything that holds ``attribute``, in Lightning's order: the Module, its hparams, the
    DataModule, the DataModule's hparams."""
    holders: list[Any] = []
    if hasattr(model, attribute):
        holders.append(model)
    hparams = getattr(model, "hparams", None)
    if isinstance(hparams, MutableMapping) and attribute in hparams:
        holders.append(hparams)
    try:
        trainer = model.trainer
    except (AttributeError, RuntimeError):  # not attached to a Trainer
        trainer = None
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    if datamodule is not None:
        if hasattr(datamodule, attribute):
            holders.append(datamodule)
        dm_hparams = getattr(datamodule, "hparams", None)
        if isinstance(dm_hparams, MutableMapping) and attribute in dm_hparams:
            holders.append(dm_hparams)
    return holders


def lightning_hasattr(model: Any, attribute: str) -> bool:
    """Whether ``attribute`` is on the Module, in its hparams, or on/in the Trainer's DataModule."""
    return bool(_holders(model, attribute))


def lightning_getattr(model: Any, attribute: str) -> Any:
    """The value of ``attribute`` from the last place that holds it (the DataModule's hparams first,
    the Module itself last), as the tuner reads ``batch_size`` or ``lr``.

    Raises:
        AttributeError: Nothing holds it; the message lists where it was looked for.
    """
    holders = _holders(model, attribute)
    if not holders:
        msg = (
            f"{attribute!r} is neither an attribute of the Module, nor in its hparams, nor on the DataModule or in "
            f"its hparams. Fix: set self.{attribute} in the Module's or the DataModule's __init__."
        )
        raise AttributeError(msg)
    holder = holders[-1]
    return holder[attribute] if isinstance(holder, MutableMapping) else getattr(holder, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any) -> None:
    """Set ``attribute`` to ``value`` everywhere :func:`lightning_getattr` would find it.

    Raises:
        AttributeError: Nothing holds it.
    """
    holders = _holders(model, attribute)
    if not holders:
        msg = (
            f"{attribute!r} is neither an attribute of the Module, nor in its hparams, nor on the DataModule or in "
            f"its hparams, so it cannot be set. Fix: define it there first."
        )
        raise AttributeError(msg)
    for holder in holders:
        if isinstance(holder, MutableMapping):
            holder[attribute] = value
        else:
            setattr(holder, attribute, value)
