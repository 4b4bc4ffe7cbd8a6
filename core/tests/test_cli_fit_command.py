"""`phalanx fit` as a user runs it: a subprocess, a model module in a folder, a config file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

MODELS = textwrap.dedent(
    '''
    """A user's model file: a Module and a DataModule given to `phalanx fit` by class path."""
    from __future__ import annotations

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from phalanx import DataModule, Module


    class Tiny(Module):
        """Two Linears trained with SGD."""

        def __init__(self, hidden: int = 4, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(3, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
            self.lr = lr

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)


    def batches(size: int = 16, batch_size: int = 4) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(size, 3, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size)


    class Data(DataModule):
        """A fixed dataset, unshuffled."""

        def __init__(self, batch_size: int = 4) -> None:
            super().__init__()
            self.batch_size = batch_size

        def train_dataloader(self) -> DataLoader:
            return batches(batch_size=self.batch_size)
    '''
)

CONFIG = {
    "seed_everything": 11,
    "trainer": {"max_epochs": 1, "limit_train_batches": 3, "enable_progress_bar": False, "default_root_dir": "run"},
    "model": {"class_path": "models.Tiny", "init_args": {"hidden": 5}},
    "data": {"class_path": "models.Data"},
}


def _phalanx(
    *args: str, cwd: Path, columns: int = 100, console_script: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the command; the console script puts no folder on the import path, ``-m`` puts the cwd."""
    script = Path(sys.executable).with_name("phalanx")
    command = [str(script)] if console_script and script.exists() else [sys.executable, "-m", "phalanx.cli"]
    env = {**os.environ, "COLUMNS": str(columns), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    return tmp_path


@pytest.mark.timeout(150)
def test_fit_trains_from_the_config_file_and_saves_the_resolved_config(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _phalanx(
        "fit", "--config", "config.yaml", "--model.init_args.lr", "0.05", cwd=project, console_script=True
    )
    assert result.returncode == 0, result.stderr

    run = project / "run" / "lightning_logs" / "version_0"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"] == {"class_path": "models.Tiny", "init_args": {"hidden": 5, "lr": 0.05}}
    assert saved["trainer"]["limit_train_batches"] == 3 and saved["seed_everything"] == 11
    [checkpoint] = (run / "checkpoints").glob("*.ckpt")
    trained = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]

    # The same run by hand: the user's classes, seed 11, three SGD steps over the same batches.
    monkeypatch.syspath_prepend(str(project))
    import models  # type: ignore[import-not-found]

    torch.manual_seed(11)
    reference = models.Tiny(hidden=5, lr=0.05)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _, (x, y) in zip(range(3), models.batches()):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference.net(x), y).backward()
        optimizer.step()
    assert trained.keys() == reference.state_dict().keys()
    for name, value in reference.state_dict().items():
        assert torch.equal(trained[name], value), name
    sys.modules.pop("models", None)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"model": {"init_args": {"hiden": 3}}},
            [
                "unknown key 'model.init_args.hiden'; closest match: 'model.init_args.hidden'",
                "--model.help models.Tiny",
            ],
        ),
        (
            {"trainer": {"limit_train_batches": "all"}},
            ["wrong type for 'trainer.limit_train_batches'", "Fix: give 'trainer.limit_train_batches' a value of type"],
        ),
    ],
    ids=["unknown-model-argument", "wrong-type"],
)
def test_a_bad_config_exits_non_zero_with_the_key_and_the_fix_and_writes_nothing(
    project: Path, config: dict[str, dict[str, object]], expected: list[str]
) -> None:
    bad = {key: {**value, **config.get(key, {})} if isinstance(value, dict) else value for key, value in CONFIG.items()}
    if "init_args" in config.get("model", {}):
        bad["model"] = {"class_path": "models.Tiny", "init_args": config["model"]["init_args"]}
    (project / "bad.yaml").write_text(yaml.safe_dump(bad))
    result = _phalanx("fit", "--config", "bad.yaml", cwd=project)
    assert result.returncode == 2, result.stderr
    for text in expected:
        assert text in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
    assert not (project / "run").exists()


def test_fit_help_lists_the_arguments_within_100_columns(tmp_path: Path) -> None:
    result = _phalanx("fit", "--help", cwd=tmp_path, columns=200)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    for option in ("--config", "--print_config", "--seed_everything", "--trainer.max_epochs", "--trainer.strategy"):
        assert re.search(rf"^  (-\w CONFIG, )?{re.escape(option)}\b", result.stdout, re.MULTILINE), option
    for option in ("--model", "--data", "--optimizer", "--lr_scheduler", "--ckpt_path"):
        assert option in result.stdout


def test_phalanx_help_lists_every_command(tmp_path: Path) -> None:
    result = _phalanx("--help", cwd=tmp_path)
    assert result.returncode == 0
    commands = re.findall(r"^    (\w+)", result.stdout, re.MULTILINE)
    expected = ["strategies", "plugins", "env", "new", "doctor", "plan", "fit", "validate", "test", "predict", "checkpoint"]
    assert commands == expected


def test_importing_phalanx_cli_imports_neither_torch_nor_jsonargparse() -> None:
    code = "import phalanx.cli; phalanx.cli.main(['strategies', '--json'])"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "phalanx.cli" in imported
    assert not {name for name in imported if name.split(".")[0] in {"torch", "jsonargparse", "yaml"}}


def test_without_jsonargparse_fit_is_one_error_naming_the_extra(tmp_path: Path) -> None:
    # `None` in sys.modules makes `import jsonargparse` fail as if it were not installed.
    code = (
        "import sys; sys.modules['jsonargparse'] = None\n"
        "from phalanx.cli import main\n"
        "print('exit', main(['fit', '--config', 'config.yaml']))\n"
        "try:\n    from phalanx.cli import LightningCLI\n"
        "except ModuleNotFoundError as error:\n    print('import:', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "exit 2" in result.stdout, result.stderr
    assert "Fix: pip install 'phalanx-core[cli]'" in result.stderr and "Traceback" not in result.stderr
    assert "import: phalanx's LightningCLI and `phalanx fit` need jsonargparse" in result.stdout
    assert "pip install 'phalanx-core[cli]'" in result.stdout
