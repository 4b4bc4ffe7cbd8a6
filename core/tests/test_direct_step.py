"""The direct training step (``run_direct``): taken only when every layer is at its default, and
then exactly the layered step's numbers.

``direct_step`` decides once per fit whether the strategy, the precision and the Module would
only pass a step through; if so the fit loop calls ``optimizer.step(closure)`` itself. These tests
pin both halves: the same weights and losses as the layered path and a plain PyTorch loop, and the
layered path for each thing a user can customise.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.strategies import SingleDeviceStrategy
from phalanx.trainer.trainer import Trainer

STEPS = 6


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(8 * STEPS, 5, generator=g), torch.randn(8 * STEPS, 2, generator=g)), batch_size=8)


class _Net(Module):
    def __init__(self, optimizer: str = "sgd") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
        self.optimizer = optimizer
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "lbfgs":
            return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=3)
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class _Layered(_Net):
    """The default optimizer_step written out: behaviour unchanged, but no longer at the default."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)


def _fit(model: Module, **kwargs: Any) -> Trainer:
    options: dict[str, Any] = {"accelerator": "cpu", "devices": 1, "max_epochs": 1, "logger": False}
    options.update(enable_checkpointing=False, enable_progress_bar=False, **kwargs)
    trainer = Trainer(**options)
    trainer.fit(model, _data())
    return trainer


def _plain(optimizer: str) -> tuple[list[torch.Tensor], list[float]]:
    """What the Trainer does, by hand: the closure runs forward, zero_grad, backward."""
    model = _Net(optimizer)
    opt = model.configure_optimizers()
    losses = []
    for x, y in _data():

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            loss = nn.functional.mse_loss(model.net(x), y)
            opt.zero_grad()
            loss.backward()
            return loss.detach()

        loss = opt.step(closure)
        losses.append(float(loss))
    return [p.detach() for p in model.parameters()], losses


@pytest.mark.parametrize("optimizer", ["sgd", "lbfgs"])
def test_direct_and_layered_steps_match_a_plain_loop_bit_for_bit(optimizer: str) -> None:
    direct, layered = _Net(optimizer), _Layered(optimizer)
    assert _fit(direct).fit_loop.uses_direct_step
    assert not _fit(layered).fit_loop.uses_direct_step
    weights, losses = _plain(optimizer)
    for got in (direct, layered):
        assert all(torch.equal(a, b) for a, b in zip(got.parameters(), weights, strict=True))
    if optimizer == "sgd":  # LBFGS returns its first evaluation; on_train_batch_end sees the last
        assert direct.losses == layered.losses == losses
    else:
        assert direct.losses == layered.losses


class _BeforeBackward(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        self.calls += 1


class _AfterBackward(_Net):
    def on_after_backward(self) -> None:
        self.seen = True


class _OwnZeroGrad(_Net):
    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)


class _Manual(_Net):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        return None


class _ScaledBackward(SingleDeviceStrategy):
    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().backward(closure_loss * 1.0, optimizer, *args, **kwargs)


CUSTOMISED = {
    "accumulation": (_Net, {"accumulate_grad_batches": 2}),
    "gradient clipping": (_Net, {"gradient_clip_val": 0.5}),
    "a callback's on_before_backward": (_Net, {"callbacks": [_BeforeBackward()]}),
    "the Module's on_after_backward": (_AfterBackward, {}),
    "the Module's optimizer_zero_grad": (_OwnZeroGrad, {}),
    "manual optimization": (_Manual, {}),
    "mixed precision": (_Net, {"precision": "bf16-mixed"}),
    "a strategy's backward": (_Net, {"strategy": _ScaledBackward("cpu")}),
}


@pytest.mark.parametrize("case", list(CUSTOMISED))
def test_anything_customised_keeps_the_layered_step(case: str) -> None:
    cls, kwargs = CUSTOMISED[case]
    trainer = _fit(cls(), **kwargs)
    assert trainer.global_step in (STEPS, STEPS // 2)
    assert not trainer.fit_loop.uses_direct_step, case
    for callback in trainer.callbacks:
        if isinstance(callback, _BeforeBackward):
            assert callback.calls == STEPS


def test_an_instance_attribute_override_counts_as_customised() -> None:
    model = _Net()
    calls = []
    model.optimizer_zero_grad = lambda epoch, batch_idx, optimizer: calls.append(batch_idx) or optimizer.zero_grad()  # type: ignore[method-assign]
    trainer = _fit(model)
    assert not trainer.fit_loop.uses_direct_step
    assert calls == list(range(STEPS))


class _IgnoresClosure(torch.optim.SGD):
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None


class _BadOptimizer(_Net):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return _IgnoresClosure(self.parameters(), lr=0.1)


def test_an_optimizer_that_never_calls_the_closure_is_one_clear_error() -> None:
    with pytest.raises(MisconfigurationError, match=r"_IgnoresClosure\.step\(\) returned without calling its closure"):
        _fit(_BadOptimizer())


class _BackwardInStep(SingleDeviceStrategy):
    """A strategy whose training_step runs backward itself, as a pipeline schedule does."""

    @property
    def training_step_runs_backward(self) -> bool:
        return True

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        loss = super().training_step(*args, **kwargs)
        loss.backward()
        return loss.detach()


class _CountsBackward(Callback):
    def __init__(self) -> None:
        self.before = self.after = 0

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        self.before += 1

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.after += 1


def test_a_strategy_whose_step_ran_backward_is_not_backpropagated_twice() -> None:
    """Gradients are zeroed before the step and the loss is not backpropagated again: plain SGD numbers."""
    model, hooks = _Net(), _CountsBackward()
    trainer = _fit(model, strategy=_BackwardInStep(), callbacks=[hooks])
    assert not trainer.fit_loop.uses_direct_step
    weights, losses = _plain("sgd")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), weights, strict=True))
    assert model.losses == losses
    assert hooks.before == hooks.after == STEPS  # the hooks around backward still run
