"""Bad input fails at Trainer construction with a message naming the value, the choices and the fix.

Runs in the pytest process with torch-xla on XLA:CPU (one visible device); the errors that need
two visible devices are checked in the SPMD subprocess (test_spmd.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_xla")

from phalanx import Trainer
from phalanx.errors import MisconfigurationError
from phalanx_strategy_xla import SingleDeviceXLAStrategy, XLAPrecision, XLAStrategy


def _trainer(**kwargs: object) -> Trainer:
    options: dict[str, object] = {"accelerator": "xla", "devices": 1, "logger": False}
    options.update(kwargs)
    return Trainer(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["single_xla", "xla", "xla_debug", "xla_fsdp"])
def test_non_xla_accelerator_is_refused(strategy: str) -> None:
    with pytest.raises(MisconfigurationError, match=r"'cpu'.*accelerator='xla'"):
        _trainer(accelerator="cpu", strategy=strategy)


def test_non_xla_device_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"device='cpu'.*not an XLA device.*'single_device'"):
        SingleDeviceXLAStrategy(device="cpu")


@pytest.mark.parametrize("precision", ["16-mixed", "16-true", "16", "64-true"])
def test_fp16_and_fp64_on_xla_are_refused_with_the_bf16_fix(precision: str) -> None:
    with pytest.raises(MisconfigurationError, match=r"not supported on XLA devices.*precision='bf16-true'"):
        _trainer(strategy="single_xla", precision=precision)
    with pytest.raises(MisconfigurationError, match="Valid choices"):
        XLAPrecision("16-true")


@pytest.mark.parametrize("strategy", ["single_xla", "xla", "auto"])
def test_more_devices_than_the_runtime_exposes(strategy: str) -> None:
    with pytest.raises(MisconfigurationError, match=r"devices=2 asks for 2 xla device\(s\) but only 1 is available.*CPU_NUM_DEVICES"):
        _trainer(strategy=strategy, devices=2)


def test_bf16_names_map_to_xla_precision() -> None:
    assert isinstance(_trainer(strategy="single_xla", precision="bf16-mixed").strategy.precision_plugin, XLAPrecision)
    assert _trainer(strategy="xla", precision="xla-bf16-true").strategy.precision_plugin.precision == "bf16-true"


def test_xla_reduce_op_must_be_one_xla_supports() -> None:
    with pytest.raises(MisconfigurationError, match=r"reduce_op='prod'.*valid: \['sum', 'mean'"):
        XLAStrategy().reduce(1.0, reduce_op="prod")


def test_xla_root_device_before_launch_says_when_it_is_known() -> None:
    with pytest.raises(RuntimeError, match="before torch-xla launched its workers"):
        _ = XLAStrategy().root_device
