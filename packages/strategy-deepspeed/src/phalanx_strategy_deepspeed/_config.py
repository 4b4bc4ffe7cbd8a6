"""Build and check the DeepSpeed config dict from the strategy's arguments and the Trainer's settings.

DeepSpeed is configured by one JSON-like dict. Users either pass a full config (a dict or a JSON
file, which then wins) or the familiar keyword arguments, from which a config is generated here.
Everything is checked up front so that a typo fails in the constructor with a message naming the
fix, rather than on every rank after the processes started. No torch import: this is plain data.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any

from phalanx.errors import MisconfigurationError, closest_match

__all__ = [
    "OFFLOAD_DEVICES",
    "TUNING_DEFAULTS",
    "VALID_STAGES",
    "DeepSpeedOptions",
    "apply_precision",
    "apply_trainer_settings",
    "build_config",
    "check_config",
    "load_config",
    "zero_stage_of",
]

VALID_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("cpu", "nvme")

#: ZeRO, NVMe-offload and activation-checkpointing knobs, with Lightning's defaults. Passed to
#: ``DeepSpeedStrategy(**tuning)``; unknown names are refused with the closest match.
TUNING_DEFAULTS: dict[str, Any] = {
    # zero_optimization
    "contiguous_gradients": True,
    "overlap_comm": True,
    "allgather_partitions": True,
    "reduce_scatter": True,
    "allgather_bucket_size": 200_000_000,
    "reduce_bucket_size": 200_000_000,
    "sub_group_size": 1_000_000_000_000,
    "stage3_prefetch_bucket_size": None,
    "stage3_param_persistence_threshold": None,
    "stage3_max_live_parameters": None,
    "stage3_max_reuse_distance": None,
    "stage3_gather_16bit_weights_on_model_save": None,
    # offload buffers
    "params_buffer_count": 5,
    "params_buffer_size": 100_000_000,
    "max_in_cpu": 1_000_000_000,
    "optimizer_buffer_count": 4,
    "pin_memory": False,
    # aio (NVMe)
    "block_size": 1_048_576,
    "queue_depth": 8,
    "single_submit": False,
    "overlap_events": True,
    "thread_count": 1,
    # activation checkpointing
    "partition_activations": False,
    "cpu_checkpointing": False,
    "contiguous_memory_optimization": False,
    "synchronize_checkpoint_boundary": False,
    # fp16 loss scaling
    "loss_scale": 0.0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}
_ZERO_KEYS = (
    "contiguous_gradients",
    "overlap_comm",
    "allgather_partitions",
    "reduce_scatter",
    "allgather_bucket_size",
    "reduce_bucket_size",
    "sub_group_size",
)


@dataclass(frozen=True)
class DeepSpeedOptions:
    """The strategy's keyword arguments that shape the generated config (see DeepSpeedStrategy)."""

    stage: int = 2
    zero_optimization: bool = True
    offload_optimizer: bool = False
    offload_parameters: bool = False
    offload_optimizer_device: str = "cpu"
    offload_params_device: str = "cpu"
    nvme_path: str | None = None
    logging_batch_size_per_gpu: int | str = "auto"
    zero_allow_untested_optimizer: bool = True
    tuning: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_stage(self.stage, "DeepSpeedStrategy(stage=...)")
        for name in ("offload_optimizer_device", "offload_params_device"):
            check_offload_device(getattr(self, name), f"DeepSpeedStrategy({name}=...)")
        unknown = sorted(set(self.tuning) - set(TUNING_DEFAULTS))
        if unknown:
            hint = closest_match(unknown[0], TUNING_DEFAULTS)
            suggestion = f" Did you mean {hint!r}?" if hint else ""
            msg = (
                f"DeepSpeedStrategy got unknown argument(s) {unknown}.{suggestion} Valid tuning arguments: "
                f"{', '.join(TUNING_DEFAULTS)}; anything else goes into config={{...}}."
            )
            raise MisconfigurationError(msg)
        batch = self.logging_batch_size_per_gpu
        if batch != "auto" and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            msg = f"DeepSpeedStrategy(logging_batch_size_per_gpu={batch!r}) must be 'auto' or an int >= 1, e.g. 32."
            raise MisconfigurationError(msg)

    def knob(self, name: str) -> Any:
        """A tuning value: the one given, else the default."""
        return self.tuning.get(name, TUNING_DEFAULTS[name])


def check_stage(stage: Any, where: str) -> None:
    """Refuse a ZeRO stage DeepSpeed does not have."""
    if isinstance(stage, bool) or stage not in VALID_STAGES:
        msg = (
            f"{where}: ZeRO stage {stage!r} does not exist; valid stages are {list(VALID_STAGES)} "
            "(0 off, 1 optimizer state, 2 + gradients, 3 + parameters). Fix: pass stage=1, 2 or 3."
        )
        raise MisconfigurationError(msg)


def check_offload_device(device: Any, where: str) -> None:
    """Refuse an offload target other than cpu / nvme."""
    if device not in OFFLOAD_DEVICES:
        msg = f"{where}: offload device {device!r} is not supported; valid devices are {list(OFFLOAD_DEVICES)}. Fix: pass 'cpu' (or 'nvme' with nvme_path=...)."
        raise MisconfigurationError(msg)


def load_config(config: dict[str, Any] | str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """Return a private copy of the user's config: the dict itself or a parsed JSON file.

    Raises:
        MisconfigurationError: The file does not exist, does not parse, or is not a JSON object.
    """
    if config is None:
        return None
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if not isinstance(config, (str, os.PathLike)):
        msg = f"DeepSpeedStrategy(config={config!r}) must be a dict or a path to a DeepSpeed JSON file."
        raise MisconfigurationError(msg)
    path = os.fspath(config)
    if not os.path.isfile(path):
        msg = (
            f"DeepSpeedStrategy(config={path!r}): no such file. Pass the path of an existing DeepSpeed JSON "
            "config, or a dict, or leave config=None to generate one from the arguments."
        )
        raise MisconfigurationError(msg)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        msg = (
            f"DeepSpeedStrategy(config={path!r}) is not valid JSON: {error.msg} at line {error.lineno}, "
            f"column {error.colno}. Fix the file (DeepSpeed configs are JSON objects), or pass a dict."
        )
        raise MisconfigurationError(msg) from error
    if not isinstance(data, dict):
        msg = f"DeepSpeedStrategy(config={path!r}) holds a JSON {type(data).__name__}, expected an object {{...}}. Fix: write the config as one JSON object, or pass a dict."
        raise MisconfigurationError(msg)
    return data


def zero_stage_of(config: dict[str, Any]) -> int:
    """The ZeRO stage a config asks for (0 when ``zero_optimization`` is absent)."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return 0
    return zero.get("stage", 0)  # type: ignore[no-any-return]


def check_config(config: dict[str, Any]) -> None:
    """Validate what the generated or given config says about stages and offloading.

    Raises:
        MisconfigurationError: Unknown stage, unknown offload device, or NVMe offload without a path.
    """
    check_stage(zero_stage_of(config), "DeepSpeed config zero_optimization.stage")
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key)
        if not isinstance(section, dict):
            continue
        device = section.get("device", "cpu")
        if device == "none":
            continue
        check_offload_device(device, f"DeepSpeed config zero_optimization.{key}.device")
        if device == "nvme" and not section.get("nvme_path"):
            msg = (
                f"zero_optimization.{key} offloads to 'nvme' but no nvme_path is set. Fix: pass "
                "DeepSpeedStrategy(nvme_path='/path/on/a/fast/local/disk') (or set "
                f"zero_optimization.{key}.nvme_path in the config), or offload to 'cpu' instead."
            )
            raise MisconfigurationError(msg)


def build_config(options: DeepSpeedOptions) -> dict[str, Any]:
    """Generate a config from the keyword arguments (Lightning's defaults, so behaviour ports)."""
    knob = options.knob
    config: dict[str, Any] = {
        "activation_checkpointing": {
            "partition_activations": knob("partition_activations"),
            "cpu_checkpointing": knob("cpu_checkpointing"),
            "contiguous_memory_optimization": knob("contiguous_memory_optimization"),
            "synchronize_checkpoint_boundary": knob("synchronize_checkpoint_boundary"),
        },
        "aio": {name: knob(name) for name in ("block_size", "queue_depth", "single_submit", "overlap_events", "thread_count")},
    }
    if options.zero_optimization:
        zero: dict[str, Any] = {"stage": options.stage, **{name: knob(name) for name in _ZERO_KEYS}}
        for name in TUNING_DEFAULTS:
            if name.startswith("stage3_") and knob(name) is not None:
                zero[name] = knob(name)
        if options.offload_optimizer:
            zero["offload_optimizer"] = {
                "device": options.offload_optimizer_device,
                "nvme_path": options.nvme_path,
                "buffer_count": knob("optimizer_buffer_count"),
                "pin_memory": knob("pin_memory"),
            }
        if options.offload_parameters:
            zero["offload_param"] = {
                "device": options.offload_params_device,
                "nvme_path": options.nvme_path,
                "buffer_count": knob("params_buffer_count"),
                "buffer_size": knob("params_buffer_size"),
                "max_in_cpu": knob("max_in_cpu"),
                "pin_memory": knob("pin_memory"),
            }
        config["zero_optimization"] = zero
        config["zero_allow_untested_optimizer"] = options.zero_allow_untested_optimizer
    if options.logging_batch_size_per_gpu != "auto":
        config["train_micro_batch_size_per_gpu"] = options.logging_batch_size_per_gpu
    return config


def apply_trainer_settings(
    config: dict[str, Any],
    *,
    accumulate_grad_batches: int,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: str | None,
    micro_batch_size: int | None,
) -> None:
    """Write the Trainer's accumulation, clipping and batch size into ``config`` (in place).

    The engine, not the Trainer's loop, accumulates and clips, so the Trainer's settings must reach
    it through the config. A value the config already holds wins, unless both say different
    things, which is refused rather than silently picking one.

    Raises:
        MisconfigurationError: Conflicting accumulation or clipping, or clipping by value.
    """
    accumulate = int(accumulate_grad_batches or 1)
    given = config.get("gradient_accumulation_steps")
    if given is not None and accumulate != 1 and int(given) != accumulate:
        msg = (
            f"Trainer(accumulate_grad_batches={accumulate}) conflicts with the DeepSpeed config's "
            f"gradient_accumulation_steps={given}. Fix: set it in one place only."
        )
        raise MisconfigurationError(msg)
    config.setdefault("gradient_accumulation_steps", accumulate)
    clip = float(gradient_clip_val) if gradient_clip_val else 0.0
    algorithm = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm or "norm")).lower()
    if clip > 0 and algorithm != "norm":
        msg = (
            f"Trainer(gradient_clip_algorithm={gradient_clip_algorithm!r}) is not supported by DeepSpeed, which "
            "only clips by global norm (valid: 'norm'). Fix: use gradient_clip_algorithm='norm'."
        )
        raise MisconfigurationError(msg)
    if "gradient_clipping" in config and clip > 0 and float(config["gradient_clipping"]) != clip:
        msg = (
            f"Trainer(gradient_clip_val={gradient_clip_val}) conflicts with the DeepSpeed config's "
            f"gradient_clipping={config['gradient_clipping']}. Fix: set it in one place only."
        )
        raise MisconfigurationError(msg)
    config.setdefault("gradient_clipping", clip)
    if "train_micro_batch_size_per_gpu" not in config and "train_batch_size" not in config:
        config["train_micro_batch_size_per_gpu"] = micro_batch_size or 1


def apply_precision(config: dict[str, Any], precision: str, options: DeepSpeedOptions) -> None:
    """Enable fp16 (with loss scaling) or bf16 in ``config`` for a half precision, unless configured."""
    if precision in ("16-mixed", "16-true") and "fp16" not in config:
        config["fp16"] = {
            "enabled": True,
            "loss_scale": options.knob("loss_scale"),
            "initial_scale_power": options.knob("initial_scale_power"),
            "loss_scale_window": options.knob("loss_scale_window"),
            "hysteresis": options.knob("hysteresis"),
            "min_loss_scale": options.knob("min_loss_scale"),
        }
    elif precision in ("bf16-mixed", "bf16-true") and "bf16" not in config:
        config["bf16"] = {"enabled": True}
