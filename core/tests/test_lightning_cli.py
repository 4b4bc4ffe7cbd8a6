"""LightningCLI in-process: real parsing, real fits, real files; weights checked against Trainer and plain PyTorch."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from trainer_helpers import loader

from phalanx._cli.lightning_cli import LightningCLI
from phalanx._cli.lightning_cli_parser import keep_none
from phalanx._cli.lightning_cli_save import SaveConfigCallback
from phalanx.callbacks.early_stopping import EarlyStopping
from phalanx.datamodule import DataModule
from phalanx.loggers.csv_logs import CSVLogger
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer
from phalanx.utilities.seed import SEED_ENV, SEED_WORKERS_ENV, seed_everything

# pytest's own sys.argv makes LightningCLI warn that `args=` and a command line were both given.
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


@pytest.fixture(autouse=True)
def _restore_seed_env() -> Iterator[None]:
    """seed_everything records its seed in the environment; put the environment back afterwards."""
    saved = {key: os.environ.pop(key, None) for key in (SEED_ENV, SEED_WORKERS_ENV)}
    yield
    for key, value in saved.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value


QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


class Regressor(Module):
    """Two Linears trained with SGD: a few steps' weights pin down seed, data order and optimizer."""

    def __init__(self, hidden: int = 4, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class RegressionData(DataModule):
    """A fixed regression dataset, unshuffled."""

    def __init__(self, batch_size: int = 4, size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.size = size

    def train_dataloader(self) -> Any:
        return loader(self.size, self.batch_size)

    def val_dataloader(self) -> Any:
        return loader(8, self.batch_size, seed=1)


def _plain(seed: int, steps: int, make_optimizer: Any, hidden: int = 5) -> Regressor:
    """What a user writes by hand: the same model, seed, batches and optimizer, no Trainer."""
    seed_everything(seed)
    model = Regressor(hidden=hidden)
    optimizer = make_optimizer(model.parameters())
    for _, (x, y) in zip(range(steps), loader(16, 4)):
        optimizer.zero_grad()
        nn.functional.mse_loss(model.net(x), y).backward()
        optimizer.step()
    return model


def _assert_same_weights(*models: nn.Module) -> None:
    first = models[0].state_dict()
    for other in models[1:]:
        for name, value in other.state_dict().items():
            assert torch.equal(value, first[name]), name


def test_fit_trains_the_same_weights_as_trainer_and_plain_pytorch(tmp_path: Path) -> None:
    args = ["fit", "--seed_everything=7", "--model.hidden=5", "--model.lr=0.1", "--trainer.max_steps=3"]
    cli = LightningCLI(
        Regressor, RegressionData, args=[*args, *QUIET, f"--trainer.default_root_dir={tmp_path / 'cli'}"]
    )
    assert cli.subcommand == "fit" and cli.trainer.global_step == 3

    seed_everything(7, workers=True)
    direct = Regressor(hidden=5, lr=0.1)
    initial = direct.net[0].weight.detach().clone()
    trainer = Trainer(
        max_steps=3, default_root_dir=tmp_path / "direct", enable_progress_bar=False, enable_model_summary=False
    )
    trainer.fit(direct, datamodule=RegressionData())

    plain = _plain(7, 3, lambda params: torch.optim.SGD(params, lr=0.1))
    _assert_same_weights(cli.model, direct, plain)
    assert not torch.equal(initial, cli.model.net[0].weight)  # it really trained


def test_optimizer_and_lr_scheduler_from_the_command_line_replace_configure_optimizers(tmp_path: Path) -> None:
    args = ["--seed_everything=3", "--model.hidden=5", "--optimizer=Adam", "--optimizer.lr=0.01"]
    args += ["--lr_scheduler=StepLR", "--lr_scheduler.step_size=100", "--trainer.max_steps=3", *QUIET]
    with pytest.warns(UserWarning, match="configure_optimizers` will be overridden"):
        cli = LightningCLI(Regressor, RegressionData, run=False, args=[*args, f"--trainer.default_root_dir={tmp_path}"])
    optimizers, schedulers = cli.model.configure_optimizers()
    assert type(optimizers[0]) is torch.optim.Adam and optimizers[0].param_groups[0]["lr"] == 0.01
    assert type(schedulers[0]) is torch.optim.lr_scheduler.StepLR and schedulers[0].step_size == 100
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    _assert_same_weights(cli.model, _plain(3, 3, lambda params: torch.optim.Adam(params, lr=0.01)))


def test_config_yaml_is_saved_equal_to_the_resolved_config_and_never_overwritten(tmp_path: Path) -> None:
    # No logger: the log dir is default_root_dir itself, so a second run lands on the same file.
    args = ["fit", "--seed_everything=7", "--model.hidden=5", "--trainer.max_steps=1", "--trainer.logger=false", *QUIET]
    args.append(f"--trainer.default_root_dir={tmp_path}")
    cli = LightningCLI(Regressor, RegressionData, args=args)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    resolved = yaml.safe_load(cli.parser.dump(cli.config, **keep_none()))["fit"]
    assert saved == resolved
    assert saved["seed_everything"] == 7 and saved["model"] == {"hidden": 5, "lr": 0.05}
    assert saved["trainer"]["max_steps"] == 1 and saved["trainer"]["logger"] is False

    with pytest.raises(RuntimeError, match="config.yaml to NOT exist"):
        LightningCLI(Regressor, RegressionData, args=[*args, "--model.hidden=6"])
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["hidden"] == 5

    LightningCLI(Regressor, RegressionData, args=[*args, "--model.hidden=6"], save_config_kwargs={"overwrite": True})
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["hidden"] == 6


def test_print_config_prints_a_config_that_parses_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "fit",
        "--model.hidden=6",
        "--trainer.max_steps=2",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        *QUIET,
    ]
    with pytest.raises(SystemExit) as stop:
        LightningCLI(Regressor, RegressionData, args=[*args, "--print_config"])
    assert stop.value.code == 0
    assert not (tmp_path / "run").exists()  # printing trains and writes nothing
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"] == {"hidden": 6, "lr": 0.05} and printed["trainer"]["max_steps"] == 2

    config = tmp_path / "printed.yaml"
    config.write_text(yaml.safe_dump(printed))
    cli = LightningCLI(Regressor, RegressionData, args=["fit", "--config", str(config)])
    assert cli.model.net[0].out_features == 6 and cli.trainer.global_step == 2
    again = yaml.safe_load(cli.parser.dump(cli.config, **keep_none()))["fit"]
    assert {k: v for k, v in again.items() if k != "seed_everything"} == {
        k: v for k, v in printed.items() if k != "seed_everything"
    }


def _fail(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        LightningCLI(Regressor, RegressionData, args=args)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_unknown_key_in_a_config_file_is_one_error_with_the_key_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("trainer:\n  max_epoch: 3\n")
    error = _fail(["fit", "--config", str(config), f"--trainer.default_root_dir={tmp_path / 'run'}"], capsys)
    assert "error: unknown key 'trainer.max_epoch'; closest match: 'trainer.max_epochs'" in error
    assert "Fix: rename it to 'trainer.max_epochs'" in error
    assert "usage:" not in error  # one error, not the 40-line usage block
    assert not (tmp_path / "run").exists()


def test_wrong_type_in_a_config_file_names_the_key_the_type_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  hidden: five\n")
    error = _fail(["fit", "--config", str(config), f"--trainer.default_root_dir={tmp_path / 'run'}"], capsys)
    assert "wrong type for 'model.hidden': expected int, got 'five'" in error
    assert "Fix: give 'model.hidden' a value of type int" in error
    assert not (tmp_path / "run").exists()


def test_run_false_with_dict_args_instantiates_everything_and_runs_nothing(tmp_path: Path) -> None:
    args = {
        "model": {"hidden": 3},
        "trainer": {"max_steps": 2, "default_root_dir": str(tmp_path)},
        "seed_everything": 5,
    }
    cli = LightningCLI(Regressor, RegressionData, run=False, args=args)
    assert cli.subcommand is None
    assert isinstance(cli.model, Regressor) and cli.model.net[0].out_features == 3
    assert isinstance(cli.datamodule, RegressionData)
    assert cli.trainer.max_steps == 2 and cli.trainer.global_step == 0
    assert cli.config["seed_everything"] == 5
    assert list(tmp_path.iterdir()) == []


def test_strategy_by_name_logger_and_callbacks_by_class_path_and_trainer_defaults(tmp_path: Path) -> None:
    logger = json.dumps({"class_path": "phalanx.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path)}})
    args = ["--trainer.strategy=single_device", f"--trainer.logger={logger}"]
    args += ["--trainer.callbacks+=phalanx.callbacks.EarlyStopping", "--trainer.callbacks.monitor=train_loss"]
    keep = EarlyStopping(monitor="always_there")
    cli = LightningCLI(
        Regressor, RegressionData, run=False, args=args, trainer_defaults={"max_steps": 4, "callbacks": [keep]}
    )
    assert type(cli.trainer.strategy).__name__ == "SingleDeviceStrategy"
    assert isinstance(cli.trainer.logger, CSVLogger) and cli.trainer.logger.save_dir == str(tmp_path)
    monitors = [c.monitor for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert monitors == ["train_loss", "always_there"]
    assert cli.trainer.max_steps == 4
    assert sum(isinstance(c, SaveConfigCallback) for c in cli.trainer.callbacks) == 1


def test_validate_with_ckpt_path_rebuilds_the_module_from_the_checkpoint_hyperparameters(tmp_path: Path) -> None:
    common = ["--trainer.logger=false", "--trainer.num_sanity_val_steps=0", *QUIET]
    fit_args = ["fit", "--seed_everything=1", "--model.hidden=7", "--trainer.max_epochs=1", *common]
    fitted = LightningCLI(Regressor, RegressionData, args=[*fit_args, f"--trainer.default_root_dir={tmp_path / 'fit'}"])
    [checkpoint] = (tmp_path / "fit").rglob("*.ckpt")

    args = ["validate", f"--ckpt_path={checkpoint}", "--model.hidden=3", *common]
    cli = LightningCLI(Regressor, RegressionData, args=[*args, f"--trainer.default_root_dir={tmp_path / 'val'}"])
    assert cli.model.net[0].out_features == 7  # the checkpoint's hyperparameters win, as in Lightning
    _assert_same_weights(cli.model, fitted.model)
    x, y = loader(8, 4, seed=1).dataset.tensors
    expected = nn.functional.mse_loss(fitted.model.net(x), y)
    assert torch.allclose(cli.trainer.callback_metrics["val_loss"], expected)
