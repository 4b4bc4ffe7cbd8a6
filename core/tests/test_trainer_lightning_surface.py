"""The Trainer arguments a Lightning script uses, each with Lightning's behaviour.

fast_dev_run, num_sanity_val_steps, max_time, min_epochs/min_steps, overfit_batches, profiler,
detect_anomaly, inference_mode, reload_dataloaders_every_n_epochs, barebones, model_registry and
init_module. DataModule and hooks: test_trainer_lightning_data_hooks.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from trainer_helpers import Net, dataset, loader, quiet

from phalanx import Trainer
from phalanx.callbacks import Callback, ModelCheckpoint
from phalanx.errors import MisconfigurationError


class Recorder(Callback):
    """Records what the Trainer reports while validation and training run."""

    def __init__(self) -> None:
        self.val_batches: list[tuple[bool, int]] = []
        self.events: list[str] = []

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self.events.append("sanity_start")

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self.events.append("sanity_end")

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.val_batches.append((trainer.sanity_checking, trainer.global_step))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.events.append("train_start")


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ---------------------------------------------------------------------- fast_dev_run
@pytest.mark.parametrize(("flag", "batches"), [(True, 1), (3, 3)])
def test_fast_dev_run_runs_n_batches_and_writes_nothing(tmp_path: Any, flag: Any, batches: int) -> None:
    recorder = Recorder()
    trainer = Trainer(fast_dev_run=flag, default_root_dir=tmp_path, enable_progress_bar=False, callbacks=[recorder], max_epochs=5)
    trainer.fit(Net(), loader(), loader())
    assert trainer.global_step == batches
    assert trainer.current_epoch == 1
    assert recorder.val_batches == [(False, batches)] * batches  # no sanity check, one validation
    assert [type(logger).__name__ for logger in trainer.loggers] == ["DummyLogger"]  # as in Lightning
    assert list(tmp_path.iterdir()) == []  # no logs, no checkpoints
    assert trainer.test(trainer.lightning_module, loader(), verbose=False)


def test_fast_dev_run_rejects_negative() -> None:
    with pytest.raises(MisconfigurationError, match=r"fast_dev_run=-1.*fast_dev_run=True"):
        Trainer(fast_dev_run=-1)


# ---------------------------------------------------------------------- sanity check
def test_sanity_check_runs_first_and_leaves_no_trace() -> None:
    """Two validation batches before training (Lightning's default), flagged as sanity checking;
    training computes exactly what it computes without them."""
    recorder = Recorder()
    torch.manual_seed(0)
    model = Net(dropout=0.3)
    trainer = Trainer(**quiet(max_epochs=2, callbacks=[recorder]))
    trainer.fit(model, loader(shuffle=True), loader(n=24))
    assert recorder.events[:3] == ["sanity_start", "sanity_end", "train_start"]
    assert recorder.val_batches[:2] == [(True, 0), (True, 0)]
    assert [flag for flag, _ in recorder.val_batches[2:]] == [False] * 12  # 6 batches x 2 epochs
    torch.manual_seed(0)
    reference = Net(dropout=0.3)
    Trainer(**quiet(max_epochs=2, num_sanity_val_steps=0)).fit(reference, loader(shuffle=True), loader(n=24))
    for key, value in _weights(reference).items():
        assert torch.equal(model.state_dict()[key], value), key


def test_sanity_check_all_batches_and_off() -> None:
    recorder = Recorder()
    Trainer(**quiet(max_epochs=1, num_sanity_val_steps=-1, callbacks=[recorder])).fit(Net(), loader(n=8), loader(n=20))
    assert sum(flag for flag, _ in recorder.val_batches) == 5
    recorder = Recorder()
    Trainer(**quiet(max_epochs=1, num_sanity_val_steps=0, callbacks=[recorder])).fit(Net(), loader(n=8), loader(n=20))
    assert "sanity_start" not in recorder.events


def test_sanity_check_writes_no_checkpoint(tmp_path: Any) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
    trainer = Trainer(**quiet(max_epochs=1, limit_train_batches=0, enable_checkpointing=True, callbacks=[checkpoint]))
    with pytest.warns(UserWarning, match="limit_train_batches=0"):
        trainer.fit(Net(), loader(), loader())
    assert list(tmp_path.iterdir()) == []
    assert "val_loss" not in trainer.callback_metrics


# ---------------------------------------------------------------------- stopping
class StopAtOnce(Callback):
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer.should_stop = True


def test_min_epochs_and_min_steps_hold_off_a_stop() -> None:
    trainer = Trainer(**quiet(max_epochs=10, min_epochs=3, callbacks=[StopAtOnce()]))
    trainer.fit(Net(), loader(n=8))
    assert trainer.current_epoch == 3
    assert trainer.global_step == 6
    trainer = Trainer(**quiet(max_epochs=10, min_steps=5, callbacks=[StopAtOnce()]))
    trainer.fit(Net(), loader(n=8))
    assert trainer.global_step == 5
    trainer = Trainer(**quiet(max_epochs=10, callbacks=[StopAtOnce()]))
    trainer.fit(Net(), loader(n=8))
    assert trainer.global_step == 1


class Sleepy(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        import time

        time.sleep(0.2)
        return super().training_step(batch, batch_idx)


def test_max_time_stops_fit() -> None:
    trainer = Trainer(**quiet(max_epochs=100, max_time={"seconds": 1}))
    trainer.fit(Sleepy(), loader(n=8))
    assert 1 <= trainer.global_step < 20
    assert trainer.max_time is not None and trainer.max_time.total_seconds() == 1


@pytest.mark.parametrize("value", ["1 hour", {"weeks": "x"}, 5])
def test_max_time_invalid(value: Any) -> None:
    with pytest.raises(MisconfigurationError, match=r"max_time=.*DD:HH:MM:SS"):
        Trainer(max_time=value)


# ---------------------------------------------------------------------- data options
class BatchLog(Net):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch[0].clone())
        return super().training_step(batch, batch_idx)


def test_overfit_batches_repeats_the_first_batches_in_order() -> None:
    model = BatchLog()
    trainer = Trainer(**quiet(max_epochs=3, overfit_batches=2))
    with pytest.warns(UserWarning, match="overfit but enabled (train|val) dataloader shuffling") as record:
        trainer.fit(model, loader(shuffle=True), loader(shuffle=True))
    assert sorted({str(w.message).split()[6] for w in record if "overfit" in str(w.message)}) == ["train", "val"]
    assert isinstance(trainer.val_dataloaders.sampler, torch.utils.data.SequentialSampler)
    assert trainer.limit_train_batches == 2 and trainer.limit_val_batches == 2
    first = [dataset()[i * 4 : (i + 1) * 4][0] for i in range(2)]
    assert len(model.seen) == 6
    for i, seen in enumerate(model.seen):
        assert torch.equal(seen, first[i % 2])


class Reloading(Net):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def train_dataloader(self) -> DataLoader:
        self.calls += 1
        return loader(n=4 * self.calls)  # grows: each reload is visible in the batch count


def test_reload_dataloaders_every_n_epochs() -> None:
    model = Reloading()
    trainer = Trainer(**quiet(max_epochs=3, reload_dataloaders_every_n_epochs=1))
    trainer.fit(model)
    assert model.calls == 3
    assert trainer.global_step == 1 + 2 + 3
    model = Reloading()
    Trainer(**quiet(max_epochs=3)).fit(model)
    assert model.calls == 1


# ---------------------------------------------------------------------- torch flags
class Flags(Net):
    def __init__(self) -> None:
        super().__init__()
        self.anomaly: list[bool] = []
        self.inference: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.anomaly.append(torch.is_anomaly_enabled())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.inference.append(torch.is_inference_mode_enabled())


def test_detect_anomaly_and_inference_mode() -> None:
    model = Flags()
    Trainer(**quiet(max_epochs=1, detect_anomaly=True, num_sanity_val_steps=0)).fit(model, loader(n=8), loader(n=8))
    assert model.anomaly == [True, True] and not torch.is_anomaly_enabled()
    assert model.inference == [True, True]
    model = Flags()
    Trainer(**quiet(max_epochs=1, inference_mode=False, num_sanity_val_steps=0)).fit(model, loader(n=8), loader(n=8))
    assert model.anomaly == [False, False] and model.inference == [False, False]


# ---------------------------------------------------------------------- profiler, barebones, summary
def test_profiler_simple_reports_the_loop(capsys: Any) -> None:
    trainer = Trainer(**quiet(max_epochs=1, profiler="simple"))
    trainer.fit(Net(), loader(n=8), loader(n=8))
    out = capsys.readouterr().out
    assert "run_training_epoch" in out and "run_training_batch" in out
    assert trainer.profiler is not None


def test_profiler_invalid() -> None:
    with pytest.raises(MisconfigurationError, match=r"profiler='fast'.*'simple'"):
        Trainer(profiler="fast")


def test_barebones() -> None:
    trainer = Trainer(barebones=True, max_epochs=1)
    assert trainer.loggers == [] and trainer.checkpoint_callback is None and trainer.progress_bar_callback is None
    assert trainer.num_sanity_val_steps == 0 and trainer.barebones
    trainer.fit(Net(), loader(n=8))
    assert trainer.global_step == 2
    with pytest.raises(MisconfigurationError, match=r"barebones=True.*enable_checkpointing=True"):
        Trainer(barebones=True, enable_checkpointing=True)


def test_model_summary_printed_by_default(capsys: Any) -> None:
    Trainer(**quiet(max_epochs=1)).fit(Net(), loader(n=8))
    assert "Trainable params" in capsys.readouterr().out
    Trainer(**quiet(max_epochs=1, enable_model_summary=False)).fit(Net(), loader(n=8))
    assert "Trainable params" not in capsys.readouterr().out


def test_model_registry_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"model_registry='hub'.*ModelCheckpoint.best_model_path"):
        Trainer(model_registry="hub")


# ---------------------------------------------------------------------- init_module
class Sevens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(4, 4))  # zeros: not an init function, so never skipped
        nn.init.constant_(self.weight, 7.0)


def test_init_module_dtype_and_empty_init() -> None:
    trainer = Trainer(**quiet(precision="bf16-true"))
    with trainer.init_module():
        layer = nn.Linear(4, 4)
    assert layer.weight.dtype == torch.bfloat16
    with Trainer(**quiet()).init_module(empty_init=False):
        assert torch.equal(Sevens().weight, torch.full((4, 4), 7.0))
    with Trainer(**quiet()).init_module(empty_init=True):
        assert torch.equal(Sevens().weight, torch.zeros(4, 4))  # nn.init skipped
