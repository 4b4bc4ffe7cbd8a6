"""The README's demo under real strategies, with every first-party plugin installed together."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"


def _demo(tmp_path: Path, *args: str) -> str:
    command = [sys.executable, str(DEMO), "--max-steps", "30", "--no-progress-bar", "--root-dir", str(tmp_path), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, start_new_session=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_demo_trains_below_chance_with_two_processes(tmp_path: Path, strategy: str) -> None:
    out = _demo(tmp_path, "--strategy", strategy, "--devices", "2")
    assert f"strategy={strategy}" in out and "devices=2" in out
    match = re.search(r"train_loss=([0-9.]+).*\(chance level ([0-9.]+)\)", out)
    assert match is not None, out
    assert float(match.group(1)) < float(match.group(2))


def test_every_installed_first_party_package_lists_its_names() -> None:
    raw = subprocess.run([sys.executable, "-m", "phalanx.cli", "strategies", "--json"], capture_output=True, text=True, timeout=60, check=True).stdout
    rows = {row["name"]: row for row in json.loads(raw)}
    expected = {
        "phalanx-strategy-ddp": ["ddp", "ddp_spawn", "ddp_fork", "ddp_notebook"],
        "phalanx-strategy-fsdp": ["fsdp", "fsdp_cpu_offload"],
        "phalanx-strategy-deepspeed": ["deepspeed", "deepspeed_stage_3_offload_nvme"],
        "phalanx-strategy-xla": ["single_xla", "xla", "xla_debug", "xla_fsdp"],
    }
    installed = {row["distribution"] for row in rows.values()}
    for distribution, names in expected.items():
        if distribution not in installed:
            continue
        for name in names:
            assert rows[name]["distribution"] == distribution
    if "phalanx-strategy-xla" in installed and not any(r["available"] for r in rows.values() if r["distribution"] == "phalanx-strategy-xla"):
        assert "torch-xla" in (rows["xla"]["reason"] or "")
