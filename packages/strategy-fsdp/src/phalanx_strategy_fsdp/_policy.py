"""Which submodules to shard (or checkpoint): a set of module classes or a predicate.

FSDP2 shards a module's parameters as one unit that is all-gathered for its forward and freed
afterwards, so the choice of units sets the peak memory: sharding each transformer block keeps only
one block unsharded at a time, sharding only the root unshards the whole model at once. Users say
which units they want either as module classes (the common case, checked against the model so a
typo fails loudly) or as a predicate for anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from phalanx.errors import MisconfigurationError

__all__ = [
    "ModuleClassPolicy",
    "ModulePredicate",
    "class_names",
    "compile_blocks",
    "matching_modules",
    "resolve_policy",
]

#: A predicate deciding, per submodule, whether the policy applies to it.
ModulePredicate = Callable[[nn.Module], bool]

_ACCEPTED = (
    "None, an nn.Module subclass, a set/list/tuple of nn.Module subclasses, a ModuleClassPolicy, "
    "or a callable taking a module and returning a bool"
)


@dataclass(frozen=True)
class ModuleClassPolicy:
    """Applies to every submodule that is an instance of one of ``classes``.

    Attributes:
        classes: The module classes, e.g. ``frozenset({TransformerBlock})``.
    """

    classes: frozenset[type[nn.Module]]

    def __call__(self, module: nn.Module) -> bool:
        return isinstance(module, tuple(self.classes))

    def check_occurs_in(self, model: nn.Module, *, option: str) -> None:
        """Fail when a class never occurs in ``model``: the option would silently do nothing.

        Raises:
            MisconfigurationError: Naming the missing classes and the classes the model does have.
        """
        present = {type(module) for module in model.modules()}
        missing = [cls for cls in self.classes if not any(issubclass(p, cls) for p in present)]
        if missing:
            names = sorted(cls.__name__ for cls in missing)
            have = sorted({cls.__name__ for cls in present})
            msg = (
                f"FSDPStrategy({option}=...) names {names}, which do(es) not occur in the model "
                f"{type(model).__name__}; its module classes are {have}. Fix: pass classes from that list."
            )
            raise MisconfigurationError(msg)


def _is_module_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, nn.Module)


def resolve_policy(value: Any, *, option: str) -> ModuleClassPolicy | ModulePredicate | None:
    """Normalise a user's policy argument; fails at construction on anything unusable.

    Also accepts torch's FSDP1 ``ModuleWrapPolicy`` (it carries its classes), so configurations
    written for Lightning's FSDPStrategy keep working.

    Raises:
        MisconfigurationError: ``value`` is none of the accepted forms (a string, a module
            instance, a set holding something other than module classes, ...).
    """
    if value is None or isinstance(value, ModuleClassPolicy):
        return value
    wrapped_classes = getattr(value, "_module_classes", None)
    if wrapped_classes is not None and not isinstance(value, type):
        value = set(wrapped_classes)
    if _is_module_class(value):
        return ModuleClassPolicy(frozenset({value}))
    if isinstance(value, (set, frozenset, list, tuple)):
        bad = [item for item in value if not _is_module_class(item)]
        if bad or not value:
            shown = f"{bad[0]!r} (type {type(bad[0]).__name__})" if bad else "an empty collection"
            msg = (
                f"FSDPStrategy({option}={value!r}) contains {shown}; every item must be an nn.Module "
                f"subclass. Accepted: {_ACCEPTED}. Fix: e.g. {option}={{nn.TransformerEncoderLayer}}."
            )
            raise MisconfigurationError(msg)
        return ModuleClassPolicy(frozenset(value))
    if callable(value) and not isinstance(value, (nn.Module, str)):
        return value  # type: ignore[no-any-return]
    msg = (
        f"FSDPStrategy({option}={value!r}) has type {type(value).__name__}, which is not a policy. "
        f"Accepted: {_ACCEPTED}. Fix: e.g. {option}={{MyBlock}}."
    )
    raise MisconfigurationError(msg)


def matching_modules(model: nn.Module, policy: ModuleClassPolicy | ModulePredicate | None) -> list[nn.Module]:
    """Submodules (the root excluded) the policy applies to, children before their parents.

    FSDP2 must shard inner units before the units that contain them, hence post-order.
    """
    if policy is None:
        return []
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            visit(child)
        if module is not model and policy(module):
            found.append(module)

    visit(model)
    return found


def class_names(policy: ModuleClassPolicy | ModulePredicate | None) -> Iterable[str]:
    """Readable form of a policy, for ``repr`` and docs."""
    if policy is None:
        return []
    if isinstance(policy, ModuleClassPolicy):
        return sorted(cls.__name__ for cls in policy.classes)
    return [getattr(policy, "__name__", repr(policy))]


def compile_blocks(
    model: nn.Module,
    policy: ModuleClassPolicy | ModulePredicate | None,
    compile_kwargs: dict[str, Any],
    *,
    strategy: Any,
) -> int:
    """Regional compile: compile the ``forward`` of every block ``policy`` names, after sharding.

    Raises:
        MisconfigurationError: A class of the policy does not occur in the model.
    """
    if policy is None:
        return 0
    if isinstance(policy, ModuleClassPolicy):
        policy.check_occurs_in(model, option="compile_policy")
    from phalanx.utilities.compile import compile_modules

    return compile_modules(
        matching_modules(model, policy),
        strategy_name=strategy.strategy_name or type(strategy).__name__,
        is_global_zero=strategy.is_global_zero,
        **compile_kwargs,
    )
