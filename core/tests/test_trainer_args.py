"""Every bad Trainer argument and entry-point input fails up front with one clear message."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from trainer_helpers import Net, loader, quiet

from phalanx.callbacks.progress import TQDMProgressBar
from phalanx.errors import MisconfigurationError, UnknownNameError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer

BAD_ARGUMENTS = [
    ("accelerator", 5),
    ("accelerator", "tpuu"),
    ("strategy", 3),
    ("strategy", "ddpp"),
    ("devices", 0),
    ("devices", -2),
    ("devices", "abc"),
    ("devices", [0, 1]),
    ("devices", 1.5),
    ("devices", True),
    ("num_nodes", 0),
    ("num_nodes", "2"),
    ("num_nodes", True),
    ("precision", "16x"),
    ("precision", 8),
    ("precision", True),
    ("plugins", 5),
    ("plugins", "nope"),
    ("callbacks", "cb"),
    ("callbacks", [object()]),
    ("logger", "no_such_logger"),
    ("logger", 5),
    ("max_epochs", -2),
    ("max_epochs", 1.5),
    ("max_epochs", "3"),
    ("max_steps", -2),
    ("max_steps", 10.0),
    ("limit_train_batches", -1),
    ("limit_train_batches", 1.5),
    ("limit_val_batches", "all"),
    ("limit_test_batches", -0.5),
    ("limit_predict_batches", True),
    ("val_check_interval", 0),
    ("val_check_interval", 0.0),
    ("val_check_interval", 1.5),
    ("val_check_interval", "1"),
    ("check_val_every_n_epoch", 0),
    ("check_val_every_n_epoch", 1.5),
    ("accumulate_grad_batches", 0),
    ("accumulate_grad_batches", 2.0),
    ("accumulate_grad_batches", True),
    ("gradient_clip_val", -1.0),
    ("gradient_clip_val", "1"),
    ("gradient_clip_algorithm", "l2"),
    ("log_every_n_steps", 0),
    ("log_every_n_steps", 1.5),
    ("enable_checkpointing", 1),
    ("default_root_dir", 5),
    ("deterministic", "yes"),
    ("deterministic", 1),
    ("use_distributed_sampler", 0),
    ("sync_batchnorm", "true"),
    ("fast_dev_run", 1.5),
    ("num_sanity_val_steps", -2),
    ("overfit_batches", 1.5),
    ("min_epochs", -1),
    ("min_steps", "5"),
    ("max_time", "ten minutes"),
    ("inference_mode", 1),
    ("detect_anomaly", "yes"),
    ("benchmark", 1),
    ("reload_dataloaders_every_n_epochs", -1),
    ("profiler", "fastest"),
    ("enable_model_summary", 1),
    ("enable_autolog_hparams", None),
    ("barebones", 1),
    ("model_registry", "hub"),
]


@pytest.mark.parametrize(
    ("name", "value"), BAD_ARGUMENTS, ids=[re.sub(r" at 0x[0-9a-f]+", "", f"{n}={v!r}") for n, v in BAD_ARGUMENTS]
)
def test_bad_trainer_argument(name: str, value: Any) -> None:
    with pytest.raises(MisconfigurationError) as info:
        Trainer(**{**quiet(), name: value})
    message = str(info.value)
    shown = name if name not in ("devices", "precision", "plugins", "accelerator", "strategy") else repr(value)[:6]
    assert shown in message or name in message


def test_unknown_names_suggest_the_closest() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'single_device'"):
        Trainer(strategy="single_devic", **quiet())
    with pytest.raises(MisconfigurationError, match="Did you mean '16-mixed'"):
        Trainer(precision="16-mixd", **quiet())


def test_conflicting_flags() -> None:
    with pytest.raises(MisconfigurationError, match="enable_progress_bar=False"):
        Trainer(enable_progress_bar=False, callbacks=[TQDMProgressBar()], logger=False)
    with pytest.raises(MisconfigurationError, match="runs one process"):
        Trainer(strategy="single_device", accelerator="cpu", devices=2, **quiet())
    from phalanx.precision import DoublePrecision

    with pytest.raises(MisconfigurationError, match="plugins"):
        Trainer(precision="bf16-mixed", plugins=[DoublePrecision()], **quiet())
    with pytest.raises(MisconfigurationError, match="two precision"):
        Trainer(plugins=[DoublePrecision(), DoublePrecision()], **quiet())


class NoStep(Module):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


class NoOptim(Module):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.zeros((), requires_grad=True)


def test_bad_models() -> None:
    trainer = Trainer(**quiet())
    with pytest.raises(MisconfigurationError, match=r"expects a phalanx\.Module"):
        trainer.fit(torch.nn.Linear(2, 2), loader())
    with pytest.raises(MisconfigurationError, match="does not define training_step"):
        trainer.fit(NoStep(), loader())
    with pytest.raises(MisconfigurationError, match="does not define configure_optimizers"):
        trainer.fit(NoOptim(), loader())
    with pytest.raises(MisconfigurationError, match="does not define validation_step"):
        trainer.validate(NoOptim(), loader())
    with pytest.raises(MisconfigurationError, match="does not define test_step"):
        trainer.test(NoOptim(), loader())
    with pytest.raises(MisconfigurationError, match="needs a model"):
        Trainer(**quiet()).validate(dataloaders=loader())


def test_bad_data() -> None:
    trainer = Trainer(**quiet())
    with pytest.raises(MisconfigurationError, match="train_dataloaders=5"):
        trainer.fit(Net(), 5)
    with pytest.raises(MisconfigurationError, match="no training data"):
        trainer.fit(Net())
    with pytest.raises(MisconfigurationError, match="val_dataloaders"):
        trainer.fit(Net(), loader(), val_dataloaders=object())
    with pytest.raises(MisconfigurationError, match="no data"):
        trainer.test(Net())
    with pytest.raises(MisconfigurationError, match="val_check_interval=50"):
        Trainer(val_check_interval=50, **quiet()).fit(Net(), loader(), loader(n=4))
    with pytest.raises(MisconfigurationError, match="rounds to 0"):
        Trainer(limit_train_batches=0.01, **quiet()).fit(Net(), loader())


def test_bad_step_outputs_and_optimizers() -> None:
    class Stringy(Net):
        def training_step(self, batch: Any, batch_idx: int) -> str:
            return "loss"

    class NoLossKey(Net):
        def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            return {"value": torch.zeros(())}

    class TwoOptimizers(Net):
        def configure_optimizers(self) -> list[torch.optim.Optimizer]:
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]

    class NoneOptimizer(Net):
        def configure_optimizers(self) -> None:
            return None

    with pytest.raises(MisconfigurationError, match="returned str"):
        Trainer(max_steps=1, **quiet()).fit(Stringy(), loader())
    with pytest.raises(MisconfigurationError, match="'loss' key"):
        Trainer(max_steps=1, **quiet()).fit(NoLossKey(), loader())
    with pytest.raises(RuntimeError, match="2 optimizers"):  # Lightning's type
        Trainer(max_steps=1, **quiet()).fit(TwoOptimizers(), loader())
    with pytest.raises(MisconfigurationError, match="no optimizer"):
        Trainer(max_steps=1, **quiet()).fit(NoneOptimizer(), loader())


def test_training_step_returning_none_skips_the_batch() -> None:
    class Skipper(Net):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return None if batch_idx % 2 else super().training_step(batch, batch_idx)

    model = Skipper()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader())
    assert trainer.global_step == 10


def test_pl_trainer_environment_variables_give_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_ACCELERATOR", "cpu")  # not a Python literal: taken as a string
    trainer = Trainer()
    assert trainer.logger is None and trainer.max_steps == 7 and trainer.accelerator.__class__.__name__ == "CPUAccelerator"
    assert Trainer(max_steps=42).max_steps == 42  # an argument passed wins
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "-5")
    with pytest.raises(MisconfigurationError, match="max_steps=-5"):  # checked like the argument itself
        Trainer()


def test_max_epochs_none_is_settled_by_fit() -> None:
    from phalanx.utilities.warnings import PossibleUserWarning

    trainer = Trainer(max_steps=2, **quiet())
    assert trainer.max_epochs is None
    trainer.fit(Net(), loader())
    assert trainer.max_epochs == -1  # max_steps bounds the run

    class StopAtOnce(Net):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.trainer.should_stop = True
            return super().training_step(batch, batch_idx)

    trainer = Trainer(limit_train_batches=1, **quiet())
    with pytest.warns(PossibleUserWarning, match="`max_epochs` was not set. Setting it to 1000 epochs"):
        trainer.fit(StopAtOnce(), loader())
    assert trainer.max_epochs == 1000 and trainer.current_epoch == 1
    assert Trainer(fast_dev_run=True).max_epochs == 1


@pytest.mark.parametrize("interval", ["00:00:00:02", {"seconds": 2}, __import__("datetime").timedelta(seconds=2)])
def test_time_based_val_check_interval(interval: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import itertools
    import time

    clock = itertools.count(0, 2)  # every reading is 2 s after the previous one
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))

    class CountValidations(Net):
        validations = 0

        def on_validation_epoch_start(self) -> None:
            if not self.trainer.sanity_checking:
                self.validations += 1

    model = CountValidations()
    trainer = Trainer(**quiet(max_steps=5, limit_val_batches=1, val_check_interval=interval))
    assert trainer.val_check_interval == __import__("datetime").timedelta(seconds=2)
    trainer.fit(model, loader(), loader())
    assert model.validations == 5  # one reading per batch: 2 s have always passed


@pytest.mark.parametrize("interval", ["00:00:02", "1 minute", {"second": 2}, "00:00:00:00"])
def test_a_bad_duration_names_the_forms(interval: Any) -> None:
    with pytest.raises(MisconfigurationError, match="DD:HH:MM:SS"):
        Trainer(val_check_interval=interval)
