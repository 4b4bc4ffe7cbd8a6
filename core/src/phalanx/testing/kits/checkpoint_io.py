"""The checkpoint IO conformance kit: round trip, atomic under kill -9, flush on teardown, remove.

```python
from phalanx.testing import CheckpointIOConformance

class TestMyIO(CheckpointIOConformance):
    checkpoint_io = "my_store"   # the registered name, or the class / a factory
```

What a CheckpointIO owes a training run, and so what the kit checks:

- **round trip**: a real checkpoint (model and SGD-with-momentum optimizer state after a few
  steps, loop counters, callback and precision state, bf16 / int64 / bool tensors, ``None``,
  strings, tuples) loads back with ``weights_only=True`` equal in structure, types, dtypes and
  values; it holds what was passed *when* ``save_checkpoint`` returned (the caller keeps training
  in place); a fresh model and optimizer restored from it train on to the same weights; a second
  save to the same path replaces the first.
- **atomic under kill -9**: a process killed in the middle of overwriting a checkpoint (while
  serialising, and at a write; see :mod:`phalanx.testing.kits._checkpoint_script`) leaves the
  previous checkpoint loadable at the path.
- **teardown flushes**: every save requested before ``teardown()`` is on storage, complete, when
  it returns, and no thread the IO started is left running.
- **remove**: a removed checkpoint is gone, and removing a missing path is not an error.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from phalanx.testing.kits._checkpoint_script import KILL_POINTS, first_checkpoint, render_kill_script
from phalanx.testing.kits._common import ConformanceKit, build, import_paths, target_spec

__all__ = ["CheckpointIOConformance"]


def _real_checkpoint() -> tuple[dict[str, Any], Any, Any]:
    """A checkpoint as a Trainer writes it, with the model and optimizer it came from."""
    import torch

    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(2)
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(
            model(torch.randn(4, 6, generator=generator)), torch.randn(4, 3, generator=generator)
        ).backward()
        optimizer.step()
    checkpoint = {
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [],
        "epoch": 1,
        "global_step": 3,
        "loops": {"fit_loop": {"epoch_progress": {"current": 1}, "batch": 3}},
        "callbacks": {"Counter{}": {"count": 3, "best": torch.tensor(0.25)}},
        "precision": {"scale": torch.tensor(32768.0), "_growth_tracker": 0},
        "extra": {
            "bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
            "int64": torch.arange(5, dtype=torch.int64) * 10**12,
            "bool": torch.tensor([True, False]),
            "none": None,
            "text": "phalanx",
            "pair": (1, 2.5),
        },
    }
    return checkpoint, model, optimizer


def _same(got: Any, expected: Any, where: str = "checkpoint") -> None:
    import torch

    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where} came back as {type(got).__name__}, not a tensor"
        assert got.dtype == expected.dtype, f"{where} came back as {got.dtype}, was saved as {expected.dtype}"
        assert got.shape == expected.shape and torch.equal(got.cpu(), expected.cpu()), (
            f"{where} came back with other values"
        )
        return
    assert type(got) is type(expected), (
        f"{where} came back as {type(got).__name__}, was saved as {type(expected).__name__}"
    )
    if isinstance(expected, dict):
        assert list(got) == list(expected), f"{where} came back with keys {list(got)}, saved {list(expected)}"
        for key in expected:
            _same(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{where} came back with {len(got)} items, saved {len(expected)}"
        for index, (a, b) in enumerate(zip(got, expected)):
            _same(a, b, f"{where}[{index}]")
    else:
        assert got == expected, f"{where} came back as {got!r}, was saved as {expected!r}"


def _clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return type(value)((k, _clone(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


class CheckpointIOConformance(ConformanceKit):
    """Subclass with ``checkpoint_io`` set (registered name, class or factory); pytest runs the checks."""

    checkpoint_io: ClassVar[Any] = ""
    #: Keyword arguments for the factory (or overrides of the registered init params).
    checkpoint_io_params: ClassVar[dict[str, Any]] = {}
    #: Where the kill check interrupts a save (a subset of ``("serialising", "writing")``).
    kill_points: ClassVar[tuple[str, ...]] = KILL_POINTS
    timeout: ClassVar[float] = 60.0
    check_kill: ClassVar[bool] = True

    _OPT_OUTS: ClassVar[dict[str, str]] = {"test_killed_mid_save_keeps_the_previous_checkpoint": "check_kill"}

    @classmethod
    def _io(cls) -> Any:
        from phalanx.registry import CheckpointIORegistry

        return build(cls.checkpoint_io, CheckpointIORegistry, cls.checkpoint_io_params, what="checkpoint_io")

    def test_registered_and_described(self) -> None:
        from phalanx.checkpoint_io import CheckpointIO
        from phalanx.registry import CheckpointIORegistry

        assert self.checkpoint_io, (
            "set the class attribute `checkpoint_io` to the registered name, the class or a factory"
        )
        if isinstance(self.checkpoint_io, str):
            entry = CheckpointIORegistry.entry(self.checkpoint_io)
            assert entry.unavailable_reason() is None, entry.unavailable_reason()
            assert entry.description, f"{self.checkpoint_io!r} has no description; pass one to registry.register"
        assert isinstance(self._io(), CheckpointIO), "the plugin is not a phalanx CheckpointIO"

    def test_round_trip(self, tmp_path: Path) -> None:
        import torch

        io = self._io()
        checkpoint, model, _ = _real_checkpoint()
        expected = _clone(checkpoint)
        path = tmp_path / "ckpts" / "epoch=1-step=3.ckpt"
        try:
            io.save_checkpoint({"ballast": torch.randn(1024, 1024)}, tmp_path / "ckpts" / "ballast.ckpt")
            io.save_checkpoint(checkpoint, path)
            with torch.no_grad():  # the caller trains on in place the moment save returns
                for parameter in model.parameters():
                    parameter.add_(1.0)
            loaded = io.load_checkpoint(path, weights_only=True)
            _same(loaded, expected)
            generator = torch.Generator().manual_seed(9)
            batch = (torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator))
            resumed, original = _restore(loaded), _restore(expected)
            for net, opt in (resumed, original):
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(batch[0]), batch[1]).backward()
                opt.step()
            for a, b in zip(resumed[0].parameters(), original[0].parameters()):
                assert torch.equal(a, b), (
                    "a model and optimizer restored from the loaded checkpoint train to other weights"
                )
            io.save_checkpoint({"global_step": 4}, path)
            assert io.load_checkpoint(path)["global_step"] == 4, (
                "a second save to the same path did not replace the first"
            )
        finally:
            io.teardown()

    def test_killed_mid_save_keeps_the_previous_checkpoint(self, tmp_path: Path) -> None:
        import signal

        from phalanx.testing.processes import Job

        spec, paths = target_spec(self.checkpoint_io), import_paths()
        jobs = {}
        for mode in self.kill_points:  # both at once: each is mostly a fresh interpreter importing torch
            out = tmp_path / mode
            out.mkdir()
            script = render_kill_script(
                out / "kill_mid_save.py", spec=spec, params=self.checkpoint_io_params, out=out, mode=mode, paths=paths
            )
            jobs[mode] = Job([str(script)], out, cwd=out, name="run", warm=True)
        try:
            codes = {
                mode: _kill_when_serialising(job, tmp_path / mode, self.timeout)
                if mode == "serialising"
                else job.wait(self.timeout)
                for mode, job in jobs.items()
            }
        finally:
            leftovers = {mode: job.kill_leftovers() for mode, job in jobs.items()}
        for mode, job in jobs.items():
            assert not leftovers[mode], f"the kill-mid-save run ({mode}) left processes behind\n{job.output()}"
            expected = -signal.SIGKILL if mode == "serialising" else -signal.SIGXFSZ
            assert codes[mode] == expected, (
                f"the save was not interrupted while {mode} (exit {codes[mode]})\n{job.output()}"
            )
        for mode in self.kill_points:
            out = tmp_path / mode
            io = self._io()
            try:
                loaded = io.load_checkpoint(out / "ckpt" / "last.ckpt", weights_only=True)
            except Exception as error:
                raise AssertionError(
                    f"killed while {mode} a checkpoint over the previous one, the path no longer loads ({error!r}): "
                    "write to a temporary name beside the target and rename it over the target when complete"
                ) from error
            finally:
                io.teardown()
            _same(loaded, first_checkpoint(), f"the previous checkpoint (killed while {mode})")

    def test_teardown_flushes_pending_saves(self, tmp_path: Path) -> None:
        import torch

        io = self._io()
        before = {t.ident for t in threading.enumerate()}
        saved = {}
        for index in range(3):
            payload = {"index": index, "weights": torch.full((512, 512), float(index))}
            saved[index] = payload
            io.save_checkpoint(payload, tmp_path / f"step={index}.ckpt")
            io.save_checkpoint(payload, tmp_path / "last.ckpt")
        io.teardown()
        reader = self._io()
        try:
            for index, payload in saved.items():
                assert (tmp_path / f"step={index}.ckpt").exists(), (
                    f"step={index}.ckpt is missing after teardown(): a save was dropped"
                )
                _same(reader.load_checkpoint(tmp_path / f"step={index}.ckpt"), payload, f"step={index}.ckpt")
            _same(reader.load_checkpoint(tmp_path / "last.ckpt"), saved[2], "last.ckpt (the last of three saves)")
        finally:
            reader.teardown()
        deadline = time.monotonic() + 2.0
        left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [t for t in left if t.is_alive()]
        assert not left, f"threads started by the IO are still running after teardown(): {[t.name for t in left]}"

    def test_remove(self, tmp_path: Path) -> None:
        import torch

        io = self._io()
        path = tmp_path / "old.ckpt"
        try:
            io.save_checkpoint({"weights": torch.ones(3)}, path)
            assert io.load_checkpoint(path)["weights"].tolist() == [1.0, 1.0, 1.0]
            io.remove_checkpoint(path)
            io.remove_checkpoint(tmp_path / "never-written.ckpt")  # missing: not an error
        finally:
            io.teardown()
        assert not path.exists(), f"remove_checkpoint({str(path)!r}) left the file in place"


def _kill_when_serialising(job: Any, out: Path, timeout: float) -> int:
    """SIGKILL the job's process group once its second save announces it is serialising."""
    import signal

    deadline = time.monotonic() + timeout
    while not (out / "serialising").exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if (out / "serialising").exists():
        job.signal_group(signal.SIGKILL)
    return int(job.wait(timeout))


def _restore(checkpoint: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model.load_state_dict(checkpoint["state_dict"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    return model, optimizer
