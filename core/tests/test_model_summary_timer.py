"""ModelSummary prints Lightning's table with exact counts; Timer stops a real fit when its budget
is spent, after every batch or every epoch, and a resumed run keeps spending the same budget."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import Net, loader, quiet

from phalanx.callbacks.model_summary import ModelSummary, get_human_readable_count, summarize
from phalanx.callbacks.timer import Timer, parse_duration
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer

#: Holds wall-clock bounds: under xdist it runs with the machine to itself (phalanx.testing.scheduling).
pytestmark = pytest.mark.timing


class Tower(Module):
    """Nested layers, a frozen head, a submodule left in eval mode and a parameter of the root."""

    def __init__(self, *, example: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(256, 512), nn.BatchNorm1d(512), nn.Sequential(nn.Linear(512, 4), nn.Dropout())
        )
        self.head = nn.Linear(4, 2)
        self.head.requires_grad_(False)
        self.net[1].eval()
        self.scale = nn.Parameter(torch.ones(3))
        if example:
            self.example_input_array = torch.zeros(10, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x)) * self.scale[0]


# ------------------------------------------------------------------------------------ model summary
def test_summary_table_matches_lightnings_layout() -> None:
    table = str(summarize(Tower(), max_depth=1))
    assert table.splitlines() == [
        "  | Name         | Type       | Params | Mode  | FLOPs",
        "-" * 60,
        "0 | net          | Sequential | 134 K  | train | 0    ",
        "1 | head         | Linear     | 10     | train | 0    ",
        "  | other params | n/a        | 3      | n/a   | n/a  ",
        "-" * 60,
        "134 K     Trainable params",
        "10        Non-trainable params",
        "134 K     Total params",
        "0.539     Total estimated model params size (MB)",
        "6         Modules in train mode",
        "1         Modules in eval mode",
        "0         Total Flops",
    ]


def test_summary_counts_are_exact_at_every_depth() -> None:
    model = Tower()
    total = sum(p.numel() for p in model.parameters())
    summary = summarize(model, max_depth=-1)
    assert summary.layer_names == ["net", "net.0", "net.1", "net.2", "net.2.0", "net.2.1", "head"]
    assert summary.param_nums == [256 * 512 + 512 + 2 * 512 + 512 * 4 + 4, 256 * 512 + 512, 1024, 2052, 2052, 0, 10]
    assert summary.total_parameters == total == 134_673
    assert summary.trainable_parameters == total - 10
    assert summary.model_size == pytest.approx(total * 4 / 1e6)
    assert summary.training_modes == [True, True, False, True, True, True, True]
    assert summary.total_training_modes == {"train": 6, "eval": 1}
    assert summarize(model, max_depth=2).layer_names == ["net", "net.0", "net.1", "net.2", "head"]
    assert summarize(model, max_depth=0).layer_names == []
    with pytest.raises(MisconfigurationError, match="max_depth=-2"):
        summarize(model, max_depth=-2)


def test_example_input_fills_sizes_and_flops_and_restores_modes() -> None:
    model = Tower(example=True)
    summary = summarize(model, max_depth=2)
    assert summary.in_sizes == [[10, 256], [10, 256], [10, 512], [10, 512], [10, 4]]
    assert summary.out_sizes == [[10, 4], [10, 512], [10, 512], [10, 4], [10, 2]]
    assert summary.flop_counts["net.0"] == 2 * 10 * 256 * 512
    assert summary.total_flops == 2 * 10 * (256 * 512 + 512 * 4 + 4 * 2)
    table = str(summary)
    assert "In sizes" in table and "Out sizes" in table and "[10, 256]" in table
    assert [m.training for m in model.modules()] == [True, True, True, False, True, True, True, True]


def test_size_follows_dtype_and_meta_parameters_count() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 10)).to(torch.bfloat16)
    summary = summarize(model)
    assert summary.total_parameters == 1000 * 1000 + 1000 + 10 * 1000 + 10
    assert summary.model_size == pytest.approx(summary.total_parameters * 2 / 1e6)
    assert "1.0 M     Total params" in str(summary)


def test_human_readable_counts() -> None:
    assert [get_human_readable_count(n) for n in (0, 123, 1234, 2_000_000, 3e9, 4e14, 5e15)] == [
        "0  ",
        "123  ",
        "1.2 K",
        "2.0 M",
        "3.0 B",
        "400 T",
        "5,000 T",
    ]


def test_model_summary_callback_prints_when_fit_starts(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Trainer(max_epochs=1, limit_train_batches=1, callbacks=[ModelSummary(max_depth=2)], **quiet())
    trainer.fit(Net(), loader())
    out = capsys.readouterr().out
    assert "0 | net   | Sequential | 129    | train" in out
    assert "1 | net.0 | Linear     | 112    | train" in out
    assert "129       Total params" in out


def test_model_summary_with_depth_zero_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Trainer(max_epochs=1, limit_train_batches=1, callbacks=[ModelSummary(max_depth=0)], **quiet())
    trainer.fit(Net(), loader())
    assert "Total params" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- timer
class SlowNet(Net):
    """Each training step takes at least 0.3 s."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(0.3)
        return super().training_step(batch, batch_idx)


def test_timer_stops_training_after_the_duration(capsys: pytest.CaptureFixture[str]) -> None:
    timer = Timer(duration=timedelta(seconds=1))
    trainer = Trainer(max_epochs=100, callbacks=[timer], **quiet())
    started = time.monotonic()
    trainer.fit(SlowNet(), loader())  # 10 batches of 0.3 s per epoch
    assert trainer.should_stop
    # 4 steps take at least 1.2 s, so the Timer must have stopped by then (3 on a slow machine)
    assert 2 <= trainer.global_step <= 4
    assert 1.0 <= timer.time_elapsed("train") <= time.monotonic() - started
    assert timer.time_remaining() is not None and timer.time_remaining() <= 0
    assert timer.start_time("train") is not None and timer.end_time("train") is not None
    assert timer.start_time("test") is None
    out = capsys.readouterr().out
    assert re.search(r"Time limit reached\. Elapsed time is 0:00:0\d\. Signaling Trainer to stop\.", out)


def test_timer_with_epoch_interval_finishes_the_epoch() -> None:
    timer = Timer(duration={"seconds": 0.5}, interval="epoch", verbose=False)
    trainer = Trainer(max_epochs=100, limit_train_batches=3, callbacks=[timer], **quiet())
    trainer.fit(SlowNet(), loader())
    assert trainer.global_step == 3  # the whole first epoch, then stop
    assert trainer.current_epoch == 1


def test_a_resumed_timer_spends_the_remaining_budget() -> None:
    spent = Timer(duration="00:00:00:01")
    spent.load_state_dict({"time_elapsed": {"train": 5.0, "validate": 0.0, "test": 0.0, "predict": 0.0}})
    assert spent.time_elapsed() == 5.0 and spent.time_remaining() == -4.0
    trainer = Trainer(max_epochs=3, callbacks=[spent], **quiet())
    trainer.fit(Net(), loader())
    assert trainer.global_step == 0  # stopped by the check at fit start


def test_the_timer_state_holds_each_stages_elapsed_time() -> None:
    fresh = Timer(duration="00:01:00:00")
    trainer = Trainer(
        max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0, callbacks=[fresh], **quiet()
    )
    trainer.fit(Net(), loader(), loader())
    state = fresh.state_dict()["time_elapsed"]
    assert {"train", "validate", "test", "predict"} <= set(state)
    assert state["train"] > 0 and state["validate"] > 0 and state["test"] == 0
    resumed = Timer(duration="00:01:00:00")
    resumed.load_state_dict(fresh.state_dict())
    assert resumed.time_elapsed() == pytest.approx(state["train"])


def test_timer_measures_validation_and_test() -> None:
    timer = Timer()
    trainer = Trainer(limit_test_batches=2, callbacks=[timer], **quiet())
    trainer.test(Net(), loader())
    assert timer.time_elapsed("test") > 0
    assert timer.time_remaining("test") is None
    assert timer.time_elapsed("validate") == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("01:02:03:04", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        (" 00:00:00:30 ", timedelta(seconds=30)),
        ({"hours": 1.5}, timedelta(minutes=90)),
        (timedelta(weeks=1), timedelta(weeks=1)),
        (None, None),
    ],
)
def test_parse_duration_accepts_lightnings_forms(value: Any, expected: timedelta | None) -> None:
    assert parse_duration(value) == expected


@pytest.mark.parametrize("value", ["1:00:00", "00:12:00:0x", {"hourz": 1}, 3600, timedelta(seconds=-1)])
def test_invalid_durations_raise_one_clear_error(value: Any) -> None:
    with pytest.raises(MisconfigurationError) as info:
        Timer(duration=value)
    message = str(info.value)
    assert repr(value) in message and "DD:HH:MM:SS" in message and "timedelta" in message


def test_invalid_interval_raises() -> None:
    with pytest.raises(MisconfigurationError, match=r"interval='batch'.*\['step', 'epoch'\]"):
        Timer(duration="00:00:01:00", interval="batch")
