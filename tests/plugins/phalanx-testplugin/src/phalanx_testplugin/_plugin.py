"""Hook implementations; imports nothing heavy, as listing requires."""

from __future__ import annotations

from phalanx import hookimpl


@hookimpl
def phalanx_register_strategies(registry):  # type: ignore[no-untyped-def]
    registry.register(
        "counting_single_device",
        "phalanx_testplugin.strategy:CountingStrategy",
        "Single device strategy that counts optimizer steps (test plugin)",
        device="cpu",
    )


@hookimpl
def phalanx_register_checkpoint_io(registry):  # type: ignore[no-untyped-def]
    registry.register(
        "counting_torch", "phalanx_testplugin.strategy:CountingCheckpointIO", "torch IO that counts saves"
    )


@hookimpl
def phalanx_register_callbacks(registry):  # type: ignore[no-untyped-def]
    registry.register(
        "step_journal", "phalanx_testplugin.observers:StepJournal", "Journal of training steps (test plugin)"
    )


@hookimpl
def phalanx_register_loggers(registry):  # type: ignore[no-untyped-def]
    registry.register("jsonl", "phalanx_testplugin.observers:JSONLinesLogger", "Metrics as JSON lines (test plugin)")
