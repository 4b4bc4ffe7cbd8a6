"""phalanx.utilities: a torch-free façade over public modules, and is_overridden's answers."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import subprocess
import sys
from typing import Any
from unittest import mock

import pytest

import phalanx.utilities
from phalanx.utilities.model_helpers import is_overridden


def test_every_name_resolves_to_a_public_module() -> None:
    for name in phalanx.utilities.__all__:
        value = getattr(phalanx.utilities, name)
        module = value.__module__
        private = [part for part in module.split(".") if part.startswith("_")]
        assert module.startswith("phalanx.") and not private, f"{name} comes from {module}"
        assert getattr(importlib.import_module(module), name) is value


def test_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(AttributeError, match="available: LRSchedulerConfig"):
        _ = phalanx.utilities.no_such_helper  # type: ignore[attr-defined]


def test_importing_the_facade_does_not_import_torch() -> None:
    code = "import sys, phalanx.utilities; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    "old",
    [
        "phalanx._collections",
        "phalanx._optim",
        "phalanx.strategies._redirect",
        "phalanx._builtin._convert:write_portable",
    ],
)
def test_moved_code_left_no_shim_behind(old: str) -> None:
    module, _, attr = old.partition(":")
    if attr:
        assert not hasattr(importlib.import_module(module), attr)
    else:
        assert importlib.util.find_spec(module) is None


class Base:
    def hook(self) -> int:
        return 0

    def other(self) -> int:
        return 0


class Inherits(Base):
    pass


class Overrides(Base):
    def hook(self) -> int:
        return 1


def _decorated(method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return wrapper


class DecoratesTheDefault(Base):
    hook = _decorated(Base.hook)


class DecoratesItsOwn(Base):
    @_decorated
    def hook(self) -> int:
        return 2


def test_class_overrides() -> None:
    assert not is_overridden("hook", Base(), Base)
    assert not is_overridden("hook", Inherits(), Base)
    assert is_overridden("hook", Overrides(), Base)
    assert not is_overridden("other", Overrides(), Base)


def test_decorators_are_seen_through() -> None:
    assert not is_overridden("hook", DecoratesTheDefault(), Base)
    assert is_overridden("hook", DecoratesItsOwn(), Base)


def test_an_attribute_set_on_the_instance_counts() -> None:
    instance = Inherits()
    instance.hook = lambda: 3  # type: ignore[method-assign]
    assert is_overridden("hook", instance, Base)
    rebound = Inherits()
    rebound.hook = functools.partial(Base.hook, rebound)  # type: ignore[method-assign]
    assert not is_overridden("hook", rebound, Base)
    rebound.hook = Base.hook.__get__(rebound)  # type: ignore[method-assign]
    assert not is_overridden("hook", rebound, Base)


def test_mocks_count_as_what_they_wrap() -> None:
    instance = Inherits()
    instance.hook = mock.Mock(wraps=instance.hook)  # type: ignore[method-assign]
    assert not is_overridden("hook", instance, Base)
    custom = Overrides()
    custom.hook = mock.Mock(wraps=custom.hook)  # type: ignore[method-assign]
    assert is_overridden("hook", custom, Base)
    empty = Inherits()
    empty.hook = mock.Mock()  # type: ignore[method-assign]
    assert not is_overridden("hook", empty, Base)


def test_missing_instance_or_attribute_is_not_an_override() -> None:
    assert not is_overridden("hook", None, Base)
    assert not is_overridden("hook", object(), Base)
    instance = Inherits()
    instance.hook = None  # type: ignore[assignment,method-assign]
    assert not is_overridden("hook", instance, Base)


def test_a_parent_without_the_method_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"Base has no method 'nope'.*Pass the base class"):
        is_overridden("nope", Overrides(), Base)
    with pytest.raises(ValueError, match="Base has no method 'nope'"):
        is_overridden("nope", None, Base)


def test_a_wrapped_cycle_ends() -> None:
    class Loop:
        def __call__(self) -> None:
            pass

    looping = Loop()
    looping.__wrapped__ = looping  # type: ignore[attr-defined]
    instance = Inherits()
    instance.hook = looping  # type: ignore[method-assign]
    assert is_overridden("hook", instance, Base)
