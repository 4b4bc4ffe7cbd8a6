"""Discovery and registration: names, descriptions, requirements, and listing without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.registry import ClusterEnvironmentRegistry, StrategyRegistry
from phalanx_strategy_deepspeed._plugin import STRATEGY_NAMES, phalanx_convert_checkpoint

NAMES = [
    "deepspeed",
    "deepspeed_stage_1",
    "deepspeed_stage_1_offload",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme",
]


def test_every_name_is_registered_with_description_and_requirement() -> None:
    assert sorted(STRATEGY_NAMES) == sorted(NAMES)
    for name in NAMES:
        entry = StrategyRegistry.entry(name)
        assert entry.description
        assert "deepspeed>=0.14" in entry.requires
        assert entry.available, entry.unavailable_reason
        assert StrategyRegistry.get_class(name).__name__ == "DeepSpeedStrategy"


@pytest.mark.parametrize(
    ("name", "stage", "offload"),
    [
        ("deepspeed", 2, {}),
        ("deepspeed_stage_1", 1, {}),
        ("deepspeed_stage_2_offload", 2, {"offload_optimizer": "cpu"}),
        ("deepspeed_stage_3_offload", 3, {"offload_optimizer": "cpu", "offload_param": "cpu"}),
    ],
)
def test_presets_generate_the_documented_config(name: str, stage: int, offload: dict[str, str]) -> None:
    strategy = StrategyRegistry.get(name)
    assert strategy.zero_stage == stage
    assert strategy.handles_gradient_accumulation and strategy.restore_checkpoint_after_setup
    zero = strategy.config["zero_optimization"]
    assert {key: zero[key]["device"] for key in ("offload_optimizer", "offload_param") if key in zero} == offload


def test_seed_example_constructs_a_trainer() -> None:
    """gpu-training-expert.md's ``Trainer(strategy="deepspeed_stage_3_offload", ...)``, on CPU."""
    from phalanx import Trainer

    trainer = Trainer(strategy="deepspeed_stage_3_offload", accelerator="cpu", devices=2, logger=False)
    strategy = trainer.strategy
    assert type(strategy).__name__ == "DeepSpeedStrategy"
    assert strategy.zero_stage_3 and strategy.world_size == 2
    assert type(strategy.precision_plugin).__name__ == "DeepSpeedPrecision"
    assert type(strategy.launcher).__name__ == "SubprocessScriptLauncher"


def test_plugin_module_imports_neither_torch_nor_deepspeed() -> None:
    code = (
        "import sys, phalanx_strategy_deepspeed._plugin, phalanx_strategy_deepspeed._layout, "
        "phalanx_strategy_deepspeed.environment;"
        "bad = [m for m in ('torch', 'deepspeed') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_cli_lists_the_names_without_importing_deepspeed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "strategies", "--json"], capture_output=True, text=True, timeout=60, check=True
    )
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    for name in NAMES:
        assert rows[name]["distribution"] == "phalanx-strategy-deepspeed"
        assert rows[name]["available"] is True


def test_convert_hook_passes_on_other_formats(tmp_path: Path) -> None:
    plain = tmp_path / "model.ckpt"
    plain.write_bytes(b"not ours")
    assert phalanx_convert_checkpoint(str(plain), str(tmp_path / "out.ckpt")) is None
    assert phalanx_convert_checkpoint(str(tmp_path), str(tmp_path / "out.ckpt")) is None


def test_deepspeed_launcher_environment_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``deepspeed`` command sets RANK/LOCAL_RANK/WORLD_SIZE/CROSS_RANK/LOCAL_SIZE, not torchrun's."""
    cls = ClusterEnvironmentRegistry.get_class("deepspeed_launcher")
    assert not cls.detect()
    for key, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "CROSS_RANK": "1", "LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    assert cls.detect()
    env = cls()
    assert (env.global_rank(), env.local_rank(), env.node_rank(), env.world_size()) == (3, 1, 1, 4)
    assert env.creates_processes_externally
    env.validate_settings(2, 2)
    with pytest.raises(ValueError, match="devices=2"):
        env.validate_settings(4, 2)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert not cls.detect()
