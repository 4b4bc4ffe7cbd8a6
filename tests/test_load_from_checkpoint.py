"""``Module.load_from_checkpoint`` rebuilds a model trained under each strategy, from that strategy's checkpoint.

A script trains a tiny Module on 2 CPU ranks (gloo) with ddp, fsdp, model_parallel (tensor parallel
over 2 ranks) or deepspeed (ZeRO 2), saves a checkpoint at the end of training (a file for ddp, a
directory of shards for the others) and rank 0 saves the trained weights, gathered to full tensors.
This process, with no process group, then loads the checkpoint with ``Net.load_from_checkpoint``:
the model must be rebuilt from the saved hyperparameters alone and hold exactly the trained weights,
and loading must write nothing (directories are converted in a temporary folder that is removed).
Needs the strategy plugins: this runs in the integration session.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

from phalanx.discovery import convert_checkpoint
from phalanx.testing import run_command

#: One training run's limit; the pytest timeout leaves room for loading and the clean kill.
RUN_TIMEOUT = 240
pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 60)

HPARAMS = {"hidden": 12, "lr": 0.05, "note": "trained"}

MODEL_SOURCE = '''
"""The model trained under each strategy and loaded back by the test (both import this file)."""

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import phalanx


class Net(phalanx.Module):
    def __init__(self, hidden: int, lr: float = 0.1, *, note: str = "") -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.w1 = nn.Linear(8, hidden)
        self.w2 = nn.Linear(hidden, 1)

    def configure_model(self) -> None:
        mesh = self.device_mesh  # None outside a run (load_from_checkpoint calls this too)
        if mesh is not None and "tensor_parallel" in (mesh.mesh_dim_names or ()):
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(self, mesh["tensor_parallel"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.tanh(self.w1(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)
'''

TRAIN_SOURCE = '''
"""Usage: python train.py STRATEGY. Trains 3 steps on 2 CPU ranks; writes STRATEGY.ckpt and reference.pt."""

import sys

import torch
from lfc_model import Net, data

import phalanx
from phalanx.callbacks import Callback

STRATEGY = sys.argv[1]


class SaveAtTrainEnd(Callback):
    """Save while the strategy still runs (after fit, DeepSpeed writes one file, not its shards)."""

    def on_train_end(self, trainer, pl_module):
        trainer.save_checkpoint(f"{STRATEGY}.ckpt")
        # DTensor shards (fsdp, tensor parallel) gathered to full tensors; a collective, so every rank
        full = {k: getattr(v, "full_tensor", lambda v=v: v)().detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        if trainer.is_global_zero:
            torch.save(full, "reference.pt")


if STRATEGY == "model_parallel":
    from phalanx.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
else:
    strategy = STRATEGY
trainer = phalanx.Trainer(
    accelerator="cpu", devices=2, strategy=strategy, max_steps=3, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, callbacks=[SaveAtTrainEnd()],
)
trainer.fit(Net(hidden=12, lr=0.05, note="trained"), data())
'''

_PLUGINS = {
    "ddp": "phalanx_strategy_ddp",
    "fsdp": "phalanx_strategy_fsdp",
    "model_parallel": "phalanx_strategy_model_parallel",
    "deepspeed": "phalanx_strategy_deepspeed",
}


def _tree(root: Path) -> set[str]:
    return {os.path.join(folder, name) for folder, dirs, files in os.walk(root) for name in dirs + files}


def _import_model(folder: Path, strategy: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"lfc_model_{strategy}", folder / "lfc_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``tempfile`` use a folder of this test's own, so "nothing left behind" can be checked exactly."""
    folder = tmp_path / "system_tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("strategy", list(_PLUGINS))
def test_each_strategys_checkpoint_loads_the_trained_model(
    tmp_path: Path, private_tmp: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(_PLUGINS[strategy], reason="the integration session installs every plugin")
    if strategy == "deepspeed":
        # Converting the shards imports deepspeed here, whose import does setdefault(this, "1"):
        # set it first through monkeypatch, which restores the environment after the test.
        monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    run = tmp_path / "run"
    run.mkdir()
    (run / "lfc_model.py").write_text(textwrap.dedent(MODEL_SOURCE))
    (run / "train.py").write_text(textwrap.dedent(TRAIN_SOURCE))
    # a marked job in its own session: killed whole on timeout, and it must leave no process behind
    run_command(
        [str(run / "train.py"), strategy], cwd=run, logs=run, timeout=RUN_TIMEOUT, env={"OMP_NUM_THREADS": "1"}
    ).check()

    checkpoint = run / f"{strategy}.ckpt"
    assert checkpoint.is_dir() is (strategy != "ddp")
    # the hyperparameters are in the checkpoint and survive `phalanx checkpoint convert`
    convert_checkpoint(str(checkpoint), str(tmp_path / "portable.ckpt"))
    portable = torch.load(tmp_path / "portable.ckpt", weights_only=True)
    assert portable["hyper_parameters"] == HPARAMS and portable["hparams_name"] == "kwargs"

    net_class = _import_model(run, strategy).Net
    before = _tree(tmp_path)
    loaded = net_class.load_from_checkpoint(checkpoint)
    assert _tree(tmp_path) == before  # nothing written, the temporary conversion removed

    assert type(loaded) is net_class and dict(loaded.hparams) == HPARAMS
    reference = torch.load(run / "reference.pt", weights_only=True)
    state = loaded.state_dict()
    assert list(state) == list(reference) == ["w1.weight", "w1.bias", "w2.weight", "w2.bias"]
    for key, value in reference.items():
        assert torch.equal(state[key], value), f"{strategy}: {key} differs from the trained weights"
    untrained = net_class(**HPARAMS).state_dict()
    assert not torch.equal(untrained["w1.weight"], reference["w1.weight"])  # it did train
