"""ModelCheckpoint features matched to Lightning 2.6: names, version counter, time and step triggers,
top-k bookkeeping, to_yaml, and one identical error on every rank for a monitor that is never logged.

The two-process test runs this file as a script (``python test_model_checkpoint_lightning.py OUT``)
under the core's own ParallelStrategy.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer


def _loader(n: int = 4) -> DataLoader:
    x = torch.arange(n, dtype=torch.float32).view(-1, 1)
    return DataLoader(TensorDataset(x, x.clone()), batch_size=2)


class Tiny(Module):
    """Logs a scripted validation score per epoch (``val_scores[current_epoch]``)."""

    def __init__(self, val_scores: list[float] | None = None, train_metric: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.val_scores = val_scores or []
        self.train_metric = train_metric
        self.counter = 0.0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.train_metric:
            self.counter += 1.0
            self.log("train_score", self.counter, on_step=True, on_epoch=False)
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_validation_epoch_end(self) -> None:
        if self.val_scores and not self.trainer.sanity_checking:
            self.log("auroc", self.val_scores[min(self.current_epoch, len(self.val_scores) - 1)])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(model: Module, callback: ModelCheckpoint, *, val: bool = True, **kwargs: Any) -> Trainer:
    options: dict[str, Any] = {
        "accelerator": "cpu", "max_epochs": 2, "logger": False, "enable_progress_bar": False,
        "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_train_batches": 2,
    }  # fmt: skip
    options.update(kwargs)
    trainer = Trainer(callbacks=[callback], **options)
    trainer.fit(model, _loader(), _loader() if val else None)
    return trainer


def _names(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*.ckpt"))


# ------------------------------------------------------------------ names
@pytest.mark.parametrize(
    ("kwargs", "metrics", "override", "expected"),
    [
        ({"filename": "{epoch}"}, {"epoch": 0}, None, "epoch=0.ckpt"),
        ({"filename": "{epoch:03d}"}, {"epoch": 5}, None, "epoch=005.ckpt"),
        ({"filename": "{epoch}-{val_loss:.2f}"}, {"epoch": 2, "val_loss": 0.123456}, None, "epoch=2-val_loss=0.12.ckpt"),
        ({"filename": "{epoch}-{val_loss:.2f}"}, {"epoch": 2, "val_loss": 0.12}, "{epoch:d}", "epoch=2.ckpt"),
        (
            {"filename": "epoch={epoch}-validation_loss={val_loss:.2f}", "auto_insert_metric_name": False},
            {"epoch": 2, "val_loss": 0.123456}, None, "epoch=2-validation_loss=0.12.ckpt",
        ),
        ({"filename": "{missing:d}"}, {}, None, "missing=0.ckpt"),
        ({"filename": "{epoch}-{epoch_loss:.1f}"}, {"epoch": 1, "epoch_loss": 0.25}, None, "epoch=1-epoch_loss=0.2.ckpt"),
        ({"filename": "{val/loss:.2f}"}, {"val/loss": 0.5}, None, "val/loss=0.50.ckpt"),  # "/" makes a folder, as in Lightning
        (
            {"filename": "epoch{epoch:02d}-val_loss{val/loss:.2f}", "auto_insert_metric_name": False},
            {"epoch": 3, "val/loss": 0.5}, None, "epoch03-val_loss0.50.ckpt",
        ),
        ({}, {"epoch": torch.tensor(1), "step": torch.tensor(7)}, None, "epoch=1-step=7.ckpt"),
    ],
)  # fmt: skip
def test_format_checkpoint_name_follows_lightning(
    tmp_path: Path, kwargs: dict[str, Any], metrics: dict[str, Any], override: str | None, expected: str
) -> None:
    callback = ModelCheckpoint(tmp_path, **kwargs)
    assert callback.format_checkpoint_name(metrics, override) == str(tmp_path / expected)


def test_join_and_equals_chars_version_suffix_and_no_dirpath() -> None:
    class Custom(ModelCheckpoint):
        CHECKPOINT_JOIN_CHAR = "_"
        CHECKPOINT_EQUALS_CHAR = ":"

    assert Custom().format_checkpoint_name({"epoch": 2, "step": 3}) == "epoch:2_step:3.ckpt"
    assert Custom().format_checkpoint_name({"epoch": 2, "step": 3}, ver=1) == "epoch:2_step:3_v1.ckpt"
    assert ModelCheckpoint(filename="{step}").format_checkpoint_name({"step": 0}) == "step=0.ckpt"


# ------------------------------------------------------------------ version counter
@pytest.mark.parametrize("counter", [True, False])
def test_enable_version_counter(tmp_path: Path, counter: bool) -> None:
    foreign = tmp_path / "epoch=0-step=2.ckpt"
    foreign.write_bytes(b"not ours")
    callback = ModelCheckpoint(tmp_path, save_top_k=-1, enable_version_counter=counter)
    _fit(Tiny(), callback, max_epochs=1)
    if counter:
        assert foreign.read_bytes() == b"not ours"
        assert callback.best_model_path == str(tmp_path / "epoch=0-step=2-v1.ckpt")
    else:
        assert foreign.read_bytes() != b"not ours"  # overwritten, as Lightning does
        assert callback.best_model_path == str(foreign)


# ------------------------------------------------------------------ triggers
def test_train_time_interval_saves_when_the_interval_passed(tmp_path: Path) -> None:
    every_batch = ModelCheckpoint(tmp_path / "zero", train_time_interval=timedelta(0), save_top_k=-1)
    _fit(Tiny(), every_batch, val=False)
    assert _names(tmp_path / "zero") == [f"epoch={s // 3}-step={s}.ckpt" for s in (1, 2, 3, 4)]
    never = ModelCheckpoint(tmp_path / "hour", train_time_interval=timedelta(hours=1), save_top_k=-1)
    _fit(Tiny(), never, val=False)
    assert not (tmp_path / "hour").exists()  # no epoch saves either: the time trigger replaces every_n_epochs=1
    with pytest.raises(MisconfigurationError, match="mutually exclusive"):
        ModelCheckpoint(train_time_interval=timedelta(1), every_n_train_steps=2)
    with pytest.raises(MisconfigurationError, match="timedelta"):
        ModelCheckpoint(train_time_interval=60)  # type: ignore[arg-type]


def test_every_n_train_steps_with_a_train_metric_saves_at_the_step(tmp_path: Path) -> None:
    callback = ModelCheckpoint(
        tmp_path, monitor="train_score", mode="max", every_n_train_steps=1, every_n_epochs=0, save_weights_only=True
    )
    _fit(Tiny(train_metric=True), callback, val=False)
    assert callback.best_model_score == 4.0  # 2 epochs x 2 steps, the metric counts steps


@pytest.mark.parametrize(
    ("trigger", "check_every", "scores"),
    [
        ({"every_n_train_steps": 2}, 2, [0.1, 0.5, 1.0, 3.0]),  # validation every 2 epochs: saves wait for it
        ({"train_time_interval": timedelta(0)}, 1, [0.2, 0.4, 0.9]),
    ],
)
def test_step_and_time_saves_wait_for_validation_metrics(
    tmp_path: Path, trigger: dict[str, Any], check_every: int, scores: list[float]
) -> None:
    callback = ModelCheckpoint(
        tmp_path, monitor="auroc", mode="max", save_top_k=1, every_n_epochs=0, save_on_train_epoch_end=False, **trigger
    )
    _fit(Tiny(scores), callback, max_epochs=len(scores), check_val_every_n_epoch=check_every, limit_val_batches=1)
    assert callback.best_model_score == pytest.approx(max(scores))  # never a stale value from an earlier validation


# ------------------------------------------------------------------ bookkeeping
def test_best_k_bookkeeping_last_and_to_yaml(tmp_path: Path) -> None:
    scores = [0.5, 0.2, 0.9, 0.1]
    callback = ModelCheckpoint(tmp_path, monitor="auroc", mode="min", save_top_k=2, save_last=True)
    _fit(Tiny(scores), callback, max_epochs=4, limit_val_batches=1)
    expected = {str(tmp_path / f"epoch={e}-step={2 * (e + 1)}.ckpt"): scores[e] for e in (1, 3)}
    assert callback.best_k_models == pytest.approx(expected)
    assert callback.best_model_path == str(tmp_path / "epoch=3-step=8.ckpt")
    assert callback.best_model_score == pytest.approx(0.1)
    assert callback.kth_best_model_path == str(tmp_path / "epoch=1-step=4.ckpt")
    assert callback.kth_value == pytest.approx(0.2)
    assert callback.last_model_path == str(tmp_path / "last.ckpt")
    assert _names(tmp_path) == sorted([*(Path(p).name for p in expected), "last.ckpt"])
    callback.to_yaml()
    assert yaml.safe_load((tmp_path / "best_k_models.yaml").read_text()) == pytest.approx(expected)
    callback.to_yaml(tmp_path / "other.yaml")
    assert yaml.safe_load((tmp_path / "other.yaml").read_text()) == pytest.approx(expected)


def test_save_last_link_points_at_the_newest_checkpoint(tmp_path: Path) -> None:
    scores = [0.5, 0.2, 0.9]
    callback = ModelCheckpoint(tmp_path, monitor="auroc", mode="min", save_top_k=2, save_last="link")
    _fit(Tiny(scores), callback, max_epochs=3, limit_val_batches=1)
    last = tmp_path / "last.ckpt"
    assert last.is_symlink() and callback.last_model_path == str(last)
    # epoch 2 (0.9) is not among the best two, so the newest file written is epoch 1's, as in Lightning
    assert os.readlink(last) == "epoch=1-step=4.ckpt"  # relative: the folder can move
    assert torch.load(last, weights_only=True)["global_step"] == 4
    assert not list(tmp_path.glob(".*link-tmp"))  # swapped in by a rename, nothing left behind
    with pytest.raises(MisconfigurationError, match="'link'"):
        ModelCheckpoint(tmp_path, save_last="symlink")


def test_missing_monitor_error_names_the_key_and_the_logged_keys(tmp_path: Path) -> None:
    callback = ModelCheckpoint(tmp_path, monitor="val_acc")
    with pytest.raises(MisconfigurationError, match=r"found no metric 'val_acc'; logged metrics are \['auroc'\]"):
        _fit(Tiny([0.5]), callback, limit_val_batches=1)


@pytest.mark.timeout(150)
def test_missing_monitor_raises_the_same_error_on_every_rank(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # rank 1 logged "score" and rank 0 did not: rank 0's metrics decide, so both raise, at the same first check
    assert ranks[0] == ranks[1]
    assert "found no metric 'score'; logged metrics are ['other']" in ranks[0]["error"]
    assert (ranks[0]["epoch"], ranks[0]["step"]) == (0, 2)


class _PerRank(Tiny):
    def on_validation_epoch_end(self) -> None:
        self.log("score" if self.global_rank == 1 else "other", 1.0)


def _rank_main(out: str) -> None:
    from phalanx.strategies import ParallelStrategy

    trainer = Trainer(
        accelerator="cpu", devices=2, strategy=ParallelStrategy(), max_epochs=3, num_sanity_val_steps=0,
        callbacks=[ModelCheckpoint(Path(out) / "ck", monitor="score")], logger=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,
    )  # fmt: skip
    record: dict[str, Any] = {"error": None}
    try:
        trainer.fit(_PerRank(), _loader(), _loader())
    except MisconfigurationError as error:
        record["error"] = str(error)
    record.update(epoch=trainer.current_epoch, step=trainer.global_step)
    (Path(out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank_main(sys.argv[1])
