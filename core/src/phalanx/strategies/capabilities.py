"""The behaviour flags by which the Trainer treats a strategy, declared in one place.

A strategy tells the Trainer how to drive it through a few attributes (each a property or class
attribute of :class:`~phalanx.strategies.strategy.Strategy` or
:class:`~phalanx.strategies.parallel.ParallelStrategy`, documented where it is defined). This
module lists all of them with what each changes, so a vendor reads the contract on one page
(docs/plugins.md, "Capabilities") and ``phalanx plugins --verbose`` shows what each installed
strategy declares. Nothing else in a strategy changes how the Trainer treats it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CAPABILITIES", "capabilities", "declared_differences"]

#: name -> what the Trainer does differently when a strategy declares it (the base class's value
#: is the default; ParallelStrategy's own flags have no meaning on a single-device strategy).
CAPABILITIES: dict[str, str] = {
    "passes_step_through": "its step methods only pass the step through: the Trainer may run "
    "optimizer.step(closure) itself (the direct step); never inherited",
    "training_step_runs_backward": "training_step already ran backward (a pipeline schedule): gradients are "
    "zeroed before the step and the returned loss is not backpropagated again",
    "handles_gradient_accumulation": "the strategy accumulates gradients itself (DeepSpeed): the loop steps "
    "every batch and does not divide the loss",
    "empty_init_on_meta": "Trainer.init_module(empty_init=True) builds on the meta device; setup allocates "
    "each shard and calls reset_parameters",
    "supports_inference_mode": "evaluation may run under torch.inference_mode(); otherwise torch.no_grad()",
    "restore_checkpoint_after_setup": "checking a checkpoint against the model is left to the strategy "
    "(its state exists only after setup: shard layouts)",
    "offload_module_on_teardown": "teardown moves the Module to CPU",
    "restore_optimizer": "the Trainer restores optimizer and scheduler states (False: the strategy does)",
    "keep_process_group_after_teardown": "teardown leaves the process group alive until exit (a sharded "
    "model outlives fit)",
    "supported_start_methods": "how the processes may start: popen re-runs the script, spawn / fork / "
    "forkserver are torch.multiprocessing's; any other start_method is refused at construction",
    "launcher_preload": "modules imported once before forking workers",
}


def capabilities(strategy: Any) -> dict[str, Any]:
    """What ``strategy`` (an instance) declares for each capability it has (ParallelStrategy's
    own are absent from a single-device strategy)."""
    return {name: getattr(strategy, name) for name in CAPABILITIES if hasattr(strategy, name)}


def declared_differences(strategy: Any) -> dict[str, Any]:
    """The capabilities where ``strategy`` differs from the base class it builds on (ParallelStrategy
    for a parallel strategy, else Strategy): what it declares beyond the defaults."""
    from phalanx.strategies.parallel import ParallelStrategy
    from phalanx.strategies.strategy import Strategy

    base = ParallelStrategy if isinstance(strategy, ParallelStrategy) else Strategy
    found = {}
    for name, value in capabilities(strategy).items():
        default = getattr(base, name, None)
        if isinstance(default, property):
            default = default.fget(strategy) if default.fget is not None else None  # the base's rule, this instance
        if value != default:
            found[name] = value
    return found
