"""ModelCheckpoint: top-k by a metric, last, every N steps / epochs, state restore, names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import Net, loader

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.trainer.trainer import Trainer

SCORES = [0.5, 0.2, 0.9, 0.1, 0.3]


class Scored(Net):
    """Logs a scripted validation score per epoch."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("score", SCORES[self.current_epoch])


def _fit(tmp_path: Path, callback: ModelCheckpoint, epochs: int = 5, ckpt_path: Any = None) -> Trainer:
    trainer = Trainer(
        max_epochs=epochs, callbacks=[callback], default_root_dir=tmp_path, logger=False, enable_progress_bar=False
    )
    trainer.fit(Scored(), loader(n=8), loader(n=4), ckpt_path=ckpt_path)
    return trainer


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.ckpt"))


@pytest.mark.parametrize(("mode", "kept", "best"), [("min", [3, 1], 3), ("max", [2, 0], 2)])
def test_top_k_by_metric(tmp_path: Path, mode: str, kept: list[int], best: int) -> None:
    callback = ModelCheckpoint(
        tmp_path / "ck", filename="{epoch}-{score:.2f}", monitor="score", mode=mode, save_top_k=2
    )
    _fit(tmp_path, callback)
    expected = sorted(f"epoch={e}-score={SCORES[e]:.2f}.ckpt" for e in kept)
    assert _names(tmp_path / "ck") == expected
    assert Path(callback.best_model_path).name == f"epoch={best}-score={SCORES[best]:.2f}.ckpt"
    assert callback.best_model_score == pytest.approx(SCORES[best])
    assert set(callback.best_k_models) == {str(tmp_path / "ck" / name) for name in expected}


def test_last_and_latest_only(tmp_path: Path) -> None:
    callback = ModelCheckpoint(tmp_path, save_last=True)
    trainer = _fit(tmp_path, callback, epochs=3)
    assert _names(tmp_path) == ["epoch=2-step=6.ckpt", "last.ckpt"]
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, trainer.global_step)


def test_every_n_train_steps_and_every_n_epochs(tmp_path: Path) -> None:
    steps = ModelCheckpoint(tmp_path / "steps", every_n_train_steps=3, save_top_k=-1)
    _fit(tmp_path, steps, epochs=3)
    assert _names(tmp_path / "steps") == ["epoch=1-step=3.ckpt", "epoch=2-step=6.ckpt"]
    epochs = ModelCheckpoint(tmp_path / "epochs", every_n_epochs=2, save_top_k=-1)
    _fit(tmp_path, epochs, epochs=5)
    assert _names(tmp_path / "epochs") == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]


def test_default_checkpoint_dir_and_weights_only(tmp_path: Path) -> None:
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(Net(), loader(n=8))
    assert trainer.checkpoint_callback is not None
    path = Path(trainer.checkpoint_callback.best_model_path)
    assert path.parent == tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    callback = ModelCheckpoint(tmp_path / "w", save_weights_only=True)
    _fit(tmp_path, callback, epochs=1)
    assert "optimizer_states" not in torch.load(callback.best_model_path, weights_only=True)


def test_state_is_restored_on_resume(tmp_path: Path) -> None:
    first = ModelCheckpoint(tmp_path, monitor="score", save_top_k=2, save_last=True)
    _fit(tmp_path, first, epochs=3)
    second = ModelCheckpoint(tmp_path, monitor="score", save_top_k=2, save_last=True)
    _fit(tmp_path, second, epochs=5, ckpt_path=tmp_path / "last.ckpt")
    assert second.best_model_score == pytest.approx(0.1)
    assert sorted(Path(p).name for p in second.best_k_models) == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]
    assert _names(tmp_path) == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt", "last.ckpt"]


def test_existing_files_are_not_clobbered(tmp_path: Path) -> None:
    (tmp_path / "epoch=0-step=2.ckpt").write_bytes(b"someone else's file")
    callback = ModelCheckpoint(tmp_path, save_top_k=-1)
    _fit(tmp_path, callback, epochs=1)
    assert (tmp_path / "epoch=0-step=2.ckpt").read_bytes() == b"someone else's file"
    assert (tmp_path / "epoch=0-step=2-v1.ckpt").exists()


def test_missing_monitor_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationError, match=r"found no metric 'nope'.*score"):
        _fit(tmp_path, ModelCheckpoint(tmp_path, monitor="nope"), epochs=1)
    for kwargs, match in [
        ({"mode": "lowest"}, "mode"),
        ({"save_top_k": 3}, "monitor"),
        ({"save_top_k": -2}, "save_top_k"),
        ({"every_n_train_steps": 2, "every_n_epochs": 1}, "mutually exclusive"),
        ({"every_n_epochs": 1.5}, "every_n_epochs"),
        ({"save_last": "yes"}, "save_last"),
    ]:
        with pytest.raises(MisconfigurationError, match=match):
            ModelCheckpoint(tmp_path, **kwargs)
    with pytest.raises(MisconfigurationError, match="dirpath"):
        ModelCheckpoint(5)  # type: ignore[arg-type]


def test_resuming_past_max_epochs_is_refused(tmp_path: Path) -> None:
    """As in Lightning: a checkpoint from epoch 3 cannot resume a fit of max_epochs=1."""
    callback = ModelCheckpoint(tmp_path, save_last=True, save_top_k=0)
    _fit(tmp_path, callback, epochs=4)
    with pytest.raises(MisconfigurationError, match=r"current_epoch=3, but you have set Trainer\(max_epochs=1\)"):
        _fit(tmp_path / "again", ModelCheckpoint(tmp_path / "again"), epochs=1, ckpt_path=callback.last_model_path)
