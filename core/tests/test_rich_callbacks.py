"""RichModelSummary and RichProgressBar draw what their plain counterparts show; without rich both
fail with one error naming ``pip install rich``; the ProgressBar and Checkpoint bases are the types."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import Net, loader, quiet

from phalanx.callbacks.progress import TQDMProgressBar
from phalanx.callbacks.progress_bar import ProgressBar
from phalanx.callbacks.rich_model_summary import RichModelSummary
from phalanx.callbacks.rich_progress import RichProgressBar
from phalanx.loggers import CSVLogger
from phalanx.trainer.trainer import Trainer


def test_rich_model_summary_prints_the_layers_and_global_totals(tmp_path: Path, capsys: Any) -> None:
    model = Net()
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[RichModelSummary(max_depth=2)],
                      max_steps=1, **quiet())  # fmt: skip
    trainer.fit(model, loader(n=4))
    out = capsys.readouterr().out
    total = sum(p.numel() for p in model.parameters())  # 6*16+16 + 16+1 = 129
    assert total == 129
    for text in ("net.0", "net.3", "Linear", "Dropout", "Trainable params: 129", "Total params: 129"):
        assert text in out, out


@pytest.mark.parametrize("cls", [RichModelSummary, RichProgressBar])
def test_without_rich_one_error_names_pip_install(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)  # what an environment without rich looks like to import
    with pytest.raises(ModuleNotFoundError, match=r"`pip install rich`"):
        cls()


def test_rich_progress_bar_draws_epochs_validation_and_metrics(tmp_path: Path) -> None:
    stream = io.StringIO()
    bar = RichProgressBar(leave=True, console_kwargs={"file": stream, "force_terminal": False, "width": 200})
    assert isinstance(bar, ProgressBar) and isinstance(TQDMProgressBar(), ProgressBar)
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[bar], max_epochs=2,
                      logger=CSVLogger(tmp_path), enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Net(), loader(n=8), loader(n=4))
    out = stream.getvalue()
    assert "Epoch 1" in out and "2/2" in out and "train_loss" in out, out
    metrics = bar.get_metrics(trainer, trainer.lightning_module)
    assert metrics["v_num"] == 0
    assert metrics["train_loss"] == pytest.approx(float(trainer.callback_metrics["train_loss"]))
    assert bar._progress_stopped and bar.train_progress_bar.completed == 2  # stopped at teardown, still readable


def test_rich_progress_bar_is_drawn_by_rank_zero_only_and_can_be_disabled(tmp_path: Path) -> None:
    bar = RichProgressBar(refresh_rate=0)
    assert bar.is_disabled
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[bar], max_steps=2, logger=False,
                      enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Net(), loader(n=8))
    assert bar.progress is None  # nothing was ever drawn


def test_tqdm_bar_shows_the_logger_version_like_lightning(tmp_path: Path, capsys: Any) -> None:
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, max_steps=2, logger=CSVLogger(tmp_path),
                      enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Net(), loader(n=8))
    assert "v_num=0" in capsys.readouterr().out  # tqdm draws on stdout, as in Lightning
