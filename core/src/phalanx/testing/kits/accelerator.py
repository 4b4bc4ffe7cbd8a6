"""The accelerator conformance kit: ``devices=`` parsing, a side-effect-free ``is_available``, real placement, a fit.

```python
from phalanx.testing import AcceleratorConformance

class TestMyAccelerator(AcceleratorConformance):
    accelerator = "my_device"   # the registered name, or the class
```

What an accelerator owes the Trainer, and so what the kit checks:

- **registered**: a registered name is available, described and names an ``Accelerator``.
- **is_available without side effects**: ``is_available()`` and ``auto_device_count()`` answer
  the same twice and leave the process as they found it: no environment variable set, no thread
  or file descriptor left open, CUDA not initialised. The Trainer asks them while it resolves
  ``"auto"``, before any process is started: a runtime brought up there breaks ``fork`` and pins
  devices before ``CUDA_VISIBLE_DEVICES``-style selection happens.
- **devices parsing**: ``"auto"`` and counts give that many ``torch.device`` of the accelerator's
  type (its ``name``, or the kit's ``device_type``); 0, negative counts, words, booleans and floats are refused with a ``MisconfigurationError``
  that names the value; an enumerable accelerator refuses more devices than it has.
- **placement**: a tensor and a module moved to the reported device are there, and arithmetic on
  it gives plain PyTorch's CPU numbers.
- **fit**: ``Trainer(accelerator=...)`` trains a tiny model on the device (the parameters and the
  batches are there in ``training_step``) to plain PyTorch's weights, and leaves torch's global
  state (default dtype, grad mode, thread count) as it found it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from phalanx.testing.kits._common import ConformanceKit, build, environment_diff

__all__ = ["AcceleratorConformance"]

_STEPS, _LR = 4, 0.1


def _open_fds() -> set[str]:
    try:
        return set(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: nothing to compare
        return set()


def _threads() -> set[int]:
    try:
        native = {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        native = set()
    return native | {t.ident or 0 for t in threading.enumerate()}


class AcceleratorConformance(ConformanceKit):
    """Subclass with ``accelerator`` set (registered name or class); pytest runs the checks."""

    accelerator: ClassVar[Any] = ""
    #: ``Trainer(devices=...)`` for the fit and the placement checks.
    devices: ClassVar[Any] = 1
    #: False where ``devices`` counts processes rather than hardware (cpu): no upper bound is checked.
    enumerable: ClassVar[bool] = True
    #: The torch device type the accelerator's devices have; None: its ``name`` (``cuda``, ``xla``).
    #: A package written before its device's torch backend exists (``phalanx new accelerator``)
    #: computes on ``"cpu"`` and says so here.
    device_type: ClassVar[str | None] = None
    atol: ClassVar[float] = 1e-5
    check_fit: ClassVar[bool] = True

    _OPT_OUTS: ClassVar[dict[str, str]] = {"test_fit_runs_on_the_device": "check_fit"}

    @classmethod
    def _class(cls) -> Any:
        from phalanx.registry import AcceleratorRegistry

        value = cls.accelerator
        return AcceleratorRegistry.get_class(value) if isinstance(value, str) and value else value

    @classmethod
    def _instance(cls) -> Any:
        from phalanx.registry import AcceleratorRegistry

        return build(cls.accelerator, AcceleratorRegistry, {}, what="accelerator")

    @classmethod
    def _device(cls) -> Any:
        return cls._class().get_parallel_devices(cls.devices)[0]

    def test_registered_and_described(self) -> None:
        from phalanx.accelerators import Accelerator
        from phalanx.registry import AcceleratorRegistry

        assert self.accelerator, "set the class attribute `accelerator` to the registered name or the class"
        if isinstance(self.accelerator, str):
            entry = AcceleratorRegistry.entry(self.accelerator)
            assert entry.unavailable_reason() is None, entry.unavailable_reason()
            assert entry.description, f"{self.accelerator!r} has no description; pass one to registry.register"
        cls = self._class()
        assert isinstance(cls, type) and issubclass(cls, Accelerator), f"{cls!r} is not a phalanx Accelerator subclass"
        assert cls.name, f"{cls.__name__}.name is empty; set it to the registry name (the torch device type)"

    def test_is_available_has_no_side_effects(self) -> None:
        import torch

        cls = self._class()  # importing the module may do work; asking must not
        cuda_before = torch.cuda.is_initialized()
        env, fds, threads = dict(os.environ), _open_fds(), _threads()
        answers = [(cls.is_available(), cls.auto_device_count()) for _ in range(2)]
        changed = environment_diff(env, os.environ)
        for key in changed:  # restore before failing, so the next check starts clean
            if key in env:
                os.environ[key] = env[key]
            else:
                os.environ.pop(key, None)
        assert not changed, f"{cls.__name__}.is_available()/auto_device_count() changed environment variables {changed}"
        assert answers[0] == answers[1], f"is_available()/auto_device_count() answered {answers[0]} then {answers[1]}"
        available, count = answers[0]
        assert isinstance(available, bool) and isinstance(count, int), f"got {answers[0]!r}: expected (bool, int)"
        assert available, f"{cls.__name__}.is_available() is False here; run the kit where the hardware is"
        assert count >= 1, f"{cls.__name__}.auto_device_count() is {count} although is_available() is True"
        new_threads = _threads() - threads
        assert not new_threads, (
            f"is_available()/auto_device_count() left {len(new_threads)} new thread(s) running: a runtime was started"
        )
        new_fds = _open_fds() - fds
        assert not new_fds, (
            f"is_available()/auto_device_count() left {len(new_fds)} file descriptor(s) open: a device or driver was opened"
        )
        assert torch.cuda.is_initialized() == cuda_before, (
            "is_available()/auto_device_count() initialised CUDA (breaks fork)"
        )

    def test_parses_devices(self) -> None:
        import torch

        from phalanx.errors import MisconfigurationError

        cls = self._class()
        available = cls.auto_device_count()
        counts = [1, 2] if not self.enumerable else list(range(1, min(available, 2) + 1))
        for count in counts:
            for spelling in (count, str(count)):
                devices = cls.get_parallel_devices(spelling)
                assert len(devices) == count, f"devices={spelling!r} gave {len(devices)} device(s): {devices}"
                for device in devices:
                    assert isinstance(device, torch.device), f"devices={spelling!r} gave {device!r}, not a torch.device"
                    expected = self.device_type or cls.name
                    assert device.type == expected, (
                        f"{cls.__name__} (name {cls.name!r}) reported a {device.type!r} device, expected {expected!r}"
                    )
        assert len(cls.get_parallel_devices("auto")) == len(cls.get_parallel_devices(cls.parse_devices("auto")))
        invalid: list[Any] = [0, -2, "zero", True, 1.5]
        if self.enumerable:
            invalid.append(available + 1)
        for value in invalid:
            with pytest.raises(MisconfigurationError) as caught:
                cls.get_parallel_devices(value)
            assert repr(value) in str(caught.value), (
                f"the error for devices={value!r} does not name the value: {caught.value}"
            )

    def test_tensors_land_on_the_reported_device(self) -> None:
        import torch

        accelerator, device = self._instance(), self._device()
        accelerator.setup_device(device)
        try:
            generator = torch.Generator().manual_seed(0)
            x, w = torch.randn(5, 4, generator=generator), torch.randn(4, 3, generator=generator)
            on_device = x.to(device)
            assert on_device.device.type == device.type, f"a tensor moved to {device} is on {on_device.device}"
            layer = torch.nn.Linear(4, 3).to(device)
            assert {p.device.type for p in layer.parameters()} == {device.type}, (
                f"a module moved to {device} is elsewhere"
            )
            try:
                result = (on_device @ w.to(device)).to("cpu")
            except Exception as error:
                raise AssertionError(
                    f"x @ w computed on {device} could not be read back to the CPU: {error}"
                ) from error
            worst = float((result - x @ w).abs().max())
            assert worst <= self.atol, f"x @ w on {device} differs from the CPU result by {worst:.3g}"
        finally:
            accelerator.teardown()

    def test_fit_runs_on_the_device(self, tmp_path: Path) -> None:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from phalanx import Module, Trainer

        seen: set[str] = set()

        class Tiny(Module):
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.layer = torch.nn.Linear(4, 2)

            def training_step(self, batch: Any, batch_idx: int) -> Any:
                x, y = batch
                seen.update({x.device.type, self.layer.weight.device.type})
                return torch.nn.functional.mse_loss(self.layer(x), y)

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=_LR, momentum=0.9)

        generator = torch.Generator().manual_seed(1)
        x, y = torch.randn(16, 4, generator=generator), torch.randn(16, 2, generator=generator)
        state = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())
        model = Tiny()
        accelerator = self.accelerator if isinstance(self.accelerator, str) else self._instance()
        trainer = Trainer(
            accelerator=accelerator,
            devices=self.devices,
            max_steps=_STEPS,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=4))
        after = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())
        torch.set_default_dtype(state[0])
        assert after == state, f"after fit torch's (default dtype, grad mode, threads) are {after}, were {state}"
        assert seen == {self._device().type}, (
            f"training_step saw parameters/batches on {sorted(seen)}, expected {self._device().type!r}"
        )
        torch.manual_seed(0)
        plain = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(plain.parameters(), lr=_LR, momentum=0.9)
        for step in range(_STEPS):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(plain(x[step * 4 : step * 4 + 4]), y[step * 4 : step * 4 + 4]).backward()
            optimizer.step()
        worst = float((model.layer.weight.detach().cpu() - plain.weight.detach()).abs().max())
        assert worst <= self.atol, f"weights after fit differ from plain PyTorch by {worst:.3g} (atol={self.atol:g})"
