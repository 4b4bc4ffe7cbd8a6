"""Shared fixtures: nothing may be left behind (``phalanx.testing.leaks``), and the chained runs.

The runs are session-scoped and chained (train -> reshard to 1 rank -> resume on 2 ranks) because
each costs real CPU time; the tests then only read their outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fsdp_testing import run_phalanx, run_torch_ranks

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]


# ---------------------------------------------------------------------- the chained runs
@pytest.fixture(scope="session")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fsdp_runs")


@pytest.fixture(scope="session")
def reference(out_dir: Path) -> Path:
    """Plain torch DDP, 2 ranks: per-rank losses and weights after each epoch."""
    run_torch_ranks("reference_ddp.py", str(out_dir))
    return out_dir


@pytest.fixture(scope="session")
def fsdp_run(reference: Path) -> Path:
    """fsdp, 2 ranks, per-block sharding: a sharded checkpoint after epoch 0, a full one after epoch 1."""
    config = {"strategy": {"auto_wrap_policy": ["Block"]}, "save_epochs": True, "full_last_epoch": True}
    run_phalanx("train.py", str(reference), "run1", json.dumps(config))
    return reference


@pytest.fixture(scope="session")
def resharded_run(fsdp_run: Path) -> Path:
    """1 rank: loads the 2-rank sharded checkpoint (and the full file), re-saves sharded, tries another model."""
    out = fsdp_run
    config = {
        "devices": 1,
        "strategy": {"auto_wrap_policy": ["Block"]},
        "resume": str(out / "run1_epoch0"),
        "max_steps": 3,
        "verify_against": str(out / "ref_weights.pt"),
        "resave": "run2_resharded",
        "mismatch": True,
        "full_file": str(out / "run1_epoch1"),
    }
    run_phalanx("train.py", str(out), "run2", json.dumps(config))
    return out


@pytest.fixture(scope="session")
def resumed_run(resharded_run: Path) -> Path:
    """2 ranks: resume epoch 1 from the checkpoint the 1-rank run wrote."""
    config = {
        "strategy": {"auto_wrap_policy": ["Block"]},
        "resume": str(resharded_run / "run2_resharded"),
        "save_epochs": True,
    }
    run_phalanx("train.py", str(resharded_run), "run3", json.dumps(config))
    return resharded_run
