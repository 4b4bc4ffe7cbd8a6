"""Lightning's names under the rename rule: grad_norm, utility modules, the top level, strategy classes.

Each Lightning name a script imports resolves to phalanx's own object; importing ``phalanx`` stays
torch-free; a strategy class whose plugin did not load says how to fix it.
"""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import run_python

import phalanx
from phalanx.utilities import seed
from phalanx.utilities.grads import grad_norm
from phalanx.utilities.rank_zero import (
    rank_zero_debug,
    rank_zero_deprecation,
    rank_zero_info,
    rank_zero_only,
    rank_zero_warn,
)

# ------------------------------------------------------------------------------------------- grad_norm


class _PartlyTrained(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(4, 3)
        self.head = torch.nn.Linear(3, 2)
        self.unused = torch.nn.Linear(2, 2)  # never called: its parameters get no grad
        self.encoder.bias.requires_grad_(False)  # frozen: no grad either

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))


def _model_with_grads() -> torch.nn.Module:
    torch.manual_seed(0)
    model = _PartlyTrained()
    (model(torch.randn(5, 4)) ** 2).sum().backward()
    return model


@pytest.mark.parametrize("norm_type", [1, 2, 3.5, "2", "inf", float("inf")])
def test_grad_norm_matches_vector_norm_per_parameter_and_in_total(norm_type: float | int | str) -> None:
    model = _model_with_grads()
    p = float(norm_type)
    grads = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
    assert sorted(grads) == ["encoder.weight", "head.bias", "head.weight"]

    norms = grad_norm(model, norm_type)

    expected = {f"grad_{p}_norm/{name}": torch.linalg.vector_norm(g, ord=p) for name, g in grads.items()}
    expected[f"grad_{p}_norm_total"] = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads.values()]), ord=p)
    assert list(norms) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(norms[key], value)


def test_grad_norm_keys_follow_lightning_and_the_separator() -> None:
    model = _model_with_grads()
    assert list(grad_norm(model, 2, group_separator=".")) == [
        "grad_2.0_norm.encoder.weight",
        "grad_2.0_norm.head.weight",
        "grad_2.0_norm.head.bias",
        "grad_2.0_norm_total",
    ]
    assert "grad_inf_norm_total" in grad_norm(model, "inf")
    assert grad_norm(torch.nn.Linear(2, 2), 2) == {}  # no gradients yet: nothing, not even a total


@pytest.mark.parametrize("bad", [0, -2, "abc", float("nan"), None])
def test_grad_norm_rejects_non_positive_norm_types(bad: object) -> None:
    with pytest.raises(ValueError, match="norm_type=.*positive number"):
        grad_norm(torch.nn.Linear(2, 2), bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- other utility modules


def test_measure_flops_counts_matmuls_on_a_meta_model() -> None:
    from phalanx.utilities import measure_flops

    batch, fan_in, fan_out = 4, 16, 8
    with torch.device("meta"):
        model = torch.nn.Linear(fan_in, fan_out, bias=False)
        x = torch.randn(batch, fan_in)
    matmul = 2 * batch * fan_in * fan_out  # multiply-adds of one (batch x in) @ (in x out) product
    assert measure_flops(model, lambda: model(x)) == matmul
    assert measure_flops(model, lambda: model(x), lambda y: y.sum()) == 2 * matmul  # + weight gradient
    x.requires_grad_(True)
    assert measure_flops(model, lambda: model(x), lambda y: y.sum()) == 3 * matmul  # + input gradient


def test_types_module_names_and_shapes() -> None:
    from phalanx.utilities import types
    from phalanx.utilities.optim import LRSchedulerConfig

    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    assert isinstance(scheduler, types.LRSchedulerTypeTuple)
    assert isinstance(plateau, types.LRSchedulerTypeTuple)
    assert types.LRSchedulerConfig is LRSchedulerConfig
    assert types.OptimizerLRSchedulerConfig.__required_keys__ == {"optimizer", "lr_scheduler"}
    assert types.OptimizerLRSchedulerConfig.__optional_keys__ == {"monitor"}
    assert types.LRSchedulerConfigType.__required_keys__ == {"scheduler"}
    for name in ("STEP_OUTPUT", "TRAIN_DATALOADERS", "EVAL_DATALOADERS", "OptimizerLRScheduler", "OptimizerConfig"):
        assert hasattr(types, name)
    assert set(types.__all__) <= set(dir(types))


def test_misconfiguration_exception_catches_what_phalanx_raises() -> None:
    from phalanx.errors import MisconfigurationError
    from phalanx.utilities.exceptions import MisconfigurationException
    from phalanx.utilities.optim import LRSchedulerConfig

    assert MisconfigurationException is MisconfigurationError
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(MisconfigurationException, match="interval"):
        LRSchedulerConfig(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1), interval="hourly")


def test_utilities_facade_resolves_lightnings_names_to_their_modules() -> None:
    import phalanx.utilities as utilities

    assert utilities.rank_zero_only is rank_zero_only
    assert utilities.rank_zero_info is rank_zero_info
    assert utilities.rank_zero_warn is rank_zero_warn
    assert utilities.rank_zero_debug is rank_zero_debug
    assert utilities.rank_zero_deprecation is rank_zero_deprecation
    assert utilities.grad_norm is grad_norm
    from phalanx.hparams import AttributeDict

    assert utilities.AttributeDict is AttributeDict
    for name in utilities.__all__:
        assert getattr(utilities, name) is not None, name


def _module_exists(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ----------------------------------------------------------------------------------------- top level


def test_top_level_mirrors_lightning_pytorch_under_the_rename_rule() -> None:
    lightning_all = {"Trainer", "LightningDataModule", "LightningModule", "Callback", "seed_everything", "__version__"}
    renamed = {{"LightningModule": "Module", "LightningDataModule": "DataModule"}.get(n, n) for n in lightning_all}
    assert renamed <= set(phalanx.__all__)

    from phalanx.callbacks import Callback
    from phalanx.module import Module
    from phalanx.trainer.trainer import Trainer

    assert phalanx.seed_everything is seed.seed_everything
    assert phalanx.Callback is Callback
    assert phalanx.Module is Module
    assert phalanx.Trainer is Trainer
    from phalanx.datamodule import DataModule

    assert phalanx.DataModule is DataModule
    namespace: dict[str, object] = {}
    exec("from phalanx import *", namespace)  # every name in __all__ resolves
    assert set(phalanx.__all__) <= set(namespace)


def test_importing_phalanx_and_rank_zero_stays_torch_free() -> None:
    code = (
        "import sys, phalanx, phalanx.utilities, phalanx.utilities.rank_zero; "
        "from phalanx.utilities import rank_zero_only; print('torch' in sys.modules)"
    )
    assert run_python(code).stdout.strip() == "False"


# ---------------------------------------------------------------------------------------- strategies


LIGHTNING_STRATEGY_CLASSES = {
    "DDPStrategy": "phalanx_strategy_ddp",
    "FSDPStrategy": "phalanx_strategy_fsdp",
    "DeepSpeedStrategy": "phalanx_strategy_deepspeed",
    "ModelParallelStrategy": "phalanx_strategy_model_parallel",
    "SingleDeviceStrategy": "phalanx",
    "ParallelStrategy": "phalanx",
    "Strategy": "phalanx",
}


def test_lightnings_strategy_class_names_import_from_phalanx_strategies() -> None:
    import phalanx.strategies as strategies
    from phalanx.strategies import Strategy

    for name, package in LIGHTNING_STRATEGY_CLASSES.items():
        if package != "phalanx" and not _module_exists(package):
            continue  # that plugin is not installed here; the next test covers the message
        cls = getattr(strategies, name)
        assert cls.__name__ == name
        assert cls.__module__.split(".")[0] == package
        assert issubclass(cls, Strategy)


def test_xla_strategy_imports_with_its_plugin_and_names_torch_xla_when_used_without_it() -> None:
    """As in Lightning, the class imports without torch-xla; using it says what to install."""
    from phalanx.registry import StrategyRegistry

    if "xla" not in StrategyRegistry:
        pytest.skip("phalanx-strategy-xla is not installed or blocked; test_registry covers the install hint")
    from phalanx import Trainer
    from phalanx.strategies import SingleDeviceXLAStrategy, XLAStrategy

    assert XLAStrategy.__name__ == "XLAStrategy" and SingleDeviceXLAStrategy.__name__ == "SingleDeviceXLAStrategy"
    if not _module_exists("torch_xla"):
        with pytest.raises(ImportError, match="torch-xla"):
            Trainer(accelerator="xla", strategy=XLAStrategy())


@pytest.mark.timeout(120)
def test_strategy_class_of_a_plugin_that_did_not_load_says_how_to_fix_it() -> None:
    if not _module_exists("phalanx_strategy_fsdp"):
        pytest.skip("phalanx-strategy-fsdp is not installed; test_registry covers the install hint")
    code = "try:\n    from phalanx.strategies import FSDPStrategy\nexcept ImportError as err:\n    print(err)\n"
    out = run_python(code, env={"PHALANX_DISABLE_PLUGINS": "fsdp"}).stdout
    assert "phalanx-strategy-fsdp is installed but its plugin did not load" in out
    assert "PHALANX_DISABLE_PLUGINS='fsdp'" in out
