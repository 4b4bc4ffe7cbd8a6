"""kill -9 of rank 0 in the middle of a checkpoint write, for every checkpoint shape.

The writer really is mid-save when killed: the checkpoint carries an object whose pickling blocks
(after the shards, for sharded formats). Afterwards the previous checkpoint must still load,
``ckpt_path="last"`` must resolve to it and not to the partial write, and (file and DCP) resuming
from it must end with the weights of the uninterrupted plain-PyTorch run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from rel_common import reference_weights
from reliability_helpers import job_env, run_job, running

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.trainer.checkpointing import find_last_checkpoint

CASES = {
    "file": ("ddp", []),
    "async": ("ddp", ["async"]),
    "dcp": ("fsdp", []),
    "deepspeed": ("deepspeed_stage_2", []),
}
#: The formats whose resume is run end to end (one file, one directory); the others are loaded here.
RESUMED = {"file", "dcp"}


def _kill_mid_save(tmp_path: Path, strategy: str, extra: list[str]) -> float:
    marker = tmp_path / "saving"
    with running(tmp_path, "kill_during_save.py", "train", strategy, str(tmp_path), *extra, name="train") as job:
        deadline = time.monotonic() + 150
        while not marker.exists():
            assert job.poll() is None, f"the job ended before its second save\n{job.output()[-4000:]}"
            assert time.monotonic() < deadline, job.output()[-4000:]
            time.sleep(0.02)
        os.kill(job.pid, signal.SIGKILL)  # rank 0 (the launcher); the other ranks die with it
        killed = time.monotonic()
        job.wait(30)
        left = job.leftovers()
        assert not left, f"processes left behind: {left}"
    return killed


def _last(tmp_path: Path) -> str | None:
    trainer = Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp_path),
        callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "ckpts"))],
    )
    return find_last_checkpoint(trainer)


def _saved_step(path: Path) -> int:
    if path.is_file():
        return int(torch.load(path, weights_only=True)["global_step"])
    state = path / ("meta.pt" if (path / "meta.pt").exists() else "trainer_state.pt")
    return int(torch.load(state, weights_only=True)["global_step"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_kill_during_save_keeps_previous_checkpoint(tmp_path: Path, case: str) -> None:
    strategy, extra = CASES[case]
    _kill_mid_save(tmp_path, strategy, extra)
    entries = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    assert "last.ckpt" in entries, entries
    assert any(name.startswith(".") for name in entries), f"the killed write left no partial entry: {entries}"
    last = _last(tmp_path)
    assert last is not None and Path(last).name == "last.ckpt", (last, entries)
    assert _saved_step(Path(last)) == 2, "last.ckpt is not the previous (step 2) checkpoint"
    if case in RESUMED:
        code, job = run_job(
            tmp_path,
            "kill_during_save.py",
            "resume",
            strategy,
            str(tmp_path),
            *extra,
            timeout=150,
            name="resume",
            env=job_env(),
        )
        assert code == 0, job.output()[-6000:]
        resumed = json.loads((tmp_path / "resumed.json").read_text())
        assert resumed["global_step"] == 6
        expected = reference_weights(steps=6)
        for name, values in resumed["weights"].items():
            assert torch.equal(torch.tensor(values), expected[name].flatten().float()) or torch.allclose(
                torch.tensor(values), expected[name].flatten(), atol=1e-6, rtol=0
            ), name
