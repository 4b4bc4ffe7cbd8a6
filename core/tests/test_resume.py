"""Stopping and resuming gives the same losses and weights, bit for bit, as never stopping."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import LossRecorder, Net, loader, quiet

import phalanx
from phalanx.callbacks.callback import Callback
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.strategies.single_device import SingleDeviceStrategy
from phalanx.trainer.trainer import Trainer


class _Crash(Exception):
    """Stands in for a preemption."""


class CrashAt(Callback):
    """Optionally save a checkpoint, then crash, after batch ``batch_idx`` of epoch ``epoch``."""

    def __init__(self, epoch: int, batch_idx: int, path: Path | None = None) -> None:
        self.epoch, self.batch_idx, self.path = epoch, batch_idx, path

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch_idx):
            if self.path is not None:
                trainer.save_checkpoint(self.path)
            raise _Crash


def _step_lr(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7), "interval": "step"}


def _model(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net(optimizer="adam", scheduler=_step_lr, dropout=0.2)


def _run(model: Net, *, callbacks: list[Callback], ckpt_path: Any = None, **kwargs: Any) -> Trainer:
    options = {"max_epochs": 3, "accumulate_grad_batches": 2, "val_check_interval": 0.5, "callbacks": callbacks}
    options.update(kwargs)
    trainer = Trainer(**quiet(**options))
    trainer.fit(model, loader(shuffle=True), loader(n=8, shuffle=True), ckpt_path=ckpt_path)
    return trainer


def _reference() -> tuple[Net, LossRecorder]:
    recorder = LossRecorder()
    model = _model(0)
    torch.manual_seed(123)
    _run(model, callbacks=[recorder])
    return model, recorder


def _assert_same_tail(reference: LossRecorder, resumed: LossRecorder, ref_model: Net, model: Net) -> None:
    tail = reference.losses[len(reference.losses) - len(resumed.losses) :]
    assert resumed.losses, "the resumed run trained nothing"
    assert all(torch.equal(a, b) for a, b in zip(tail, resumed.losses))
    assert resumed.lrs == reference.lrs[len(reference.lrs) - len(resumed.lrs) :]
    for (name, a), (_, b) in zip(ref_model.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("epoch", "batch_idx"), [(1, 4), (0, 9), (2, 0)])
def test_resume_mid_epoch_bit_for_bit(tmp_path: Path, epoch: int, batch_idx: int) -> None:
    ref_model, reference = _reference()
    path = tmp_path / "crash.ckpt"
    model = _model(0)
    torch.manual_seed(123)
    with pytest.raises(_Crash):
        _run(model, callbacks=[CrashAt(epoch, batch_idx, path)])
    # a fresh process would start from another random state and other initial weights
    torch.manual_seed(999)
    resumed, model = LossRecorder(), _model(1)
    trainer = _run(model, callbacks=[resumed], ckpt_path=path)
    _assert_same_tail(reference, resumed, ref_model, model)
    assert (trainer.global_step, trainer.current_epoch) == (15, 3)


def test_resume_at_epoch_boundary_from_last(tmp_path: Path) -> None:
    ref_model, reference = _reference()

    class CrashAtEpoch2(Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == 2:
                raise _Crash

    checkpoint = ModelCheckpoint(tmp_path / "ckpts", save_last=True)
    model = _model(0)
    torch.manual_seed(123)
    with pytest.raises(_Crash):
        _run(model, callbacks=[CrashAtEpoch2(), checkpoint], enable_checkpointing=True, default_root_dir=tmp_path)
    assert Path(checkpoint.last_model_path).name == "last.ckpt"
    torch.manual_seed(5)
    resumed, model = LossRecorder(), _model(1)
    again = ModelCheckpoint(tmp_path / "ckpts", save_last=True)
    _run(model, callbacks=[resumed, again], enable_checkpointing=True, default_root_dir=tmp_path, ckpt_path="last")
    assert len(resumed.losses) == 10
    _assert_same_tail(reference, resumed, ref_model, model)


def test_resume_from_checkpoint_written_during_validation(tmp_path: Path) -> None:
    ref_model, reference = _reference()
    checkpoint = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=-1)
    model = _model(0)
    torch.manual_seed(123)
    with pytest.raises(_Crash):
        _run(model, callbacks=[checkpoint, CrashAt(1, 7)], enable_checkpointing=True)
    mid_epoch = [p for p in tmp_path.glob("*.ckpt") if "epoch=1-step=7" in p.name]
    assert len(mid_epoch) == 1
    assert torch.load(mid_epoch[0], weights_only=True)["loops"]["fit"]["phase"] == "val"
    torch.manual_seed(5)
    resumed, model = LossRecorder(), _model(1)
    _run(model, callbacks=[resumed], ckpt_path=mid_epoch[0])
    _assert_same_tail(reference, resumed, ref_model, model)


def test_resume_after_max_steps_with_save_checkpoint(tmp_path: Path) -> None:
    ref_model, reference = _reference()
    model = _model(0)
    torch.manual_seed(123)
    first = _run(model, callbacks=[], max_steps=7)
    assert (first.global_step, first.current_epoch, first.fit_loop.batches_done) == (7, 1, 4)
    first.save_checkpoint(tmp_path / "step7.ckpt")
    torch.manual_seed(0)
    resumed, model = LossRecorder(), _model(2)
    _run(model, callbacks=[resumed], ckpt_path=tmp_path / "step7.ckpt")
    _assert_same_tail(reference, resumed, ref_model, model)


def test_checkpoint_contents(tmp_path: Path) -> None:
    trainer = _run(_model(0), callbacks=[], max_steps=3)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    checkpoint = torch.load(tmp_path / "c.ckpt", weights_only=True)
    assert checkpoint["phalanx_version"] == phalanx.__version__
    assert (checkpoint["strategy"], checkpoint["world_size"]) == ("single_device", 1)
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (0, 3)
    assert checkpoint["loops"]["fit"] == {
        "epoch": 0,
        "global_step": 3,
        "batches_done": 6,
        "total_batches_done": 6,
        "phase": "val",
        "sampler_epoch": 0,
        "num_batches": 10,
    }
    assert checkpoint["module_class"].endswith("Net")
    assert len(checkpoint["optimizer_states"]) == 1 and len(checkpoint["lr_schedulers"]) == 1
    assert set(checkpoint["rng_states"]) == {"current", "epoch_start"}
    assert set(checkpoint["state_dict"]) == set(Net().state_dict())


class _Recorder(Net):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def setup(self, stage: str) -> None:
        self.calls.append("setup")


def test_missing_checkpoint_fails_before_any_work(tmp_path: Path) -> None:
    model = _Recorder()
    with pytest.raises(CheckpointError, match="no such file"):
        Trainer(**quiet()).fit(model, loader(), ckpt_path=tmp_path / "nope.ckpt")
    assert model.calls == []


def test_corrupt_and_foreign_checkpoints(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"definitely not a zip file")
    with pytest.raises(CheckpointError, match="not a valid checkpoint"):
        Trainer(**quiet()).fit(Net(), loader(), ckpt_path=corrupt)

    bare = tmp_path / "bare.ckpt"
    torch.save(Net().state_dict(), bare)
    with pytest.raises(CheckpointError, match="not a phalanx checkpoint"):
        Trainer(**quiet()).fit(Net(), loader(), ckpt_path=bare)


def test_checkpoint_of_another_model(tmp_path: Path) -> None:
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(Net(), loader())
    trainer.save_checkpoint(tmp_path / "net.ckpt")

    class Wider(Net):
        def __init__(self) -> None:
            super().__init__()
            self.net[0] = torch.nn.Linear(6, 32)
            self.net[3] = torch.nn.Linear(32, 1)
            self.extra = torch.nn.Linear(2, 2)

    with pytest.raises(CheckpointError, match=r"does not match Wider.*unexpected|missing keys") as info:
        Trainer(**quiet()).fit(Wider(), loader(), ckpt_path=tmp_path / "net.ckpt")
    assert "shape mismatch" in str(info.value)
    assert "net.0.weight" in str(info.value)


def test_weights_only_checkpoint_cannot_resume_but_can_evaluate(tmp_path: Path) -> None:
    trainer = Trainer(max_steps=2, **quiet())
    model = Net()
    trainer.fit(model, loader())
    trainer.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)
    with pytest.raises(CheckpointError, match="weights only"):
        Trainer(**quiet()).fit(Net(), loader(), ckpt_path=tmp_path / "w.ckpt")
    fresh = Net()
    Trainer(**quiet()).validate(fresh, loader(n=8), ckpt_path=tmp_path / "w.ckpt", verbose=False)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))


def test_ckpt_path_last_without_checkpoints_starts_fresh(tmp_path: Path) -> None:
    trainer = Trainer(max_steps=2, default_root_dir=tmp_path, **quiet())
    with pytest.warns(UserWarning, match="no checkpoint found"):
        trainer.fit(Net(), loader(), ckpt_path="last")
    assert trainer.global_step == 2


@pytest.mark.parametrize(("ckpt_path", "error"), [(3, MisconfigurationError), ("best", MisconfigurationError)])
def test_bad_ckpt_path_values(ckpt_path: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="ckpt_path"):
        Trainer(**quiet()).fit(Net(), loader(), ckpt_path=ckpt_path)


def test_resume_restores_accumulated_gradients_and_scaler(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    torch.manual_seed(5)
    Trainer(max_steps=4, accumulate_grad_batches=3, precision="16-mixed", **quiet()).fit(reference, loader())
    path = tmp_path / "mid_window.ckpt"
    torch.manual_seed(5)
    with pytest.raises(_Crash):
        Trainer(
            max_steps=4, accumulate_grad_batches=3, precision="16-mixed", callbacks=[CrashAt(0, 4, path)], **quiet()
        ).fit(model, loader())
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["accumulated_grads"] and checkpoint["precision_plugin"]["scale"] > 0
    resumed = Net()
    Trainer(max_steps=4, accumulate_grad_batches=3, precision="16-mixed", **quiet()).fit(
        resumed, loader(), ckpt_path=path
    )
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), resumed.parameters()))


class _DeferredStrategy(SingleDeviceStrategy):
    """Stores weights and optimizer state under its own keys and restores them after setup (like FSDP)."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        own = dict(checkpoint)
        own["weights"], own["optim"] = own.pop("state_dict"), own.pop("optimizer_states")
        super().save_checkpoint(own, filepath, storage_options)

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        assert self.optimizers, "restored before setup"
        super().load_model_state_dict({"state_dict": checkpoint["weights"]}, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        super().load_optimizer_state_dict({"optimizer_states": checkpoint["optim"]})


def test_strategy_restoring_after_setup_needs_no_state_dict_before_setup(tmp_path: Path) -> None:
    ref_model, reference = _reference()
    path = tmp_path / "crash.ckpt"
    model = _model(0)
    torch.manual_seed(123)
    with pytest.raises(_Crash):
        _run(model, callbacks=[CrashAt(1, 4, path)], strategy=_DeferredStrategy())
    assert "state_dict" not in torch.load(path, weights_only=True)
    torch.manual_seed(999)
    resumed, model = LossRecorder(), _model(1)
    _run(model, callbacks=[resumed], ckpt_path=path, strategy=_DeferredStrategy())
    _assert_same_tail(reference, resumed, ref_model, model)


def test_epoch_end_checkpoint_resumes_at_another_world_size_without_warning(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(tmp_path, every_n_epochs=1, save_on_train_epoch_end=True, save_top_k=-1)
    _run(_model(0), callbacks=[checkpoint], max_epochs=1, enable_checkpointing=True)
    saved = torch.load(checkpoint.last_model_path or next(tmp_path.glob("*.ckpt")), weights_only=True)
    assert saved["loops"]["fit"]["phase"] == "epoch_end"
    assert saved["loops"]["fit"]["batches_done"] == 10
    saved["world_size"] = 2  # as if written by a 2-process run
    torch.save(saved, tmp_path / "two_ranks.ckpt")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*mid-epoch.*")
        trainer = _run(_model(1), callbacks=[], max_epochs=2, ckpt_path=tmp_path / "two_ranks.ckpt")
    assert trainer.current_epoch == 2
    saved["loops"]["fit"].update(phase="train", batches_done=4)  # genuinely mid-epoch: still warned
    torch.save(saved, tmp_path / "mid.ckpt")
    with pytest.warns(UserWarning, match="mid-epoch"):
        _run(_model(1), callbacks=[], max_epochs=2, ckpt_path=tmp_path / "mid.ckpt")
