"""Every shape configure_optimizers may return is understood, and anything else is explained."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR

from phalanx.errors import MisconfigurationError
from phalanx.utilities.optim import LRSchedulerConfig, init_optimizers_and_lr_schedulers, optimizers_to_device


class Configured(nn.Module):
    """A module whose configure_optimizers returns whatever the test hands it."""

    def __init__(self, build: Any) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.other = nn.Linear(2, 2)
        self.build = build

    def configure_optimizers(self) -> Any:
        return self.build(self)


def _sgd(module: nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=lr)


def _parse(build: Any, *, automatic: bool = True) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    module = Configured(build)
    module.automatic_optimization = automatic  # type: ignore[attr-defined]  # several optimizers need manual
    return init_optimizers_and_lr_schedulers(module)


def test_single_optimizer() -> None:
    optimizers, schedulers = _parse(lambda m: _sgd(m))
    assert len(optimizers) == 1 and isinstance(optimizers[0], torch.optim.SGD)
    assert schedulers == []


@pytest.mark.parametrize("container", [list, tuple])
def test_list_of_optimizers(container: type) -> None:
    optimizers, schedulers = _parse(lambda m: container([_sgd(m.layer), _sgd(m.other)]), automatic=False)
    assert len(optimizers) == 2 and schedulers == []


def test_two_lists_optimizers_and_schedulers() -> None:
    def build(m: nn.Module) -> Any:
        opt = _sgd(m)
        return [opt], [StepLR(opt, step_size=1), {"scheduler": StepLR(opt, step_size=2), "interval": "step"}]

    optimizers, schedulers = _parse(build)
    assert len(optimizers) == 1
    assert [s.interval for s in schedulers] == ["epoch", "step"]
    assert all(s.scheduler.optimizer is optimizers[0] for s in schedulers)


def test_dict_with_scheduler_object_and_with_scheduler_dict() -> None:
    optimizers, schedulers = _parse(lambda m: {"optimizer": (o := _sgd(m)), "lr_scheduler": StepLR(o, 1)})
    assert len(optimizers) == 1 and schedulers[0] == LRSchedulerConfig(scheduler=schedulers[0].scheduler)

    def build(m: nn.Module) -> Any:
        opt = _sgd(m)
        config = {"scheduler": StepLR(opt, 1), "interval": "step", "frequency": 3, "monitor": "loss", "name": "lr"}
        return {"optimizer": opt, "lr_scheduler": config}

    _, [config] = _parse(build)
    assert (config.interval, config.frequency, config.monitor, config.name, config.strict) == (
        "step",
        3,
        "loss",
        "lr",
        True,
    )


def test_dict_without_scheduler_and_list_of_dicts() -> None:
    optimizers, schedulers = _parse(lambda m: {"optimizer": _sgd(m)})
    assert len(optimizers) == 1 and schedulers == []

    def build(m: Any) -> Any:
        first, second = _sgd(m.layer), _sgd(m.other)
        return [{"optimizer": first, "lr_scheduler": StepLR(first, 1)}, {"optimizer": second}]

    optimizers, schedulers = _parse(build, automatic=False)
    assert len(optimizers) == 2 and len(schedulers) == 1
    assert schedulers[0].scheduler.optimizer is optimizers[0]


def test_reduce_on_plateau_takes_monitor_from_the_outer_dict_and_requires_one() -> None:
    def build(m: nn.Module) -> Any:
        opt = _sgd(m)
        return {"optimizer": opt, "lr_scheduler": ReduceLROnPlateau(opt), "monitor": "val_loss"}

    _, [config] = _parse(build)
    assert config.reduce_on_plateau and config.monitor == "val_loss"
    with pytest.raises(MisconfigurationError, match="ReduceLROnPlateau needs a metric"):
        _parse(lambda m: {"optimizer": (o := _sgd(m)), "lr_scheduler": ReduceLROnPlateau(o)})


def test_none_means_no_optimizer() -> None:
    assert _parse(lambda m: None) == ([], [])


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda m: "sgd", "returned 'sgd' (type str)"),
        (lambda m: 42, "type int"),
        (lambda m: [_sgd(m), "x"], "type list"),
        (lambda m: ([_sgd(m)], [StepLR(_sgd(m), 1)], []), "type tuple"),
        (lambda m: {"optimizer": "sgd"}, "'optimizer'='sgd' (type str)"),
        (lambda m: {"optimiser": _sgd(m)}, "Did you mean 'optimizer'"),
        (
            lambda m: {"optimizer": (o := _sgd(m)), "lr_scheduler": {"schedular": StepLR(o, 1)}},
            "Did you mean 'scheduler'",
        ),
        (lambda m: {"optimizer": _sgd(m), "lr_scheduler": {"interval": "step"}}, "no 'scheduler' key"),
        (
            lambda m: {"optimizer": (o := _sgd(m)), "lr_scheduler": {"scheduler": StepLR(o, 1), "interval": "batch"}},
            "interval='batch'",
        ),
        (
            lambda m: {"optimizer": (o := _sgd(m)), "lr_scheduler": {"scheduler": StepLR(o, 1), "frequency": 0}},
            "frequency=0",
        ),
        (lambda m: {"optimizer": _sgd(m), "lr_scheduler": _Stateful()}, "doesn't follow PyTorch's LRScheduler API"),
        (lambda m: [["not an optimizer"], []], "'not an optimizer'"),
        (lambda m: {"optimizer": _sgd(m), "lr_scheduler": StepLR(_sgd(m), 1)}, "did not return"),
    ],
)
def test_bad_shapes_are_explained(build: Any, fragment: str) -> None:
    with pytest.raises(MisconfigurationError) as info:
        _parse(build)
    assert fragment in str(info.value)


class _Stateful:
    """A scheduler that checkpoints but does not step like torch's."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_a_scheduler_without_state_dict_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="state_dict"):
        _parse(lambda m: {"optimizer": _sgd(m), "lr_scheduler": object()})


def test_manual_optimization_takes_any_stateful_scheduler_and_ignores_the_stepping_keys() -> None:
    def build(m: nn.Module) -> Any:
        opt = _sgd(m)
        plateau = {"scheduler": ReduceLROnPlateau(opt), "monitor": "loss", "interval": "step"}
        return [opt, _sgd(m)], [plateau, _Stateful()]

    module = Configured(build)
    module.automatic_optimization = False  # type: ignore[attr-defined]
    with pytest.warns(RuntimeWarning, match=r"\['monitor'\], but the keys will be ignored"):
        optimizers, configs = init_optimizers_and_lr_schedulers(module)
    assert len(optimizers) == 2
    assert configs[0].interval == "step" and configs[0].monitor is None


def test_several_optimizers_need_manual_optimization() -> None:
    with pytest.raises(RuntimeError, match="only supported with manual optimization"):
        _parse(lambda m: [_sgd(m), _sgd(m)])


def test_accepted_shapes_are_listed_for_unknown_results() -> None:
    with pytest.raises(MisconfigurationError, match=r"Accepted shapes: an Optimizer; a list/tuple"):
        _parse(lambda m: 1.5)


def test_module_without_configure_optimizers() -> None:
    with pytest.raises(MisconfigurationError, match="Linear has no configure_optimizers"):
        init_optimizers_and_lr_schedulers(nn.Linear(1, 1))


def test_optimizers_to_device_moves_state_but_not_step_counters() -> None:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizers_to_device([optimizer], "meta")
    state = next(iter(optimizer.state.values()))
    assert state["exp_avg"].device.type == "meta"
    assert state["step"].device.type == "cpu"
