"""xla_fsdp (SPMD over two XLA:CPU devices) trains like plain CPU PyTorch, and checkpoints round-trip.

``spmd_run.py`` does the work in a fresh process with ``CPU_NUM_DEVICES=2`` (SPMD is permanent
per process); one run covers training, sharding, both checkpoint kinds, resuming and the errors
that need two visible devices, because every XLA process start costs many seconds here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch_xla")

TOLERANCE = 1e-4
HERE = Path(__file__).parent
#: The one SPMD run's own limit; the tests' pytest-timeout sits above it so that this one fires first.
RUN_TIMEOUT = 400
pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 60)


@pytest.fixture(scope="module")
def spmd() -> dict[str, Any]:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "spmd_run.py")], cwd=HERE, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def _worst(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_xla_fsdp_on_two_devices_matches_plain_cpu_pytorch_per_step(spmd: dict[str, Any]) -> None:
    assert len(spmd["losses"]) == 8
    assert _worst(spmd["losses"], spmd["reference"]) < TOLERANCE, (spmd["losses"], spmd["reference"])


def test_xla_fsdp_shards_inputs_along_the_batch_and_parameters_fsdp_style(spmd: dict[str, Any]) -> None:
    # "{devices=[2,1]0,1}": dimension 0 split in two, over devices 0 and 1.
    assert spmd["seen"]["input_sharding"] == "{devices=[2,1]0,1}"
    assert spmd["seen"]["weight_sharding"] == "{devices=[2,1]0,1}"


def test_full_and_sharded_checkpoints_round_trip_and_resume_exactly(spmd: dict[str, Any]) -> None:
    assert spmd["full_matches"] is True
    assert {".metadata", "phalanx_xla_sharded"} <= set(spmd["sharded_files"])
    assert any(name.endswith(".distcp") for name in spmd["sharded_files"])
    assert spmd["sharded_matches"] is True
    assert spmd["converted_matches"] is True  # `phalanx checkpoint convert` makes one portable file of it
    # Resuming from the sharded folder continues like an uninterrupted third epoch (optimizer state included).
    assert _worst(spmd["resumed_losses"], spmd["reference_3"][-4:]) < TOLERANCE


def test_errors_that_need_two_visible_devices(spmd: dict[str, Any]) -> None:
    assert "pytorch/xla issue 5005" in spmd["error_xla_multi_cpu"]
    assert "xla_fsdp" in spmd["error_xla_multi_cpu"] and "devices=1" in spmd["error_xla_multi_cpu"]
    assert "must span every device" in spmd["error_fsdp_subset"] and "devices=2" in spmd["error_fsdp_subset"]
    assert "devices=3" in spmd["error_too_many"] and "only 2 are available" in spmd["error_too_many"]
    assert "CPU_NUM_DEVICES" in spmd["error_too_many"]
