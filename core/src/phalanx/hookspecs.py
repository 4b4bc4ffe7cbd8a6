"""The plugin contract: the hooks a phalanx plugin may implement, and how the core calls them.

A plugin is a module named by an entry point of the ``phalanx`` group. It implements any of these
hooks with ``@phalanx.hookimpl``; an implementation takes any subset of the hook's arguments, by
name. Every hook is called through pluggy's own call engine (``tryfirst`` / ``trylast`` order,
``firstresult``, wrappers), never around it.

Registration hooks (``phalanx_register_*``) receive a :class:`~phalanx.registry.Registry` and
return nothing. They are called once per plugin, for that plugin alone (pluggy's
``subset_hook_caller``), so every name is attributed to the plugin that registered it; if one
raises, everything that plugin registered is taken back and the plugin is recorded as failed.
They must not import torch or any heavy library, because listing runs them. Wrapper
implementations (``wrapper=True`` / ``hookwrapper=True``) are refused on them: called per plugin,
a wrapper would have nothing to wrap.

Decision hooks are ``firstresult``: one pluggy call, the first plugin that answers (not ``None``)
decides, and the core's built-in plugin answers last (``trylast``), so an installed plugin can
refine every "auto" choice; ``tryfirst=True`` puts a plugin ahead of the others. Wrappers are
supported on them: a ``wrapper=True`` generator ``yield``-s to receive the decision of the other
plugins and returns it, or another one (old-style ``hookwrapper=True`` works as pluggy defines).
When an implementation raises, the error names the plugin whose code raised (found in the
traceback) and how to block it; a :class:`~phalanx.errors.PhalanxError` a plugin raises on
purpose passes through unchanged.

Validation happens once, at discovery: an implementation taking an argument its hook does not
pass, or a ``@hookimpl`` whose name is not a hook below, makes that plugin "failed" with one
reason naming the hook and the fix (mark a hook of a newer core ``optionalhook=True`` to have it
ignored instead). Plugins named in ``PHALANX_DISABLE_PLUGINS`` are blocked through pluggy's
``set_blocked`` and never imported; a name they would provide is explained as blocked when asked
for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    # Both sit below the plugin machinery: neither imports this module, plugins or the planner.
    from phalanx.memory import MemoryEstimate, MemoryRequest
    from phalanx.registry import Registry

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("phalanx")
#: Marks a plugin's hook implementations; exported as ``phalanx.hookimpl``.
hookimpl = pluggy.HookimplMarker("phalanx")


@hookspec
def phalanx_register_strategies(registry: Registry) -> None:
    """Register strategy names, e.g. ``registry.register("ddp", "pkg.strategy:DDPStrategy")``."""


@hookspec
def phalanx_register_accelerators(registry: Registry) -> None:
    """Register accelerator names (``"cpu"``, ``"cuda"``, ``"xla"`` ...)."""


@hookspec
def phalanx_register_precisions(registry: Registry) -> None:
    """Register precision names (``"32-true"``, ``"bf16-mixed"`` ...)."""


@hookspec
def phalanx_register_checkpoint_io(registry: Registry) -> None:
    """Register checkpoint IO names (``"torch"``, ``"async"`` ...)."""


@hookspec
def phalanx_register_cluster_environments(registry: Registry) -> None:
    """Register cluster environments; the built-in detector tries each one's ``detect()``."""


@hookspec
def phalanx_register_callbacks(registry: Registry) -> None:
    """Register callback names, e.g. ``registry.register("early_stopping", "pkg.cb:EarlyStopping", monitor="val_loss")``.

    ``Trainer(callbacks=["early_stopping"])`` builds ``target(**init_params)``; a name whose
    target needs arguments the user must choose should register sensible defaults for them.
    """


@hookspec
def phalanx_register_loggers(registry: Registry) -> None:
    """Register logger names (``"csv"``, ``"tensorboard"`` ...).

    ``Trainer(logger="tensorboard")`` builds ``target(save_dir=default_root_dir, **init_params)``,
    so a logger class takes ``save_dir`` as Lightning's loggers do.
    """


@hookspec(firstresult=True)
def phalanx_select_accelerator() -> str | None:
    """Name the accelerator that ``accelerator="auto"`` means here, or ``None`` to pass."""


@hookspec(firstresult=True)
def phalanx_select_strategy(accelerator: str, num_devices: int, num_nodes: int, interactive: bool) -> str | None:
    """Name the strategy that ``strategy="auto"`` means for this setup, or ``None`` to pass.

    Args:
        accelerator: The resolved accelerator name.
        num_devices: Devices per node.
        num_nodes: Number of nodes.
        interactive: True in a notebook or an interactive interpreter, where scripts cannot be re-run.
    """


@hookspec(firstresult=True)
def phalanx_detect_cluster_environment() -> str | None:
    """Name the registered cluster environment this process runs in, or ``None`` to pass."""


@hookspec(firstresult=True)
def phalanx_convert_checkpoint(source: str, destination: str) -> bool | None:
    """Turn a checkpoint this plugin recognises into one portable torch file at ``destination``.

    The file holds at least ``"state_dict"`` (the full, unsharded fp32 model state dict, keyed as
    ``module.state_dict()``) and ``"phalanx_version"``; it loads with ``torch.load(weights_only=True)``
    and with ``Trainer(strategy="single_device" | "ddp").fit(..., ckpt_path=destination)`` for weights.
    Return True when converted, ``None`` when the format is not this plugin's.

    This hook is the checkpoint-format registry: ``phalanx checkpoint convert`` and
    ``Module.load_from_checkpoint`` (for a directory or a remote directory) ask it, so a format is
    usable everywhere once one plugin answers for it. Recognise from the path alone (a marker file,
    a naming rule) and return ``None`` before importing torch or the strategy's library, because
    every plugin is asked in turn. ``source`` may be an fsspec URL. The core answers last for its
    own formats: plain torch files and the sharded DCP directories of
    :mod:`phalanx.checkpoint_io.dcp`, so a strategy that saves through that module needs no
    implementation of its own.
    """


@hookspec(firstresult=True)
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """Say what one rank would hold under ``request.strategy``, or ``None`` when it is not yours.

    Called by ``phalanx plan`` and ``Trainer.plan`` once per strategy name, before anything is
    launched: ``request.model`` holds parameter shapes and dtypes read from a model built on the
    meta device (never materialised), with the activation bytes traced for a sample input when one
    was given. Answer when ``request.target`` is your strategy class (so names registered at
    runtime for your class are answered too), reading ``request.init_params`` for the variant
    (stage, offload, mesh), ``request.world_size``, ``request.precision`` and
    ``request.optimizer``. Build the answer with the shared arithmetic of :mod:`phalanx.memory`
    (``precision_bytes``, ``optimizer_state_bytes``, ``shard``), so every plugin counts alike.
    A strategy no plugin answers for is listed as "no estimate", never guessed; the conformance
    kit's memory check holds an answer to 10 % of what a real run measures.

    Args:
        request: The strategy, its target and init params, the model's shapes, devices per node,
            nodes, precision and optimizer kind.

    Returns:
        Per-rank bytes (device parts, plus CPU / NVMe when offloading), or ``None`` to pass.
    """
