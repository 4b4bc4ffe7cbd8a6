"""Module: properties, logging entry points and defaults outside and inside a Trainer."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch
from trainer_helpers import Net, loader, quiet

from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer


def test_properties_without_trainer() -> None:
    model = Net()
    with pytest.raises(RuntimeError, match="not attached to a Trainer"):
        _ = model.trainer
    assert (model.global_rank, model.local_rank, model.current_epoch, model.global_step) == (0, 0, 0, 0)
    assert model.device == torch.device("cpu")
    assert model.dtype == torch.float32
    assert model.automatic_optimization is True
    assert model.logger is None and model.loggers == []
    assert Module().device == torch.device("cpu")


def test_log_without_trainer_warns_once() -> None:
    model = Net()
    with pytest.warns(UserWarning, match="not attached"):
        model.log("x", 1.0)
    model.log("x", 2.0)  # no second warning


def test_pickle_and_deepcopy_drop_the_trainer() -> None:
    model = Net()
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(model, loader())
    assert model.trainer is trainer
    assert copy.deepcopy(model)._trainer is None
    assert pickle.loads(pickle.dumps(model))._trainer is None


def test_default_predict_step_calls_forward() -> None:
    model = Net()
    batch = torch.randn(3, 6)
    model.eval()
    assert torch.equal(Module.predict_step(model, batch, 0), model(batch))


def test_properties_inside_trainer() -> None:
    seen: dict[str, Any] = {}

    class Probe(Net):
        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            seen.update(
                epoch=self.current_epoch,
                step=self.global_step,
                rank=self.global_rank,
                device=self.device,
                optimizer=self.optimizers(),
                schedulers=self.lr_schedulers(),
            )

    trainer = Trainer(max_steps=3, **quiet())
    trainer.fit(Probe(), loader())
    assert (seen["epoch"], seen["step"], seen["rank"]) == (0, 3, 0)
    assert seen["device"] == torch.device("cpu")
    assert seen["optimizer"].optimizer is trainer.optimizers[0]
    assert seen["schedulers"] is None


def test_print_only_on_rank_zero(capsys: pytest.CaptureFixture[str]) -> None:
    class Printer(Net):
        def on_train_end(self) -> None:
            self.print("hello from", self.global_rank)

    Trainer(max_steps=1, **quiet()).fit(Printer(), loader())
    assert "hello from 0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"value": torch.ones(3)}, "shape"),
        ({"value": "high"}, "got str"),
        ({"value": 1.0, "reduce_fx": "median"}, "reduce_fx"),
        ({"value": 1.0, "on_step": False, "on_epoch": False}, "records nothing"),
    ],
)
def test_bad_log_calls(kwargs: dict[str, Any], match: str) -> None:
    class BadLog(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("metric", **kwargs)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationError, match=match):
        Trainer(max_steps=1, **quiet()).fit(BadLog(), loader())


def test_log_in_unsupported_hook_and_log_dict_type() -> None:
    class FitStartLog(Net):
        def on_fit_start(self) -> None:
            self.log("x", 1.0)

    with pytest.raises(MisconfigurationError, match="on_fit_start"):
        Trainer(max_steps=1, **quiet()).fit(FitStartLog(), loader())

    class DictLog(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log_dict([("a", 1.0)])  # type: ignore[arg-type]
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationError, match="mapping"):
        Trainer(max_steps=1, **quiet()).fit(DictLog(), loader())
