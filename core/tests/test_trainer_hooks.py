"""Hooks run in Lightning's order, callbacks before the Module, for every entry point."""

from __future__ import annotations

from typing import Any

import torch
from trainer_helpers import Net, loader, quiet

from phalanx._module_hooks import CheckpointHooks, DataHooks, ModelHooks, ModuleHooks
from phalanx.callbacks.callback import Callback
from phalanx.trainer.trainer import Trainer

_MODULE_HOOKS = [
    name
    for hooks in (ModelHooks, DataHooks, CheckpointHooks, ModuleHooks)
    for name in vars(hooks)
    if (name.startswith("on_") or name in ("setup", "teardown", "configure_model", "prepare_data"))
]
_EXTRA = [
    "on_before_batch_transfer",
    "on_after_batch_transfer",
    "configure_optimizers",
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_gradient_clipping",
    "training_step",
    "validation_step",
    "test_step",
    "predict_step",
]


class HookModel(Net):
    """Records every hook and step call."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls
        for name in _MODULE_HOOKS + _EXTRA:
            original = getattr(self, name)

            def wrapper(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
                self.calls.append(_name)
                return _original(*args, **kwargs)

            object.__setattr__(self, name, wrapper)


class HookCallback(Callback):
    """Records every callback hook with a ``Callback.`` prefix."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        for name in vars(Callback):
            if name.startswith("on_") or name in ("setup", "teardown"):

                def wrapper(*args: Any, _name: str = name, **kwargs: Any) -> None:
                    self.calls.append(f"Callback.{_name}")

                setattr(self, name, wrapper)


class _Tracking(HookCallback):
    pass


# the Trainer binds only hooks a callback class overrides; give the recorder real overrides
for _name in [n for n in vars(Callback) if n.startswith("on_") or n in ("setup", "teardown")]:
    setattr(_Tracking, _name, lambda self, *a, _n=_name, **k: self.calls.append(f"Callback.{_n}"))


def _batch(index: int, *, with_val: bool = False) -> list[str]:
    return [
        "on_before_batch_transfer",
        "on_after_batch_transfer",
        "Callback.on_train_batch_start",
        "on_train_batch_start",
        "optimizer_step",
        "training_step",
        "Callback.on_before_zero_grad",
        "on_before_zero_grad",
        "optimizer_zero_grad",
        "Callback.on_before_backward",
        "on_before_backward",
        "Callback.on_after_backward",
        "on_after_backward",
        "Callback.on_before_optimizer_step",
        "on_before_optimizer_step",
        "configure_gradient_clipping",
        "Callback.on_train_batch_end",
        "on_train_batch_end",
    ]


_VALIDATION = [
    "on_validation_model_eval",
    "Callback.on_validation_start",
    "on_validation_start",
    "Callback.on_validation_epoch_start",
    "on_validation_epoch_start",
    "on_before_batch_transfer",
    "on_after_batch_transfer",
    "Callback.on_validation_batch_start",
    "on_validation_batch_start",
    "validation_step",
    "Callback.on_validation_batch_end",
    "on_validation_batch_end",
    "Callback.on_validation_epoch_end",
    "on_validation_epoch_end",
    "Callback.on_validation_end",
    "on_validation_end",
    "on_validation_model_train",
]


def _strip_transfer_hooks(calls: list[str]) -> list[str]:
    return [c for c in calls if c not in ("transfer_batch_to_device",)]


def test_fit_hook_order() -> None:
    calls: list[str] = []
    model = HookModel(calls)
    trainer = Trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        gradient_clip_val=1.0,
        callbacks=[_Tracking(calls)],
        **quiet(),
    )
    trainer.fit(model, loader(), loader(n=4))
    expected = [
        "prepare_data",
        "Callback.setup",
        "setup",
        "configure_optimizers",
        "Callback.on_fit_start",
        "on_fit_start",
        "Callback.on_sanity_check_start",
        *_VALIDATION,
        "Callback.on_sanity_check_end",
        "Callback.on_train_start",
        "on_train_start",
        "Callback.on_train_epoch_start",
        "on_train_epoch_start",
        *_batch(0),
        *_batch(1),
        "on_validation_model_zero_grad",
        *_VALIDATION,
        "Callback.on_train_epoch_end",
        "on_train_epoch_end",
        "Callback.on_train_end",
        "on_train_end",
        "Callback.on_fit_end",
        "on_fit_end",
        "Callback.teardown",
        "teardown",
    ]
    assert _strip_transfer_hooks(calls) == expected


def test_accumulation_skips_step_hooks() -> None:
    calls: list[str] = []
    trainer = Trainer(
        max_epochs=1, limit_train_batches=2, accumulate_grad_batches=2, callbacks=[_Tracking(calls)], **quiet()
    )
    trainer.fit(HookModel(calls), loader())
    assert calls.count("optimizer_step") == 1
    assert calls.count("training_step") == 2
    assert calls.count("on_before_zero_grad") == 1
    assert calls.count("on_before_optimizer_step") == 1


def test_validate_test_predict_hook_order() -> None:
    calls: list[str] = []
    trainer = Trainer(
        limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1, callbacks=[_Tracking(calls)], **quiet()
    )
    model = HookModel(calls)
    trainer.validate(model, loader(n=4), verbose=False)
    assert _strip_transfer_hooks(calls) == [
        "prepare_data",
        "Callback.setup",
        "setup",
        *_VALIDATION,
        "Callback.teardown",
        "teardown",
    ]
    calls.clear()
    trainer.test(model, loader(n=4), verbose=False)
    assert [c for c in calls if "test" in c] == [
        "on_test_model_eval",
        "Callback.on_test_start",
        "on_test_start",
        "Callback.on_test_epoch_start",
        "on_test_epoch_start",
        "Callback.on_test_batch_start",
        "on_test_batch_start",
        "test_step",
        "Callback.on_test_batch_end",
        "on_test_batch_end",
        "Callback.on_test_epoch_end",
        "on_test_epoch_end",
        "Callback.on_test_end",
        "on_test_end",
        "on_test_model_train",
    ]
    calls.clear()
    trainer.predict(model, loader(n=4))
    assert [c for c in calls if "predict" in c] == [
        "on_predict_model_eval",
        "Callback.on_predict_start",
        "on_predict_start",
        "Callback.on_predict_epoch_start",
        "on_predict_epoch_start",
        "Callback.on_predict_batch_start",
        "on_predict_batch_start",
        "predict_step",
        "Callback.on_predict_batch_end",
        "on_predict_batch_end",
        "Callback.on_predict_epoch_end",
        "on_predict_epoch_end",
        "Callback.on_predict_end",
        "on_predict_end",
    ]


def test_checkpoint_hooks_and_configure_model(tmp_path: Any) -> None:
    class Lazy(Net):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[str] = []
            del self.net

        def configure_model(self) -> None:
            if not hasattr(self, "net"):
                self.events.append(f"configure_model:{torch.get_default_dtype()}")
                self.net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 1))

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["custom"] = 42

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.events.append(f"load:{checkpoint['custom']}")

    model = Lazy()
    trainer = Trainer(max_steps=1, precision="64-true", **quiet())
    trainer.fit(model, loader())
    assert model.events == ["configure_model:torch.float64"]
    assert model.net[0].weight.dtype == torch.float64
    trainer.save_checkpoint(tmp_path / "lazy.ckpt")
    restored = Lazy()
    Trainer(max_steps=2, precision="64-true", **quiet()).fit(restored, loader(), ckpt_path=tmp_path / "lazy.ckpt")
    assert restored.events == ["configure_model:torch.float64", "load:42"]


def test_a_mock_callback_records_every_hook() -> None:
    """``Mock(spec=Callback)`` records the Trainer's calls (hooks left at the no-op default are skipped otherwise)."""
    from unittest.mock import Mock

    from trainer_helpers import Net, loader

    from phalanx.callbacks import Callback
    from phalanx.trainer.trainer import Trainer

    recorder = Mock(spec=Callback)
    Trainer(accelerator="cpu", max_steps=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False).fit(Net(), loader(n=8))  # fmt: skip
    called = [call[0] for call in recorder.method_calls]
    assert called[0] == "setup" and called[-1] == "teardown"
    assert {"on_fit_start", "on_train_start", "on_train_batch_start", "on_train_batch_end", "on_fit_end"} <= set(called)


def test_evaluation_gives_each_submodule_its_own_mode_back() -> None:
    """A submodule kept in eval mode (frozen) stays so in training after validation, as in Lightning."""
    seen: list[tuple[bool, bool]] = []

    class Frozen(Net):
        def __init__(self) -> None:
            super().__init__()
            self.frozen = torch.nn.Linear(2, 2).eval()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append((self.training, self.frozen.training))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            seen.append((self.training, self.frozen.training))

    model = Frozen()
    trainer = Trainer(**quiet(max_epochs=1, limit_train_batches=2, limit_val_batches=1, val_check_interval=1))
    trainer.fit(model, loader(), loader())
    assert set(seen) == {(True, False), (False, False)} and seen[-1] == (False, False)
    trainer.validate(model, loader(), verbose=False)
    trainer.predict(model, loader())
    assert model.training and not model.frozen.training


def test_fit_loop_progress_counts_validation_batches_per_training_epoch() -> None:
    """Lightning's ``fit_loop.epoch_loop.val_loop.batch_progress``: per epoch in total, per run in current."""
    seen: list[tuple[int, int, int]] = []

    class Reads(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress
            train = trainer.fit_loop.epoch_loop.batch_progress
            seen.append((progress.total.completed, progress.current.completed, train.current.completed))

    trainer = Trainer(
        **quiet(max_epochs=2, limit_train_batches=4, limit_val_batches=3, val_check_interval=2, callbacks=[Reads()])
    )
    trainer.fit(Net(), loader(), loader())
    assert seen == [(6, 3, 4), (6, 3, 4)]  # two validations of 3 batches per epoch; the sanity check not counted
    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == 8
