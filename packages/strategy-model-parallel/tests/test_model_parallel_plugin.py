"""Discovery, layering, configuration errors (no processes launched), and the conformance kit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from phalanx.errors import MisconfigurationError
from phalanx.testing import StrategyConformance

ROOT = Path(__file__).resolve().parents[3]


def test_registered_from_this_distribution() -> None:
    from phalanx.strategies import StrategyRegistry

    assert "model_parallel" in StrategyRegistry
    out = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "strategies", "--json"], capture_output=True, text=True, check=True
    )
    assert "phalanx-strategy-model-parallel" in out.stdout and "model_parallel" in out.stdout


def test_plugin_module_imports_no_torch() -> None:
    code = "import sys, phalanx_strategy_model_parallel._plugin; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_layering_check_accepts_the_package() -> None:
    checker = ROOT / "tools" / "check_layering.py"
    if not checker.exists():
        pytest.fail(f"{checker} is missing: the layering rule cannot be checked")
    out = subprocess.run([sys.executable, str(checker)], capture_output=True, text=True)
    ours = [line for line in out.stdout.splitlines() if "strategy-model-parallel" in line or "model_parallel" in line]
    assert not ours, ours


@pytest.mark.parametrize(
    ("sizes", "devices", "fragment"),
    [
        ({"data_parallel_size": 3, "tensor_parallel_size": 2}, 4, "3 x 2 x 1 x 1 = 6, but the job has 4 processes"),
        ({"data_parallel_size": 3}, 4, "'auto' size would be 4/3"),
        ({"tensor_parallel_size": 2, "pipeline_parallel_size": 3}, 4, "4/6"),
    ],
)
def test_sizes_that_do_not_multiply_to_the_world_fail_before_launch(
    sizes: dict, devices: int, fragment: str, tmp_path: Path
) -> None:
    import phalanx
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    with pytest.raises(MisconfigurationError, match="Fix:") as info:
        trainer = phalanx.Trainer(
            accelerator="cpu",
            devices=devices,
            strategy=ModelParallelStrategy(**sizes),
            logger=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(phalanx.Module())
    assert fragment in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_auto_sizes_follow_lightning_and_fill_what_is_left() -> None:
    from phalanx_strategy_model_parallel._layout import resolve_layout

    assert resolve_layout("auto", "auto", 1, num_nodes=1, num_processes=4).shape == (1, 4)
    assert resolve_layout("auto", "auto", 1, num_nodes=2, num_processes=4).shape == (2, 4)
    assert resolve_layout(2, "auto", 1, num_nodes=1, num_processes=4).shape == (2, 2)
    assert resolve_layout("auto", 1, 2, num_nodes=1, num_processes=4).shape == (2, 2, 1)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"data_parallel_size": 0}, "data_parallel_size=0"),
        ({"pipeline_parallel_size": "auto"}, "pipeline_parallel_size='auto'"),
        ({"pipeline_schedule": "zigzag"}, "choose one of"),
        ({"num_microbatches": 0}, "num_microbatches=0"),
        ({"tensor_parallel_degree": 2}, "unknown option tensor_parallel_degree=2. Did you mean 'tensor_parallel_size'?"),
    ],
)
def test_bad_arguments(kwargs: dict, fragment: str) -> None:
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    with pytest.raises(MisconfigurationError) as info:
        ModelParallelStrategy(**kwargs)
    assert fragment in str(info.value)


def test_16_mixed_is_refused_with_the_choices() -> None:
    from phalanx.precision import Precision
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    class Sixteen(Precision):
        precision = "16-mixed"

    with pytest.raises(MisconfigurationError, match="choose one of \\['32-true', 'bf16-mixed', 'bf16-true'\\]"):
        ModelParallelStrategy(precision_plugin=Sixteen())


@pytest.mark.timeout(StrategyConformance.timeout + 60)
class TestPureDataParallelConformance(StrategyConformance):
    """A (2 x 1) mesh: a Module without configure_model is sharded over data parallel (FSDP-like)."""

    strategy = "model_parallel"
    devices = 2
    strategy_params: ClassVar[dict[str, Any]] = {"data_parallel_size": 2, "tensor_parallel_size": 1}
    #: Only the script launcher (popen): DTensor state cannot travel back from spawned workers.
    check_start_methods = False
