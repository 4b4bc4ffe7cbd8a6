"""Asynchronous sharded saves (``Trainer(plugins=[AsyncCheckpointIO()])``) under FSDPStrategy, 2 gloo ranks.

One launch (``scripts/async_resume.py``) trains 2 epochs saving every epoch in the background,
resumes "last" to 4 epochs (saving in the background again), and trains 4 epochs straight with
synchronous saves. The background saves must not change what is saved: the resumed run's final
weights equal the uninterrupted run's, and the 2-epoch weights equal plain PyTorch DDP's.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from fsdp_testing import RUN_TIMEOUT, SCRIPTS, pytest_timeout_for, run_phalanx

from phalanx.checkpoint_io import dcp
from phalanx.testing.processes import run_command

pytestmark = pytest.mark.timeout(pytest_timeout_for(runs=3))

ATOL = 1e-5


@pytest.fixture(scope="module")
def async_run(reference: Path) -> tuple[Path, str]:
    out = reference / "async"
    out.mkdir()
    return out, run_phalanx("async_resume.py", str(out), timeout=300)


def test_async_saves_publish_complete_sharded_checkpoints(async_run: tuple[Path, str]) -> None:
    out, _ = async_run
    listing = json.loads((out / "async_files.json").read_text())
    assert sorted(listing) == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt", "last.ckpt"]
    for files in listing.values():
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert not [p.name for p in (out / "ckpts").iterdir() if p.name.startswith(".")]  # no staging left


def test_async_run_matches_plain_pytorch(async_run: tuple[Path, str], reference: Path) -> None:
    out, _ = async_run
    weights = torch.load(out / "async_weights.pt", weights_only=True)
    expected = torch.load(reference / "ref_weights.pt", weights_only=True)[1]  # after epoch 2
    for key, value in expected.items():
        torch.testing.assert_close(weights[f"net.{key}"], value, atol=ATOL, rtol=0)


def test_resume_from_async_last_equals_the_uninterrupted_run(async_run: tuple[Path, str]) -> None:
    out, _ = async_run
    resumed = torch.load(out / "resumed_weights.pt", weights_only=True)
    plain = torch.load(out / "plain_weights.pt", weights_only=True)
    assert set(resumed) == set(plain)
    for key, value in plain.items():
        torch.testing.assert_close(resumed[key], value, atol=1e-6, rtol=0)


def test_blocking_time_of_each_save_is_logged_on_rank_zero(async_run: tuple[Path, str]) -> None:
    _, output = async_run
    lines = [line for line in output.splitlines() if "written in the background in" in line]
    names = [line.split(":")[0].removeprefix("checkpoint ") for line in lines]
    # 4 epochs with async saves, each an epoch checkpoint plus "last": once each, rank 0 only
    assert sorted(names) == sorted(
        [
            "epoch=0-step=3.ckpt",
            "epoch=1-step=6.ckpt",
            "epoch=2-step=9.ckpt",
            "epoch=3-step=12.ckpt",
            *["last.ckpt"] * 4,
        ]
    )
    assert all(" blocked " in line for line in lines)


def test_a_kill_during_an_async_save_leaves_the_previous_last(reference: Path) -> None:
    """SIGKILL to every rank while epoch 1's "last" is written: "last" is still epoch 0's, complete."""
    out = reference / "async_kill"
    out.mkdir()
    env = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = run_command([str(SCRIPTS / "async_kill.py"), str(out)], cwd=SCRIPTS, env=env, timeout=RUN_TIMEOUT)
    assert done.returncode == -signal.SIGKILL, f"expected the run to be killed:\n{done.output()[-4000:]}"
    done.check_leftovers()
    last = out / "ckpts" / "last.ckpt"
    assert dcp.is_dcp_checkpoint(last)
    assert dcp.read_meta(last)["global_step"] == 3  # epoch 0's, not the save in flight
    weights, _ = dcp.load_full_model_state(last)
    expected = torch.load(reference / "ref_weights.pt", weights_only=True)[0]  # plain DDP after epoch 0
    for key, value in expected.items():
        torch.testing.assert_close(weights[f"net.{key}"], value, atol=ATOL, rtol=0)
