"""``torch.compile`` under a strategy: unwrap, let the strategy wrap, then compile again.

``trainer.fit(torch.compile(model))`` hands the Trainer an ``OptimizedModule``. Compiling that
wrapper as it is would compile the model *before* the strategy shards or wraps it: DDP would wrap
a compiled module it cannot see into, FSDP would shard parameters the compiled graph already
captured. So, as Lightning does, the entry point takes the Module back out (torch's ``_orig_mod``, its one child) and
remembers how it was compiled (the OptimizedModule's dynamo context, which holds the backend,
mode and options exactly as given); the strategy wraps the plain Module; then :func:`reapply_compile`
compiles the Module's ``forward`` again with that same context. The wrapper's own
hooks (DDP's reducer, FSDP2's all-gathers) stay eager around the compiled code.

Regional compile (:func:`compile_modules`, torchtitan's habit) compiles each transformer block on
its own instead: every block has the same code, so one compile serves all of them, and the
per-block FSDP2 hooks stay outside the graphs.

Methods are compiled as instance attributes, so the Module's class, its parameter names and its
checkpoints are those of the eager Module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from phalanx.errors import MisconfigurationError

__all__ = [
    "COMPILED_METHODS",
    "compile_context",
    "compile_modules",
    "from_compiled",
    "reapply_compile",
    "to_uncompiled",
]

log = logging.getLogger("phalanx.compile")

#: What ``fit(torch.compile(module))`` compiles on the Module: what ``torch.compile(module)`` itself
#: compiles. The step methods stay eager: they log, append to lists and call ``float()``, which
#: would break the graph and recompile on every step (a guard on ``len(self.losses)``).
COMPILED_METHODS = ("forward",)

#: Instance attributes (kept out of ``nn.Module``'s registries) holding the compile state.
_CONTEXT = "_phalanx_compile_context"
_ORIGINALS = "_phalanx_compiled_originals"


def from_compiled(model: Any) -> Any:
    """The Module inside ``torch.compile(module)``, remembering how it was compiled.

    Anything that is not an ``OptimizedModule`` is returned unchanged. The compile is not applied
    here: the strategy applies it after wrapping (:func:`reapply_compile`).
    """
    context = getattr(model, "dynamo_ctx", None)  # only torch._dynamo's OptimizedModule has one
    if context is None or not isinstance(model, nn.Module):
        return model
    children = list(model.children())  # its one child is the compiled module (``_orig_mod``)
    original = children[0] if len(children) == 1 else None
    if original is None:
        return model
    to_uncompiled(original)  # a Module compiled by an earlier run is compiled afresh after wrapping
    original.__dict__[_CONTEXT] = context
    return original


def compile_context(module: nn.Module) -> Any:
    """The dynamo context the Module came compiled with, or None when it came uncompiled."""
    return module.__dict__.get(_CONTEXT)


def to_uncompiled(module: nn.Module) -> nn.Module:
    """Put the Module's eager methods back (undoes :func:`reapply_compile`; the context is kept)."""
    originals: dict[str, Any] = module.__dict__.pop(_ORIGINALS, {})
    for name, original in originals.items():
        if original is None:
            module.__dict__.pop(name, None)
        else:
            module.__dict__[name] = original
    return module


def reapply_compile(module: nn.Module, *, strategy_name: str, is_global_zero: bool) -> bool:
    """Compile the Module's ``forward`` with the context it came compiled with.

    Called by the strategy once it has wrapped the Module, so that the graphs see the final
    (sharded, wrapped) parameters. The first compiled call is timed and reported once, on rank 0.

    Returns:
        Whether anything was compiled (False for a Module that did not come compiled).
    """
    context = compile_context(module)
    if context is None:
        return False
    to_uncompiled(module)
    originals: dict[str, Any] = {}
    report = _FirstCall(strategy_name, is_global_zero)
    for name in COMPILED_METHODS:
        method = getattr(module, name, None)
        if method is None:
            continue
        originals[name] = module.__dict__.get(name)
        module.__dict__[name] = report.wrap(name, context(method))
    module.__dict__[_ORIGINALS] = originals
    return True


def compile_modules(
    modules: Iterable[nn.Module], *, strategy_name: str, is_global_zero: bool, **compile_kwargs: Any
) -> int:
    """Regional compile: compile each module's ``forward`` on its own (one graph per block class).

    Args:
        modules: The blocks, e.g. every ``TransformerBlock`` of the model.
        strategy_name: Named in the error should compiling fail.
        is_global_zero: Whether this rank reports the first compile's duration.
        **compile_kwargs: Passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``, ...).

    Returns:
        How many modules were compiled.
    """
    import torch

    report = _FirstCall(strategy_name, is_global_zero)
    count = 0
    for module in modules:
        module.__dict__["forward"] = report.wrap(
            f"{type(module).__name__}.forward", torch.compile(module.forward, **compile_kwargs)
        )
        count += 1
    return count


class _FirstCall:
    """Times the first compiled call and turns a compiler failure into one clear error."""

    def __init__(self, strategy_name: str, is_global_zero: bool) -> None:
        self.strategy_name = strategy_name
        self.is_global_zero = is_global_zero
        self.reported = False

    def wrap(self, name: str, compiled: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            first = not self.reported
            self.reported = True
            start = time.perf_counter()
            try:
                result = compiled(*args, **kwargs)
            except Exception as error:
                if not _is_compile_error(error):
                    raise
                cause = getattr(error, "inner_exception", None) or error
                lines = str(cause).strip().splitlines()
                msg = (
                    f"torch.compile failed under strategy={self.strategy_name!r} while compiling {name}: "
                    f"{type(cause).__name__}: {lines[0] if lines else ''}. Fix: train the "
                    "eager Module (pass it without torch.compile), compile per block instead "
                    "(the strategy's compile_policy={YourBlock}), or find the failing op with "
                    "torch.compile(model, backend='aot_eager') and TORCH_LOGS='graph_breaks'."
                )
                raise MisconfigurationError(msg) from error
            if first and self.is_global_zero:
                log.info(
                    "torch.compile under strategy=%r: first call of %s took %.2f s (compiling included)",
                    self.strategy_name,
                    name,
                    time.perf_counter() - start,
                )
            return result

        call.__wrapped__ = compiled  # type: ignore[attr-defined]
        return call


def _is_compile_error(error: BaseException) -> bool:
    """Whether ``error`` came from dynamo or a compiler backend (not from the user's own code)."""
    try:
        from torch._dynamo.exc import TorchDynamoException
    except ImportError:  # pragma: no cover - torch without dynamo
        return False
    return isinstance(error, TorchDynamoException)
