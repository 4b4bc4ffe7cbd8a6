"""Configuration: what the arguments and the Trainer write into the DeepSpeed config, and bad input.

These run in the pytest process and never import deepspeed: every check happens before any
process group or engine exists, which is the point (a typo must not cost a launch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx import Trainer
from phalanx.errors import MisconfigurationError
from phalanx_strategy_deepspeed import DeepSpeedStrategy
from phalanx_strategy_deepspeed._config import DeepSpeedOptions, apply_precision, apply_trainer_settings


@pytest.mark.parametrize("stage", [4, -1, "2", True, None])
def test_unknown_stage_is_refused(stage: object) -> None:
    with pytest.raises(MisconfigurationError, match=r"ZeRO stage .* does not exist; valid stages are \[0, 1, 2, 3\]"):
        DeepSpeedStrategy(stage=stage)  # type: ignore[arg-type]


def test_unknown_stage_in_a_config_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"zero_optimization\.stage: ZeRO stage 7"):
        DeepSpeedStrategy(config={"zero_optimization": {"stage": 7}})


def test_nvme_without_a_path_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"no nvme_path is set.*nvme_path="):
        Trainer(strategy="deepspeed_stage_3_offload_nvme", accelerator="cpu", devices=2, logger=False)
    with pytest.raises(MisconfigurationError, match="offload_param offloads to 'nvme'"):
        DeepSpeedStrategy(config={"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})
    with pytest.raises(MisconfigurationError, match="remote_device='nvme'"):
        DeepSpeedStrategy(stage=3, remote_device="nvme")
    strategy = DeepSpeedStrategy(stage=3, offload_parameters=True, offload_params_device="nvme", nvme_path="/local_nvme")
    assert strategy.config["zero_optimization"]["offload_param"]["nvme_path"] == "/local_nvme"


def test_unknown_offload_device_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"offload device 'gpu' is not supported; valid devices are \['cpu', 'nvme'\]"):
        DeepSpeedStrategy(offload_optimizer=True, offload_optimizer_device="gpu")


@pytest.mark.parametrize("precision", ["16-mixed", "16-true", 16])
def test_fp16_on_cpu_fails_at_trainer_construction(precision: object) -> None:
    with pytest.raises(MisconfigurationError, match=r"needs a CUDA device.*precision='bf16-mixed'"):
        Trainer(strategy="deepspeed", accelerator="cpu", devices=2, precision=precision, logger=False)


def test_double_precision_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match="does not support precision='64-true'"):
        Trainer(strategy="deepspeed", accelerator="cpu", devices=2, precision="64-true", logger=False)


def test_bf16_on_cpu_is_accepted() -> None:
    trainer = Trainer(strategy="deepspeed", accelerator="cpu", devices=2, precision="bf16-mixed", logger=False)
    assert trainer.strategy.precision_plugin.precision == "bf16-mixed"


def test_config_file_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(MisconfigurationError, match=f"config='{missing}'\\): no such file"):
        DeepSpeedStrategy(config=str(missing))


def test_config_file_that_does_not_parse(tmp_path: Path) -> None:
    broken = tmp_path / "ds.json"
    broken.write_text('{"zero_optimization": {"stage": 2,}}')
    with pytest.raises(MisconfigurationError, match=r"is not valid JSON: .* at line 1, column"):
        DeepSpeedStrategy(config=broken)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(MisconfigurationError, match="holds a JSON list, expected an object"):
        DeepSpeedStrategy(config=listing)


def test_config_file_wins_over_arguments(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2}))
    strategy = DeepSpeedStrategy(stage=1, offload_optimizer=True, config=path)
    assert strategy.zero_stage == 3
    assert "offload_optimizer" not in strategy.config["zero_optimization"]


def test_unknown_tuning_argument_names_the_closest() -> None:
    with pytest.raises(MisconfigurationError, match="Did you mean 'reduce_bucket_size'"):
        DeepSpeedStrategy(reduce_bucket_sise=10)
    strategy = DeepSpeedStrategy(reduce_bucket_size=10, stage3_max_live_parameters=5)
    assert strategy.config["zero_optimization"]["reduce_bucket_size"] == 10
    assert strategy.config["zero_optimization"]["stage3_max_live_parameters"] == 5


def test_trainer_accumulation_and_clipping_reach_the_config() -> None:
    config: dict[str, object] = {}
    apply_trainer_settings(config, accumulate_grad_batches=4, gradient_clip_val=0.5, gradient_clip_algorithm="norm", micro_batch_size=8)
    assert config == {"gradient_accumulation_steps": 4, "gradient_clipping": 0.5, "train_micro_batch_size_per_gpu": 8}
    given = {"gradient_accumulation_steps": 3, "gradient_clipping": 1.0}
    apply_trainer_settings(given, accumulate_grad_batches=1, gradient_clip_val=None, gradient_clip_algorithm=None, micro_batch_size=None)
    assert given["gradient_accumulation_steps"] == 3 and given["gradient_clipping"] == 1.0


def test_conflicting_trainer_and_config_settings_are_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"accumulate_grad_batches=2.*gradient_accumulation_steps=3"):
        apply_trainer_settings({"gradient_accumulation_steps": 3}, accumulate_grad_batches=2, gradient_clip_val=None, gradient_clip_algorithm=None, micro_batch_size=None)
    with pytest.raises(MisconfigurationError, match="only clips by global norm"):
        apply_trainer_settings({}, accumulate_grad_batches=1, gradient_clip_val=1.0, gradient_clip_algorithm="value", micro_batch_size=None)


def test_precision_enables_bf16_and_fp16_sections() -> None:
    options = DeepSpeedOptions()
    config: dict[str, object] = {}
    apply_precision(config, "bf16-mixed", options)
    assert config == {"bf16": {"enabled": True}}
    config = {}
    apply_precision(config, "16-mixed", options)
    assert config["fp16"]["enabled"] is True and config["fp16"]["initial_scale_power"] == 16  # type: ignore[index]


def test_bad_logging_batch_size() -> None:
    with pytest.raises(MisconfigurationError, match="logging_batch_size_per_gpu=0"):
        DeepSpeedStrategy(logging_batch_size_per_gpu=0)
