"""LearningRateMonitor and LambdaCallback on real CPU fits.

The monitor's values are read back from a real CSVLogger's ``metrics.csv`` and compared with the
learning rates a plain torch optimizer and scheduler produce over the same number of steps, so a
value logged one step early or late, or under the wrong key, fails.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import Net, loader, quiet

from phalanx.callbacks import LambdaCallback, LearningRateMonitor
from phalanx.errors import MisconfigurationError
from phalanx.loggers import CSVLogger
from phalanx.trainer.trainer import Trainer

BATCHES = 10  # loader(): 40 samples in batches of 4


def _fit(tmp_path: Path, model: Net, monitor: LearningRateMonitor, **overrides: Any) -> list[dict[str, str]]:
    """Fit ``model`` with ``monitor`` and a CSVLogger; return the rows of ``metrics.csv``."""
    logger = CSVLogger(tmp_path)
    kwargs = quiet(accelerator="cpu", logger=logger, callbacks=[monitor], max_epochs=2, log_every_n_steps=1)
    kwargs.update(overrides)
    Trainer(**kwargs).fit(model, loader())
    with open(logger.metrics_file_path, newline="") as handle:
        return list(csv.DictReader(handle))


def _logged(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), float(row[key])) for row in rows if row.get(key)]


def _reference_lrs(steps: int, make: Callable[[torch.optim.Optimizer], Any], lr: float = 0.1) -> list[float]:
    """The learning rate before each of ``steps`` optimizer steps, from plain torch."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr, momentum=0.9)
    scheduler = make(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return lrs


def _step_lr(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.StepLR:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


@pytest.mark.parametrize("every", [1, 5])
def test_step_interval_logs_the_scheduler_sequence(tmp_path: Path, every: int) -> None:
    model = Net(lr=0.1, scheduler=lambda opt: {"scheduler": _step_lr(opt), "interval": "step"})
    monitor = LearningRateMonitor()
    rows = _fit(tmp_path, model, monitor, log_every_n_steps=every)
    expected = _reference_lrs(2 * BATCHES, _step_lr)
    logged_steps = [step for step in range(2 * BATCHES) if (step + 1) % every == 0]
    assert _logged(rows, "lr-SGD") == [(step, expected[step]) for step in logged_steps]
    assert monitor.lrs == {"lr-SGD": [expected[step] for step in logged_steps]}


def test_epoch_interval_logs_at_epoch_starts(tmp_path: Path) -> None:
    def make(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.StepLR:
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    model = Net(lr=0.1, scheduler=make)  # a bare scheduler steps every epoch
    rows = _fit(tmp_path, model, LearningRateMonitor(), max_epochs=3)
    assert _logged(rows, "lr-SGD") == [(0, 0.1), (BATCHES, 0.05), (2 * BATCHES, 0.025)]


def test_logging_interval_epoch_overrides_a_step_scheduler(tmp_path: Path) -> None:
    model = Net(lr=0.1, scheduler=lambda opt: {"scheduler": _step_lr(opt), "interval": "step"})
    rows = _fit(tmp_path, model, LearningRateMonitor("epoch"))
    expected = _reference_lrs(2 * BATCHES, _step_lr)
    assert _logged(rows, "lr-SGD") == [(0, expected[0]), (BATCHES, expected[BATCHES])]


class TwoGroups(Net):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(
            [{"params": self.net[0].parameters()}, {"params": self.net[3].parameters(), "lr": 0.01, "name": "head"}],
            lr=0.1,
        )


def test_two_param_groups_get_suffixed_keys(tmp_path: Path) -> None:
    monitor = LearningRateMonitor()
    rows = _fit(tmp_path, TwoGroups(), monitor, max_epochs=1, log_every_n_steps=5)
    # No scheduler: read at the epoch start and before steps 4 and 9; same step rows merge in the file.
    assert set(monitor.lrs) == {"lr-SGD/pg1", "lr-SGD/head"}
    assert _logged(rows, "lr-SGD/pg1") == [(0, 0.1), (4, 0.1), (9, 0.1)]
    assert _logged(rows, "lr-SGD/head") == [(0, 0.01), (4, 0.01), (9, 0.01)]


@pytest.mark.parametrize(("optimizer", "key"), [("sgd", "lr-SGD"), ("adam", "lr-Adam")])
def test_momentum_and_weight_decay(tmp_path: Path, optimizer: str, key: str) -> None:
    monitor = LearningRateMonitor("epoch", log_momentum=True, log_weight_decay=True)
    rows = _fit(tmp_path, Net(lr=0.1, optimizer=optimizer), monitor, max_epochs=1)
    assert _logged(rows, f"{key}-momentum") == [(0, 0.9)]  # SGD momentum=0.9, Adam betas[0]=0.9
    assert _logged(rows, f"{key}-weight_decay") == [(0, 0.0)]
    assert monitor.last_momentum_values == {f"{key}-momentum": 0.9}


def test_named_scheduler_uses_its_name(tmp_path: Path) -> None:
    model = Net(lr=0.1, scheduler=lambda opt: {"scheduler": _step_lr(opt), "interval": "step", "name": "my_lr"})
    rows = _fit(tmp_path, model, LearningRateMonitor(), max_epochs=1, log_every_n_steps=5)
    expected = _reference_lrs(BATCHES, _step_lr)
    assert _logged(rows, "my_lr") == [(4, expected[4]), (9, expected[9])]
    assert "lr-SGD" not in rows[0]


def test_no_logger_is_an_error(tmp_path: Path) -> None:
    trainer = Trainer(**quiet(accelerator="cpu", callbacks=[LearningRateMonitor()], max_epochs=1))
    with pytest.raises(MisconfigurationError, match="logger=True"):
        trainer.fit(Net(), loader())


def test_bad_logging_interval_names_the_choices() -> None:
    with pytest.raises(MisconfigurationError, match=r"logging_interval='batch'.*\[None, 'step', 'epoch'\]"):
        LearningRateMonitor("batch")


def test_duplicate_param_group_names_are_an_error(tmp_path: Path) -> None:
    class Duplicated(Net):
        def configure_optimizers(self) -> Any:
            groups = [
                {"params": self.net[0].parameters(), "name": "a"},
                {"params": self.net[3].parameters(), "name": "a"},
            ]
            return torch.optim.SGD(groups, lr=0.1)

    with pytest.raises(MisconfigurationError, match="distinct 'name'"):
        _fit(tmp_path, Duplicated(), LearningRateMonitor(), max_epochs=1)


def test_lambda_callback_calls_the_functions_in_order(tmp_path: Path) -> None:
    calls: list[str] = []

    def record(name: str) -> Callable[..., None]:
        return lambda *args: calls.append(name)

    hooks = ["setup", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_epoch_end", "on_train_end"]
    callback = LambdaCallback(
        **{name: record(name) for name in hooks},
        on_train_batch_start=lambda trainer, module, batch, batch_idx: calls.append(f"batch {batch_idx}"),
        on_fit_end=None,  # None is skipped, as in Lightning
    )
    trainer = Trainer(**quiet(accelerator="cpu", callbacks=[callback], max_epochs=1, limit_train_batches=2))
    trainer.fit(Net(), loader())
    assert calls == [
        "setup",
        "on_fit_start",
        "on_train_start",
        "on_train_epoch_start",
        "batch 0",
        "batch 1",
        "on_train_epoch_end",
        "on_train_end",
    ]


def test_lambda_callback_rejects_an_unknown_hook() -> None:
    with pytest.raises(MisconfigurationError, match=r"\['on_train_epoch_ends'\].*on_train_epoch_end") as info:
        LambdaCallback(on_train_epoch_ends=print)
    assert "on_validation_end" in str(info.value)  # lists the valid hooks
    with pytest.raises(MisconfigurationError, match="needs a callable"):
        LambdaCallback(on_fit_start=3)  # type: ignore[arg-type]


def test_rates_are_callback_metrics_other_callbacks_can_monitor(tmp_path: Path) -> None:
    """As in Lightning, the values go into ``trainer.callback_metrics`` too, so EarlyStopping can watch them."""
    from phalanx.callbacks import EarlyStopping

    model = Net(lr=0.1, scheduler=lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)})
    monitor = LearningRateMonitor()
    stop = EarlyStopping(monitor="lr-SGD", mode="min", stopping_threshold=0.03, check_on_train_epoch_end=True)
    trainer = Trainer(**quiet(accelerator="cpu", logger=CSVLogger(tmp_path), callbacks=[monitor, stop], max_epochs=6))
    trainer.fit(model, loader())
    assert monitor.lrs["lr-SGD"] == pytest.approx([0.1, 0.05, 0.025])  # 0.025 < 0.03: stopped after epoch 2
    assert float(trainer.callback_metrics["lr-SGD"]) == pytest.approx(0.025)
