"""Bad input fails early, in the user's process, with a message naming the value and the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phalanx import Trainer
from phalanx.errors import MisconfigurationError
from phalanx.precision.amp import MixedPrecision
from phalanx.strategies.sharded import modules_needing_init
from phalanx_strategy_fsdp import FSDPStrategy, ModuleClassPolicy
from phalanx_strategy_fsdp._fsdp2 import MixedPrecisionPolicy
from phalanx_strategy_fsdp._options import mesh_shape
from phalanx_strategy_fsdp._policy import matching_modules
from phalanx_strategy_fsdp._precision import mixed_precision_policy
from phalanx_strategy_fsdp._shard import shard_module


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)


@pytest.mark.parametrize("policy", ["Block", nn.Linear(2, 2), {1, 2}, set(), [nn.Linear, "x"], 3])
def test_wrong_policy_types_are_refused(policy: object) -> None:
    with pytest.raises(MisconfigurationError, match=r"auto_wrap_policy=.*nn.Module subclass|not a policy"):
        FSDPStrategy(auto_wrap_policy=policy)
    with pytest.raises(MisconfigurationError, match="activation_checkpointing_policy="):
        FSDPStrategy(activation_checkpointing_policy=policy)


def test_accepted_policy_forms() -> None:
    model = nn.Sequential(Block(), nn.Sequential(Block(), nn.ReLU()))
    for policy in (Block, {Block}, [Block], ModuleClassPolicy(frozenset({Block})), lambda m: isinstance(m, Block)):
        strategy = FSDPStrategy(auto_wrap_policy=policy)
        found = matching_modules(model, strategy.auto_wrap_policy)
        assert found == [model[0], model[1][0]]  # inner units first, the root never


def test_module_class_missing_from_model_is_named() -> None:
    strategy = FSDPStrategy(auto_wrap_policy={nn.TransformerEncoderLayer})
    model = nn.Sequential(Block())
    with pytest.raises(
        MisconfigurationError,
        match=r"\['TransformerEncoderLayer'\].*do\(es\) not occur.*\['Block', 'Linear', 'Sequential'\]",
    ):
        shard_module(
            model,
            mesh=None,  # type: ignore[arg-type]  # checked before any sharding happens
            wrap_policy=strategy.auto_wrap_policy,
            activation_checkpointing=None,
            init_device=torch.device("cpu"),
            fully_shard_kwargs={},
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"state_dict_type": "local"}, r"state_dict_type='local'.*\['sharded', 'full'\]"),
        ({"device_mesh": (2,)}, r"device_mesh=\(2,\)\) is not a mesh"),
        ({"device_mesh": (0, 2)}, r"device_mesh=\(0, 2\)"),
        ({"device_mesh": "2d"}, r"device_mesh='2d'"),
        ({"reshard_after_forward": "yes"}, r"reshard_after_forward='yes'"),
        ({"cpu_offload": "true"}, r"cpu_offload='true'\) must be True or False"),
        ({"timeout": 30}, r"timeout=30\) must be a datetime.timedelta"),
        ({"mixed_precision": torch.bfloat16}, r"mixed_precision=torch.bfloat16.*MixedPrecisionPolicy"),
    ],
)
def test_bad_options_are_refused_at_construction(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        FSDPStrategy(**kwargs)  # type: ignore[arg-type]


def test_mesh_must_cover_the_world() -> None:
    assert mesh_shape(None, world_size=4, num_nodes=1) == (4,)
    assert mesh_shape((2, 2), world_size=4, num_nodes=1) == (2, 2)
    assert mesh_shape("hybrid", world_size=8, num_nodes=2) == (2, 4)
    with pytest.raises(MisconfigurationError, match=r"world size 2.*\(1, 2\), \(2, 1\)"):
        mesh_shape((2, 2), world_size=2, num_nodes=1)


def test_cpu_offload_refuses_16_mixed_at_trainer_construction() -> None:
    with pytest.raises(
        MisconfigurationError, match=r"cpu_offload=True\) cannot serve precision='16-mixed'.*bf16-mixed"
    ):
        Trainer(strategy="fsdp_cpu_offload", accelerator="cpu", devices=2, precision="16-mixed", logger=False)
    with pytest.raises(MisconfigurationError, match="cannot serve precision='16-mixed'"):
        FSDPStrategy(cpu_offload=True, precision_plugin=MixedPrecision("16-mixed"))
    FSDPStrategy(cpu_offload=True, precision_plugin=MixedPrecision("bf16-mixed"))  # fine


def test_precision_maps_to_mixed_precision_policy() -> None:
    bf16 = mixed_precision_policy(MixedPrecision("bf16-mixed"), None)
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    fp16 = mixed_precision_policy(MixedPrecision("16-mixed"), None)
    assert (fp16.param_dtype, fp16.reduce_dtype) == (torch.float16, torch.float32)
    assert mixed_precision_policy(None, None) == MixedPrecisionPolicy()
    mine = MixedPrecisionPolicy(param_dtype=torch.float16)
    assert mixed_precision_policy(MixedPrecision("bf16-mixed"), mine) is mine


def test_meta_module_without_reset_parameters_is_named() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 3), Scale())
    with pytest.raises(MisconfigurationError, match=r"\['Scale'\] on the meta device.*reset_parameters"):
        modules_needing_init(model)
