"""A killed upload, a store that cannot be reached, missing credentials: "last" stays complete.

The writer is a real run against the real S3 API server: its second save carries a 112 MiB
tensor, which s3fs uploads in parts; the test kills the run's process group with SIGKILL while
the server reports that multipart upload in progress. The object only appears when an upload
completes, so the bucket must still resolve "last" to the first epoch's checkpoint, complete,
and a resume from it must train exactly like plain PyTorch.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from remote_fit import BATCH, dataset, train
from test_remote_fit import SCRIPT, plain_reference

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.errors import CheckpointError, PhalanxError
from phalanx.testing.processes import Job
from phalanx.trainer.checkpointing import find_last_checkpoint

STEPS_PER_EPOCH = len(dataset()) // BATCH


def _uploads(bucket: str) -> list[str]:
    import boto3

    client = boto3.client("s3")
    return [upload["Key"] for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.mark.timeout(300)
def test_kill_during_an_upload_leaves_the_previous_checkpoint_as_last(
    tmp_path: Path, bucket: str, s3_env: dict[str, str]
) -> None:
    import s3fs

    root = f"s3://{bucket}/run"
    env = {**s3_env, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPT), "kill", "single_device", "1", root, "2", str(tmp_path / "out")]
    job = Job(command, tmp_path, env=env, warm=True)
    killed_during: list[str] = []
    try:
        deadline = time.monotonic() + 200
        while job.poll() is None and time.monotonic() < deadline:
            killed_during = _uploads(bucket)
            if killed_during:
                job.signal_group(signal.SIGKILL)
                break
            time.sleep(0.02)
        job.wait(30)
    finally:
        job.kill_leftovers()
    output = job.output()
    assert killed_during, f"the run ended (exit {job.process.returncode}) before an upload was seen:\n{output[-3000:]}"

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    checkpoints = f"{root}/lightning_logs/version_0/checkpoints"
    names = sorted(path.rpartition("/")[2] for path in fs.ls(checkpoints.removeprefix("s3://")))
    assert names == ["epoch=0-step=8.ckpt", "last.ckpt"], names  # nothing of the killed save is visible
    trainer = Trainer(accelerator="cpu", default_root_dir=root, logger=False, enable_progress_bar=False)
    trainer_with_logs = Trainer(accelerator="cpu", default_root_dir=root, enable_progress_bar=False)
    for view in (trainer, trainer_with_logs):
        last = find_last_checkpoint(view)
        assert last is not None and last.startswith(checkpoints), last
    previous = trainer.strategy.load_checkpoint(f"{checkpoints}/last.ckpt")
    assert previous["global_step"] == STEPS_PER_EPOCH and "ballast" not in previous

    out = tmp_path / "resumed"
    train("resume", "single_device", 1, root, 2, str(out))  # resumes "last": the first epoch's state
    resumed = torch.load(out / "result.pt", weights_only=True)
    assert resumed["ckpt_path"] == f"{checkpoints}/last.ckpt" and resumed["global_step"] == 2 * STEPS_PER_EPOCH
    for key, want in plain_reference(2, 1).items():
        torch.testing.assert_close(resumed["weights"][key], want, rtol=0, atol=1e-6, msg=key)


def _objects(bucket: str) -> dict[str, str]:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    return {info["name"]: info["ETag"] for info in fs.find(bucket, detail=True).values()}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("fault", ["unreachable", "no-credentials"])
def test_a_store_that_fails_gives_one_error_naming_the_url(
    tmp_path: Path, bucket: str, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    import s3fs

    root = f"s3://{bucket}/run"
    train("fit", "single_device", 1, root, 1, str(tmp_path / "first"))
    before = _objects(bucket)
    assert any(key.endswith("checkpoints/last.ckpt") for key in before), before

    if fault == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    else:
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3fs.S3FileSystem.clear_instance_cache()
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        callbacks=[ModelCheckpoint(save_last=True)],
    )
    from remote_fit import Net

    with pytest.raises((CheckpointError, PhalanxError)) as error:
        trainer.fit(Net(), torch.utils.data.DataLoader(dataset(), batch_size=BATCH))
    text = str(error.value)
    assert f"{root}/checkpoints/" in text and "Fix:" in text, text
    assert "untouched" in text, text

    for key, value in s3_env.items():  # the real endpoint and credentials again
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    assert _objects(bucket) == before  # the previous checkpoint and logs are untouched


def _closed_port() -> int:
    """A loopback port with nothing listening (bound, then closed)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
