"""The precision conformance kit: forward, backward and optimizer step against plain PyTorch, and resume.

```python
from phalanx.testing import PrecisionConformance

class TestMyPrecision(PrecisionConformance):
    precision = "my-fp8-mixed"   # the registered name, or the class / a factory
    autocast_dtype = "bfloat16"  # the plain-PyTorch equivalent the kit computes beside it
```

A precision is judged against what a user writes without phalanx. The kit drives the plugin exactly
as a strategy does (``setup``, ``convert_module``, ``connect``, ``train_step_context``,
``pre_backward`` / ``backward`` / ``post_backward`` inside the closure, ``optimizer_step``) on a
small MLP, and computes the same steps in plain PyTorch from the class attributes that describe
the equivalent: ``param_dtype`` (the module is cast to it, and so are the inputs), ``autocast_dtype``
(forward and loss under ``torch.autocast``) and ``scales_loss`` (a default ``torch.amp.GradScaler``).

- **forward**: the output inside ``train_step_context`` has the reference's dtype and values.
- **backward**: the gradients after the plugin's backward equal the reference's (scaled ones when
  the loss is scaled: a precision that forgets to scale underflows float16 gradients).
- **step**: four SGD-with-momentum steps give the reference's weights; with a scaler the second
  batch is non-finite and must be skipped, as ``GradScaler.step`` skips it.
- **resume**: ``state_dict()`` survives ``torch.save`` / ``torch.load(weights_only=True)`` into a
  fresh instance, which then holds the same state and trains on to the uninterrupted weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, ClassVar

import pytest

from phalanx.testing.kits._common import ConformanceKit, build

__all__ = ["PrecisionConformance"]

_LR, _MOMENTUM, _BATCHES = 0.1, 0.9, 4


def _model() -> Any:
    import torch

    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(bad_at: int | None) -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(5)
    batches = [
        (torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator)) for _ in range(_BATCHES)
    ]
    if bad_at is not None:  # an overflowed step: the scaler must skip it and lower the scale
        batches[bad_at][0][0, 0] = float("nan")
    return batches


def _max_diff(a: Any, b: Any) -> float:
    return float((a.detach().cpu().double() - b.detach().cpu().double()).abs().max())


class _Plain:
    """The plain-PyTorch twin: the training a user writes for this precision by hand."""

    def __init__(self, kit: type[PrecisionConformance]) -> None:
        import torch

        self.device = torch.device(kit.device)
        self.dtype = getattr(torch, kit.param_dtype)
        self.autocast = getattr(torch, kit.autocast_dtype) if kit.autocast_dtype else None
        self.model = _model().to(self.device, self.dtype)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=_LR, momentum=_MOMENTUM)
        self.scaler = torch.amp.GradScaler(self.device.type) if kit.scales_loss else None

    def context(self) -> Any:
        import torch

        return torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None else nullcontext()

    def forward(self, x: Any, y: Any) -> tuple[Any, Any]:
        import torch

        with self.context():
            out = self.model(x.to(self.device, self.dtype))
            loss = torch.nn.functional.mse_loss(out.float(), y.to(self.device))
        return out, loss

    def backward(self, x: Any, y: Any) -> None:
        _, loss = self.forward(x, y)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, x: Any, y: Any) -> None:
        self.optimizer.zero_grad()
        self.backward(x, y)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()


class _Driven:
    """The plugin driven through the hooks in the order a strategy calls them."""

    def __init__(
        self, plugin: Any, kit: type[PrecisionConformance], model: Any = None, optimizer_state: Any = None
    ) -> None:
        import torch

        self.plugin, self.device = plugin, torch.device(kit.device)
        plugin.setup(self.device)
        self.model = plugin.convert_module((model if model is not None else _model()).to(self.device))
        optimizer = torch.optim.SGD(self.model.parameters(), lr=_LR, momentum=_MOMENTUM)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        self.model, [self.optimizer] = plugin.connect(self.model, [optimizer])

    def forward(self, x: Any, y: Any) -> tuple[Any, Any]:
        import torch

        with self.plugin.train_step_context():
            out = self.model(self.plugin.convert_input(x.to(self.device)))
            loss = torch.nn.functional.mse_loss(out.float(), y.to(self.device))
        return out, loss

    def closure(self, x: Any, y: Any) -> Callable[[], Any]:
        def run() -> Any:
            self.optimizer.zero_grad()
            _, loss = self.forward(x, y)
            loss = self.plugin.pre_backward(loss, self.model)
            self.plugin.backward(loss, self.model, self.optimizer)
            return self.plugin.post_backward(loss, self.model)

        return run

    def step(self, x: Any, y: Any) -> None:
        self.plugin.optimizer_step(self.optimizer, self.model, self.closure(x, y))


class PrecisionConformance(ConformanceKit):
    """Subclass with ``precision`` set and the plain-PyTorch equivalent described; pytest runs the checks."""

    precision: ClassVar[Any] = ""
    #: Keyword arguments for the factory (or overrides of the registered init params).
    precision_params: ClassVar[dict[str, Any]] = {}
    #: dtype name (``torch.<name>``) the module's parameters and the inputs have in the equivalent.
    param_dtype: ClassVar[str] = "float32"
    #: dtype name of ``torch.autocast`` around forward and loss in the equivalent; None: no autocast.
    autocast_dtype: ClassVar[str | None] = None
    #: Whether the equivalent scales the loss with a default ``torch.amp.GradScaler``.
    scales_loss: ClassVar[bool] = False
    device: ClassVar[str] = "cpu"
    atol: ClassVar[float] = 1e-6
    check_resume: ClassVar[bool] = True

    _OPT_OUTS: ClassVar[dict[str, str]] = {"test_state_survives_resume": "check_resume"}

    @classmethod
    def _plugin(cls) -> Any:
        from phalanx.registry import PrecisionRegistry

        return build(cls.precision, PrecisionRegistry, cls.precision_params, what="precision")

    @classmethod
    def _bad_at(cls) -> int | None:
        return 1 if cls.scales_loss else None

    def test_registered_and_described(self) -> None:
        from phalanx.precision import Precision
        from phalanx.registry import PrecisionRegistry

        assert self.precision, "set the class attribute `precision` to the registered name, the class or a factory"
        if isinstance(self.precision, str):
            entry = PrecisionRegistry.entry(self.precision)
            assert entry.unavailable_reason() is None, entry.unavailable_reason()
            assert entry.description, f"{self.precision!r} has no description; pass one to registry.register"
        plugin = self._plugin()
        assert isinstance(plugin, Precision), f"{plugin!r} is not a phalanx Precision"

    def test_forward_matches_plain_torch(self) -> None:
        plain, driven = _Plain(type(self)), _Driven(self._plugin(), type(self))
        x, y = _batches(None)[0]
        (expected, expected_loss), (out, loss) = plain.forward(x, y), driven.forward(x, y)
        assert out.dtype == expected.dtype, f"forward gave {out.dtype}, the plain-PyTorch equivalent {expected.dtype}"
        diff = _max_diff(out, expected)
        assert diff <= self.atol, f"forward output differs from plain PyTorch by {diff:.3g} (atol={self.atol:g})"
        assert _max_diff(loss, expected_loss) <= self.atol, (
            f"loss {loss.item()!r} != plain PyTorch {expected_loss.item()!r}"
        )

    def test_backward_matches_plain_torch(self) -> None:
        plain, driven = _Plain(type(self)), _Driven(self._plugin(), type(self))
        x, y = _batches(None)[0]
        plain.backward(x, y)
        driven.closure(x, y)()
        for (name, expected), got in zip(plain.model.named_parameters(), driven.model.parameters()):
            assert got.grad is not None, f"{name} has no gradient after the plugin's backward"
            diff = _max_diff(got.grad, expected.grad)
            scale = float(expected.grad.abs().max()) or 1.0
            assert diff <= self.atol * scale, (
                f"{name}.grad differs from plain PyTorch by {diff:.3g} (largest gradient {scale:.3g}); "
                "is the loss scaled (or not) like the equivalent?"
            )

    def test_steps_match_plain_torch(self) -> None:
        plain, driven = _Plain(type(self)), _Driven(self._plugin(), type(self))
        for x, y in _batches(self._bad_at()):
            plain.step(x, y)
            driven.step(x, y)
        for (name, expected), got in zip(plain.model.named_parameters(), driven.model.parameters()):
            import torch

            assert bool(torch.isfinite(got).all()), (
                f"{name} is not finite after the steps: an overflowed step was not skipped"
            )
            diff = _max_diff(got, expected)
            assert diff <= self.atol, (
                f"{name} differs from plain PyTorch by {diff:.3g} after {_BATCHES} steps (atol={self.atol:g})"
            )

    def test_state_survives_resume(self, tmp_path: Path) -> None:
        import torch

        batches = _batches(self._bad_at())
        first = _Driven(self._plugin(), type(self))
        for x, y in batches[:2]:
            first.step(x, y)
        saved = first.plugin.state_dict()
        path = tmp_path / "precision.ckpt"
        torch.save(
            {"precision": saved, "model": first.model.state_dict(), "optimizer": first.optimizer.state_dict()}, path
        )
        checkpoint = torch.load(path, weights_only=True)
        fresh = self._plugin()
        fresh.load_state_dict(checkpoint["precision"])
        model = _model()
        model.load_state_dict({k: v.float() for k, v in checkpoint["model"].items()})
        second = _Driven(fresh, type(self), model=model, optimizer_state=checkpoint["optimizer"])
        _assert_same_state(second.plugin.state_dict(), saved, "right after load_state_dict")
        for x, y in batches[2:] + batches[:1]:
            first.step(x, y)
            second.step(x, y)
        _assert_same_state(second.plugin.state_dict(), first.plugin.state_dict(), "after training on")
        for got, expected in zip(second.model.parameters(), first.model.parameters()):
            diff = _max_diff(got, expected)
            assert diff <= self.atol, f"the resumed run's weights differ from the uninterrupted run's by {diff:.3g}"


def _assert_same_state(got: Any, expected: Any, when: str) -> None:
    import torch

    def norm(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().tolist()
        if isinstance(value, dict):
            return {k: norm(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [norm(v) for v in value]
        return value

    got, expected = norm(got), norm(copy.deepcopy(expected))
    if got != expected:
        pytest.fail(
            f"the precision's state {when} is {got!r}, expected the saved {expected!r}: state_dict/load_state_dict lose it"
        )
