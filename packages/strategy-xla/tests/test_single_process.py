"""single_xla, xla (one device, through torch-xla's launcher) and xla_debug, for real on XLA:CPU.

Each run trains the demo model and must reproduce the hand-written CPU loop's losses step by
step, so a strategy that skipped the optimizer step, moved the wrong tensors or cut the graph in
the wrong place fails here. These run in the pytest process (one XLA device, no SPMD).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

import subprocess
import sys

import torch
import torch_xla.runtime as xr
from _demo import EPOCHS, DemoModel, cpu_reference_losses, make_loader

from phalanx import Trainer

TOLERANCE = 1e-4

# Start XLA before any CPU backward runs in this process: once torch's autograd engine has started
# without XLA devices, every later XLA backward fails (pytorch/xla issue 4174).
xr.global_runtime_device_count()


def _fit(strategy: str, tmp_path: Path, **trainer_kwargs: object) -> tuple[Trainer, DemoModel]:
    model = DemoModel()
    trainer = Trainer(
        accelerator=trainer_kwargs.pop("accelerator", "xla"),
        strategy=strategy,
        devices=1,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp_path),
        **trainer_kwargs,
    )
    trainer.fit(model, make_loader())
    return trainer, model


def _assert_matches_reference(losses: list[float]) -> None:
    reference = cpu_reference_losses()
    assert len(losses) == len(reference) == 4 * EPOCHS
    worst = max(abs(a - b) for a, b in zip(losses, reference))
    assert worst < TOLERANCE, f"XLA losses {losses} differ from CPU {reference} by {worst}"
    assert losses[-1] < losses[0]  # and it learned something


def test_single_xla_matches_plain_cpu_pytorch_per_step(tmp_path: Path) -> None:
    trainer, model = _fit("single_xla", tmp_path)
    _assert_matches_reference(model.losses)
    assert model.seen["x_device"].startswith("xla")  # batches really ran on the XLA device
    assert type(trainer.strategy).__name__ == "SingleDeviceXLAStrategy"
    assert next(model.parameters()).device.type == "cpu"  # teardown hands the weights back on CPU


def test_xla_with_one_device_runs_through_torch_xla_launcher(tmp_path: Path) -> None:
    trainer, model = _fit("xla", tmp_path)
    _assert_matches_reference(model.losses)
    assert model.seen["x_device"].startswith("xla")
    assert type(trainer.strategy.launcher).__name__ == "XLALauncher"
    assert trainer.world_size == 1


def test_xla_debug_prints_torch_xla_metrics_report(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _, model = _fit("xla_debug", tmp_path)
    _assert_matches_reference(model.losses)
    out = capfd.readouterr().out
    assert "[phalanx xla_debug] torch-xla metrics after training" in out
    assert "CompileTime" in out and "ExecuteTime" in out


def test_auto_picks_xla_and_single_xla_when_pjrt_device_is_set(tmp_path: Path) -> None:
    trainer = Trainer(accelerator="auto", strategy="auto", devices=1, logger=False, default_root_dir=str(tmp_path))
    assert type(trainer.strategy).__name__ == "SingleDeviceXLAStrategy"
    assert type(trainer.strategy.accelerator).__name__ == "XLAAccelerator"


def test_bf16_true_becomes_xla_precision_with_bfloat16_weights(tmp_path: Path) -> None:
    trainer, model = _fit("single_xla", tmp_path, precision="bf16-true")
    assert type(trainer.strategy.precision_plugin).__name__ == "XLAPrecision"
    assert model.seen["param_dtype"] == "torch.bfloat16"
    reference = cpu_reference_losses()
    assert abs(model.losses[0] - reference[0]) < 2e-2  # bfloat16 keeps ~3 significant digits
    assert model.losses[-1] < model.losses[0]


def test_full_checkpoint_is_one_portable_cpu_file(tmp_path: Path) -> None:
    trainer, model = _fit("single_xla", tmp_path)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    assert all(t.device.type == "cpu" for t in loaded["state_dict"].values())
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded["state_dict"][name], tensor.cpu()), name
    assert loaded["optimizer_states"][0]["state"]  # Adam moments came along

    resumed = DemoModel()
    trainer2 = Trainer(accelerator="xla", strategy="single_xla", devices=1, max_epochs=EPOCHS + 1, logger=False,
                       enable_checkpointing=False, enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer2.fit(resumed, make_loader(), ckpt_path=str(path))
    reference = cpu_reference_losses(epochs=EPOCHS + 1)
    assert len(resumed.losses) == 4  # only the third epoch ran
    worst = max(abs(a - b) for a, b in zip(resumed.losses, reference[-4:]))
    assert worst < TOLERANCE, (resumed.losses, reference[-4:])


@pytest.mark.timeout(360)  # above the subprocess's own 300 s, which fires first
def test_cpu_backward_before_xla_starts_gets_an_explanation_not_an_internal_assert(tmp_path: Path) -> None:
    code = (
        "import torch; w = torch.ones(2, requires_grad=True); (w * 2).sum().backward();"  # CPU autograd first
        "from _demo import DemoModel, make_loader; from phalanx import Trainer;"
        "Trainer(accelerator='xla', strategy='single_xla', devices=1, max_epochs=1, logger=False,"
        f" enable_checkpointing=False, enable_progress_bar=False, default_root_dir={str(tmp_path)!r})"
        ".fit(DemoModel(), make_loader())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "PhalanxError" in proc.stderr and "pytorch/xla issue 4174" in proc.stderr, proc.stderr[-3000:]
    assert "torch_xla.runtime.global_runtime_device_count()" in proc.stderr
