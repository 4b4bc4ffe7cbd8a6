"""The hook table is the one list of hooks: Callback, Module and ``self.log`` agree with it, and
every callback hook is dispatched on both step paths (the direct step must never skip one)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.callbacks.callback import Callback
from phalanx.hooks import CALLBACK_HOOKS, HOOKS, LOG_DEFAULTS, MODULE_HOOKS, PER_BATCH_HOOKS, STEP_HOOKS
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer


def test_callback_defines_exactly_the_table_callback_hooks() -> None:
    defined = {name for name, value in vars(Callback).items() if callable(value) and not name.startswith("_")}
    defined -= {"state_dict", "load_state_dict"}
    assert defined == set(CALLBACK_HOOKS)


def test_module_defines_every_module_hook() -> None:
    assert [name for name in MODULE_HOOKS if not callable(getattr(Module, name, None))] == []


def test_table_is_consistent() -> None:
    names = [hook.name for hook in HOOKS]
    assert len(names) == len(set(names))
    assert STEP_HOOKS <= PER_BATCH_HOOKS
    assert all(LOG_DEFAULTS[name] == (True, False) for name in STEP_HOOKS)
    assert LOG_DEFAULTS["validation_step"] == (False, True) and LOG_DEFAULTS["training_step"] == (True, False)


def _data(n: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8 * n, 3, generator=g), torch.randn(8 * n, 1, generator=g)), batch_size=8)


class _Net(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.layer(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _recorder(names: tuple[str, ...] | frozenset[str]) -> tuple[Callback, Counter[str]]:
    """A Callback subclass overriding exactly ``names`` (overriding is what makes a hook live)."""
    counts: Counter[str] = Counter()

    def make(name: str) -> Any:
        def hook(self: Callback, trainer: Any, pl_module: Any, *args: Any) -> None:
            counts[name] += 1

        return hook

    cls = type("Recorder", (Callback,), {name: make(name) for name in names})
    return cls(), counts


def _run_every_stage(tmp_path: Path, callback: Callback, **trainer_args: Any) -> Trainer:
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        callbacks=[callback], **trainer_args,
    )  # fmt: skip
    trainer.fit(_Net(), _data(), _data(1))
    last = str(tmp_path / "last-resume.ckpt")
    trainer.save_checkpoint(last)
    resumed = Trainer(
        accelerator="cpu", max_epochs=2, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        callbacks=[callback], **trainer_args,
    )  # fmt: skip
    resumed.fit(_Net(), _data(), ckpt_path=last)
    resumed.validate(_Net(), _data(1), verbose=False)
    resumed.test(_Net(), _data(1), verbose=False)
    resumed.predict(_Net(), _data(1))
    return resumed


_NOT_IN_A_CLEAN_RUN = {"on_exception"}


@pytest.mark.parametrize("path", ["direct", "layered"])
def test_every_callback_hook_outside_the_step_is_called_on_both_paths(tmp_path: Path, path: str) -> None:
    names = tuple(sorted(set(CALLBACK_HOOKS) - STEP_HOOKS - _NOT_IN_A_CLEAN_RUN))
    callback, counts = _recorder(names)
    extra = {} if path == "direct" else {"gradient_clip_val": 1.0}  # clipping takes the layered step
    trainer = _run_every_stage(tmp_path, callback, **extra)
    assert trainer.fit_loop.uses_direct_step is (path == "direct")
    assert [name for name in names if counts[name] == 0] == []
    assert counts["on_train_batch_end"] == 8  # two fits of four batches


@pytest.mark.parametrize("hook", sorted(STEP_HOOKS))
def test_a_step_hook_is_never_skipped(tmp_path: Path, hook: str) -> None:
    """A callback with a step hook makes the fit take the layered step, where the hook runs per step."""
    callback, counts = _recorder((hook,))
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(_Net(), _data())
    assert not trainer.fit_loop.uses_direct_step
    assert counts[hook] == 4


def test_on_exception_is_called(tmp_path: Path) -> None:
    callback, counts = _recorder(("on_exception",))

    class _Fails(_Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise ValueError("boom")

    trainer = Trainer(accelerator="cpu", max_epochs=1, default_root_dir=tmp_path, logger=False, callbacks=[callback])
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(_Fails(), _data())
    assert counts["on_exception"] == 1
