"""Hyperparameters: the ``__init__`` arguments a Module or DataModule records so it can be rebuilt.

``self.save_hyperparameters()`` inside ``__init__`` reads the arguments of the constructor call in
progress from the caller's frame (through a chain of ``super().__init__`` calls, the most derived
class's values winning), keeps them in ``self.hparams`` and a frozen copy in ``self.hparams_initial``.
The Trainer writes them into every checkpoint, which is what lets ``Module.load_from_checkpoint``
call ``cls(**hyper_parameters)`` without the user repeating them, and sends the frozen copy to the
loggers. Behaviour follows Lightning's ``save_hyperparameters``.

Torch-free and independent of ``nn.Module``: a DataModule (a plain object) uses the same mixin.
"""

from __future__ import annotations

import ast
import copy
import csv
import dataclasses
import inspect
import os
import sys
import types
import warnings
from argparse import Namespace
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = ["AttributeDict", "HyperparametersMixin", "checkpoint_hparams", "hparams_to_log", "load_hparams_file"]

_PRIMITIVES = (bool, int, float, str)


class AttributeDict(dict):  # type: ignore[type-arg]
    """A ``dict`` whose keys can also be read and written as attributes: ``hparams.lr is hparams["lr"]``.

    Missing keys raise ``AttributeError`` on attribute access (so ``hasattr`` and ``getattr`` with a
    default behave), ``KeyError`` on item access, as for any dict.
    """

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            msg = f"{type(self).__name__} has no key {key!r}; its keys are {sorted(map(str, self))}"
            raise AttributeError(msg) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        try:
            del self[key]
        except KeyError:
            msg = f"{type(self).__name__} has no key {key!r} to delete; its keys are {sorted(map(str, self))}"
            raise AttributeError(msg) from None

    def __repr__(self) -> str:
        """One ``"key": value`` line per entry, sorted and aligned, like Lightning prints hparams."""
        if not self:
            return ""
        width = max(len(str(key)) for key in self) + 3
        rows = []
        for key in sorted(self, key=str):
            label = f'"{key}":'
            rows.append(f"{label:<{width}} {self[key]}")
        return "\n".join(rows)


class HyperparametersMixin:
    """``save_hyperparameters``, ``hparams`` and ``hparams_initial`` for any class.

    The checkpoint keys are class attributes so a DataModule can store its own under other names
    (Lightning's ``"datamodule_hyper_parameters"``) next to the Module's.
    """

    #: Checkpoint key of the saved hyperparameters.
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    #: Checkpoint key of the ``__init__`` argument that received them as one dict (see below).
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    #: Checkpoint key of their container type (kept for Lightning parity; phalanx stores plain dicts).
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"
    #: Properties TorchScript must not compile (``torch.jit.script`` reads this list).
    __jit_unused_properties__: list[str] = ["hparams", "hparams_initial", "should_log_hparams"]  # noqa: RUF012

    # Class-level defaults, so the mixin needs no ``__init__`` of its own and works whatever the
    # subclass's constructor chain looks like. Assignments in methods create instance attributes.
    _log_hyperparams: bool = False
    _hparams_name: str | None = None
    # Instance attributes created on first use (declared, not set: ``hparams`` checks for them).
    _hparams: AttributeDict | MutableMapping[str, Any]
    _hparams_initial: AttributeDict | MutableMapping[str, Any]

    def save_hyperparameters(
        self,
        *args: Any,
        ignore: Sequence[str] | str | None = None,
        frame: types.FrameType | None = None,
        logger: bool = True,
    ) -> None:
        """Record the calling ``__init__``'s arguments in :attr:`hparams` (and checkpoints).

        Args:
            *args: Nothing: every ``__init__`` argument. Names of ``__init__`` arguments: only
                those. One dict, ``Namespace`` or other mutable mapping: that object's entries
                (and, when it is one of the ``__init__`` arguments, loading rebuilds the class
                with that argument set to it).
            ignore: An argument name, or names, to leave out (e.g. an ``nn.Module`` passed in,
                whose weights the checkpoint stores anyway).
            frame: The frame of the ``__init__`` to read; the caller's by default.
            logger: Send the hyperparameters to the Trainer's loggers.

        Raises:
            MisconfigurationError: A name in ``args`` is not an argument of ``__init__``, more
                than one object was given, or the object is a primitive or an unsupported type.
        """
        self._log_hyperparams = logger
        if len(args) == 1 and not args[0]:
            return  # an empty container: nothing to record (Lightning's behaviour)
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        ignored = _ignored_names(ignore)
        arguments = {name: value for name, value in _init_arguments(self, frame).items() if name not in ignored}
        selected, self._hparams_name = _select(self, args, arguments)
        self._set_hparams(selected)
        self.remove_ignored_hparams(list(ignored))
        _warn_about_modules(self.hparams)
        self._hparams_initial = copy.deepcopy(self.hparams)

    def remove_ignored_hparams(self, ignore_list: list[str]) -> None:
        """Drop ``ignore_list`` from :attr:`hparams`, e.g. what a base class saved that a subclass ignores."""
        for key in ignore_list:
            self.hparams.pop(key, None)

    def _set_hparams(self, hparams: Any) -> None:
        """Merge a dict into :attr:`hparams` (a second call adds to the first), or keep a mapping as it is."""
        hparams = _as_hparams(hparams)
        if isinstance(hparams, dict) and isinstance(self.hparams, dict):
            self.hparams.update(hparams)
        else:
            self._hparams = hparams

    @property
    def hparams(self) -> AttributeDict | MutableMapping[str, Any]:
        """The saved hyperparameters; mutable (see :attr:`hparams_initial` for the frozen copy)."""
        if "_hparams" not in vars(self):
            self._hparams = AttributeDict()
        return self._hparams

    @property
    def hparams_initial(self) -> AttributeDict | MutableMapping[str, Any]:
        """A copy of the hyperparameters as :meth:`save_hyperparameters` recorded them; changing it changes nothing."""
        initial = vars(self).get("_hparams_initial")
        return AttributeDict() if initial is None else copy.deepcopy(initial)

    @property
    def should_log_hparams(self) -> bool:
        """Whether the Trainer sends :attr:`hparams_initial` to its loggers (``save_hyperparameters(logger=...)``)."""
        return bool(self._log_hyperparams)

    def hparams_for_checkpoint(self) -> dict[str, Any]:
        """The checkpoint entries for these hyperparameters; empty when none were saved.

        The Trainer merges them into every checkpoint it writes (``checkpoint.update(...)``): the
        hyperparameters as a plain dict (so ``torch.load(weights_only=True)`` opens the file) and,
        when they were given as one ``__init__`` argument, that argument's name.
        """
        return checkpoint_hparams(self)


def checkpoint_hparams(obj: HyperparametersMixin) -> dict[str, Any]:
    """:meth:`HyperparametersMixin.hparams_for_checkpoint` of ``obj``, as the Trainer asks for it.

    A function rather than the method, so that writing a checkpoint calls none of the user's
    object's public methods (Lightning's checkpoint reads the hyperparameters the same way: a
    DataModule wrapping its methods to record calls sees only the hooks).
    """
    if not obj.hparams:
        return {}
    entries: dict[str, Any] = {obj.CHECKPOINT_HYPER_PARAMS_KEY: dict(obj.hparams)}
    # read through vars(): the attribute belongs to HyperparametersMixin, defined above
    name = vars(obj).get("_hparams_name")
    if name is not None:
        entries[obj.CHECKPOINT_HYPER_PARAMS_NAME] = name
    return entries


def hparams_to_log(module: Any, datamodule: Any = None) -> dict[str, Any] | None:
    """What the Trainer sends to ``logger.log_hyperparams``: the initial hparams of the objects that log them.

    Args:
        module: The Module (a :class:`HyperparametersMixin`).
        datamodule: The DataModule, or None.

    Returns:
        The union of the Module's and the DataModule's :attr:`~HyperparametersMixin.hparams_initial`
        (of those whose ``save_hyperparameters(logger=True)`` ran), or None when neither logs.

    Raises:
        MisconfigurationError: Both log a key with different values (the logger could show only one).
    """
    sources = [obj for obj in (module, datamodule) if isinstance(obj, HyperparametersMixin) and obj.should_log_hparams]
    if not sources:
        return None
    merged: dict[str, Any] = {}
    for obj in sources:
        initial = obj.hparams_initial
        clashing = sorted(str(key) for key in initial if key in merged and not _same(merged[key], initial[key]))
        if clashing:
            msg = (
                f"The Module and the DataModule both save the hyperparameters {clashing} with different values, "
                "so the loggers cannot record one value for each. Fix: rename one of them, or pass "
                "ignore=[...] to one save_hyperparameters call."
            )
            raise MisconfigurationError(msg)
        merged.update(initial)
    return merged


def load_hparams_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Hyperparameters from a ``.yaml``/``.yml`` file (PyYAML) or a two-column ``.csv`` (header row, then ``name,value``).

    CSV values are read as Python literals where they parse (``0.1``, ``True``, ``[1, 2]``), else as strings.

    Raises:
        MisconfigurationError: Another extension, a missing file, or PyYAML not installed for YAML.
    """
    name = os.fspath(path)
    extension = name.rsplit(".", 1)[-1].lower()
    if extension not in ("yaml", "yml", "csv"):
        msg = f"hparams_file={name!r} has an unsupported extension; pass a .yaml, .yml or .csv file."
        raise MisconfigurationError(msg)
    if not os.path.isfile(name):
        msg = f"hparams_file={name!r} does not exist. Fix: check the path (a logger writes it into its log_dir)."
        raise MisconfigurationError(msg)
    if extension == "csv":
        return _read_csv_hparams(name)
    try:
        import yaml
    except ImportError as error:
        msg = f"Reading hparams_file={name!r} needs PyYAML, which is not installed. Fix: pip install pyyaml"
        raise MisconfigurationError(msg) from error
    with open(name, encoding="utf-8") as handle:
        loaded = yaml.safe_load(handle)
    return dict(loaded or {})


def _read_csv_hparams(name: str) -> dict[str, Any]:
    with open(name, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))[1:]
    hparams: dict[str, Any] = {}
    for row in rows:
        if len(row) >= 2:
            try:
                hparams[row[0]] = ast.literal_eval(row[1])
            except (ValueError, SyntaxError):
                hparams[row[0]] = row[1]
    return hparams


# ---------------------------------------------------------------------- reading the constructor call
def _init_arguments(obj: Any, frame: types.FrameType | None) -> dict[str, Any]:
    """The arguments of ``obj``'s constructor call, merged over its ``super().__init__`` chain.

    Starting at ``frame``, walks outwards to the first ``__init__`` frame of ``obj`` and on through
    the consecutive ``__init__`` frames of ``obj`` (a subclass's ``__init__`` calling its base's).
    The outermost (most derived) class's values win. A dataclass records its init fields instead.
    """
    if dataclasses.is_dataclass(obj):
        return {field.name: getattr(obj, field.name) for field in dataclasses.fields(obj) if field.init}
    chain: list[dict[str, Any]] = []
    while frame is not None:
        arguments = _arguments_of(obj, frame)
        if arguments is not None:
            chain.append(arguments)
        elif chain:
            break
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for arguments in chain:  # innermost (base class) first, so the subclass's values win
        merged.update(arguments)
    return merged


def _arguments_of(obj: Any, frame: types.FrameType) -> dict[str, Any] | None:
    """The arguments of ``frame`` when it runs an ``__init__`` of ``obj``'s class; None otherwise.

    The values are the locals as they are now, so an argument reassigned before the call is saved
    with its new value (as in Lightning). ``**kwargs`` entries are saved as arguments of their own.
    """
    code = frame.f_code
    if code.co_name != "__init__" or code.co_argcount < 1:
        return None
    local = dict(frame.f_locals)
    if local.get(code.co_varnames[0]) is not obj:
        return None  # another object's constructor (e.g. a submodule built inside this __init__)
    init = _init_function(obj, frame)
    if init is None:
        return None
    arguments: dict[str, Any] = {}
    for index, (name, parameter) in enumerate(inspect.signature(init).parameters.items()):
        if index == 0 or parameter.kind is inspect.Parameter.VAR_POSITIONAL or name not in local:
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(local[name])
        else:
            arguments[name] = local[name]
    return arguments


def _init_function(obj: Any, frame: types.FrameType) -> Any:
    """The ``__init__`` function ``frame`` runs: found through ``__class__`` or in ``obj``'s MRO by code object."""
    owner = frame.f_locals.get("__class__")
    if isinstance(owner, type) and "__init__" in vars(owner):
        return vars(owner)["__init__"]
    for klass in type(obj).__mro__:
        init = vars(klass).get("__init__")
        if inspect.isfunction(init) and inspect.unwrap(init).__code__ is frame.f_code:
            return init
    return None


def _ignored_names(ignore: Sequence[str] | str | None) -> set[str]:
    if ignore is None:
        return set()
    if isinstance(ignore, str):
        return {ignore}
    return {name for name in ignore if isinstance(name, str)}


def _select(obj: Any, args: tuple[Any, ...], arguments: dict[str, Any]) -> tuple[Any, str | None]:
    """What to save and under which ``__init__`` argument name (``"kwargs"``: spread as keywords)."""
    if not args:
        return arguments, ("kwargs" if arguments else None)
    objects = [arg for arg in args if not isinstance(arg, str)]
    if len(objects) > 1:
        msg = (
            f"{type(obj).__qualname__}.save_hyperparameters() got {len(objects)} objects; it takes names of "
            "__init__ arguments, or one dict/Namespace. Fix: merge them into one dict, or pass the argument names."
        )
        raise MisconfigurationError(msg)
    if objects:
        given = objects[0]
        name = next((key for key, value in arguments.items() if _same(value, given)), None)
        return given, name
    unknown = [arg for arg in args if arg not in arguments]
    if unknown:
        msg = (
            f"{type(obj).__qualname__}.save_hyperparameters({', '.join(map(repr, args))}): {unknown} "
            f"{'is not an argument' if len(unknown) == 1 else 'are not arguments'} of the __init__ that called "
            f"it (arguments: {sorted(arguments)}). Fix: pass names of that __init__'s arguments, or call it "
            "without names to save all of them."
        )
        raise MisconfigurationError(msg)
    return {arg: arguments[arg] for arg in args}, "kwargs"


def _as_hparams(hparams: Any) -> Any:
    """A dict or ``Namespace`` becomes an :class:`AttributeDict`; another mutable mapping is kept."""
    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    if isinstance(hparams, dict):
        return AttributeDict(hparams)
    if isinstance(hparams, _PRIMITIVES) or not isinstance(hparams, MutableMapping):
        msg = (
            f"save_hyperparameters() got {hparams!r} (type {type(hparams).__name__}); a single object must be a dict, "
            "an argparse.Namespace or another mutable mapping. Fix: pass the argument's name as a string, "
            "e.g. save_hyperparameters('lr'), or wrap the values in a dict."
        )
        raise MisconfigurationError(msg)
    return hparams


def _same(a: Any, b: Any) -> bool:
    """Identity or equality, never raising (tensors compare element-wise and refuse ``bool``)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # any type may define == oddly; "not the same" is the safe answer
        return False


def _warn_about_modules(hparams: Mapping[str, Any]) -> None:
    """Warn when an ``nn.Module`` was saved as a hyperparameter: its weights are in the checkpoint already."""
    torch = sys.modules.get("torch")  # a Module exists only if torch was imported; never import it here
    if torch is None:
        return
    for key, value in hparams.items():
        if isinstance(value, torch.nn.Module):
            warnings.warn(
                f"Hyperparameter {key!r} is an nn.Module ({type(value).__name__}); checkpoints store its weights "
                f"anyway and pickling it into 'hyper_parameters' makes them unloadable with weights_only=True. "
                f"Fix: self.save_hyperparameters(ignore=[{key!r}]).",
                stacklevel=3,
            )
