"""Fit 2 epochs to ``s3://bucket/run``, resume ``"last"`` from the bucket to 4: equal to plain PyTorch.

Every strategy writes its own format to a real S3 API server (moto, on loopback) through s3fs:
single files for single_device and ddp, DeepSpeed's directory staged locally and uploaded. The
reference is a hand-written loop in this process: SGD with momentum over the same batches, in
order (two ranks without shuffling take alternate samples, so their averaged gradient is the
gradient of the two batches together).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from remote_fit import BATCH, dataset, layers, optimizer, train
from torch import nn

from phalanx.testing.processes import RANK_VARIABLES, run_command

SCRIPT = Path(__file__).parent / "scripts" / "remote_fit.py"
RUN_TIMEOUT = 240

STRATEGIES = [
    pytest.param("single_device", 1, marks=pytest.mark.timeout(RUN_TIMEOUT), id="single_device"),
    pytest.param("ddp", 2, marks=pytest.mark.timeout(RUN_TIMEOUT + 60), id="ddp-2"),
    pytest.param("fsdp", 2, marks=pytest.mark.timeout(RUN_TIMEOUT + 60), id="fsdp-2"),
    pytest.param("deepspeed_stage_2", 2, marks=pytest.mark.timeout(RUN_TIMEOUT + 60), id="deepspeed_stage_2-2"),
]


def plain_reference(epochs: int, world_size: int) -> dict[str, torch.Tensor]:
    """What ``epochs`` epochs on ``world_size`` ranks must produce, written by hand."""
    model = layers()
    opt = optimizer(model.parameters())
    x, y = dataset().tensors
    step = BATCH * world_size
    for _ in range(epochs):
        for start in range(0, len(x), step):
            opt.zero_grad()
            nn.functional.mse_loss(model(x[start : start + step]), y[start : start + step]).backward()
            opt.step()
    return {f"net.{key}": value for key, value in model.state_dict().items()}


def run(mode: str, strategy: str, devices: int, root: str, epochs: int, out: Path, env: dict[str, str]) -> None:
    """Run the script in its own session; kill the whole group when it outlives its timeout."""
    command = [sys.executable, str(SCRIPT), mode, strategy, str(devices), root, str(epochs), str(out)]
    extra = {**env, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1"}
    for name in RANK_VARIABLES:  # env is a whole environment: its rank variables go too
        extra.pop(name, None)
    done = run_command(command, cwd=out.parent, env=extra, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.output()[-6000:]}"
    done.check_leftovers()


def result(out: Path) -> dict[str, Any]:
    return torch.load(out / "result.pt", weights_only=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("strategy", "devices"), STRATEGIES)
def test_fit_then_resume_last_from_the_bucket(
    tmp_path: Path, bucket: str, s3_env: dict[str, str], strategy: str, devices: int
) -> None:
    import s3fs

    root = f"s3://{bucket}/run"
    out = tmp_path / "out"
    if strategy == "single_device":  # no re-run per rank: in this process, two Trainers in a row
        train("both", strategy, devices, root, 4, str(out))
    else:
        run("both", strategy, devices, root, 4, out, s3_env)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    stored = [path.removeprefix(f"{bucket}/run/") for path in fs.find(f"{bucket}/run")]
    for version in (0, 1):  # the first fit's and the resumed fit's logs and checkpoints
        folder = f"lightning_logs/version_{version}"  # the default logger's: CSV or TensorBoard
        assert any(p.startswith((f"{folder}/metrics.csv", f"{folder}/events.out.tfevents")) for p in stored), stored
        assert any(p.startswith(f"lightning_logs/version_{version}/checkpoints/last.ckpt") for p in stored), stored
    assert not any(".partial" in p for p in stored), stored  # no staging left behind
    assert not Path("s3:").exists() and not (tmp_path / "s3:").exists()  # nothing went to a local folder

    resumed = result(out)
    assert resumed["ckpt_path"] == f"{root}/lightning_logs/version_0/checkpoints/last.ckpt"
    assert resumed["global_step"] == 4 * len(dataset()) // (BATCH * devices)
    expected = plain_reference(4, devices)
    if strategy == "fsdp":  # sharded parameters: read the final sharded checkpoint from the bucket
        from phalanx.checkpoint_io.dcp import load_full_model_state

        final, _ = load_full_model_state(f"{root}/lightning_logs/version_1/checkpoints/last.ckpt")
        resumed["weights"] = final
    assert resumed["weights"].keys() == expected.keys()
    for key, want in expected.items():
        torch.testing.assert_close(resumed["weights"][key], want, rtol=0, atol=1e-6, msg=key)
