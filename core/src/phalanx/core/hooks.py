"""``lightning.pytorch.core.hooks``: the hook mixins a :class:`~phalanx.Module` is made of.

``ModelHooks`` (lifecycle, batch and optimizer hooks), ``DataHooks`` (data setup, the dataloader
methods, the batch-transfer hooks) and ``CheckpointHooks`` (``on_save_checkpoint`` /
``on_load_checkpoint``), each with Lightning's empty defaults. ``phalanx.Module`` inherits all
three, so ``isinstance(model, ModelHooks)`` and ``is_overridden(name, model, DataHooks)`` answer as
in Lightning. :class:`~phalanx.DataModule` does not inherit ``DataHooks``: phalanx runs the batch
transfer hooks of the Module only (docs/migrating-from-lightning.md).
"""

from __future__ import annotations

from phalanx._module_hooks import CheckpointHooks, DataHooks, ModelHooks

__all__ = ["CheckpointHooks", "DataHooks", "ModelHooks"]
