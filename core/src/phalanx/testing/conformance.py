"""The strategy conformance kit: one class a plugin author subclasses in their own test suite.

```python
from phalanx.testing import StrategyConformance

class TestMyStrategy(StrategyConformance):
    strategy = "my_strategy"   # the registered name
    devices = 2
```

pytest then runs every ``test_*`` method below against the installed plugin. Each run happens in a
fresh Python process started from a generated script (strategies such as ddp re-execute the
script, so it must not be the pytest process), with a timeout that kills the whole process group.
Numbers are compared with a plain PyTorch run computed in the test process: a data-parallel
strategy with ``W`` ranks and ``B`` samples per rank must produce the weights of single-process SGD
on the union of the ranks' batches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

__all__ = ["ScriptResult", "StrategyConformance", "reference_run", "run_script"]

FEATURES, OUTPUTS, SAMPLES, BATCH, LR = 6, 3, 48, 4, 0.1

_SCRIPT = '''
import json, os, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from phalanx import Module, Trainer
from phalanx.plugins import convert_checkpoint

OUT = {out!r}
FEATURES, OUTPUTS, SAMPLES, BATCH, LR = {features}, {outputs}, {samples}, {batch}, {lr}


def make_data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = torch.randn(SAMPLES, OUTPUTS, generator=g)
    return TensorDataset(x, y)


class Net(Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.hidden = torch.nn.Linear(FEATURES, 8)
        self.head = torch.nn.Linear(8, OUTPUTS)

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        if self.global_rank == 0:  # written by the worker itself: spawn launchers keep no Python state
            with open(os.path.join(OUT, "losses.txt"), "a") as f:
                f.write(f"{{loss.item()!r}}\\n")
        if {fail_at_step} >= 0 and self.global_step == {fail_at_step} and self.global_rank == self.trainer.world_size - 1:
            raise RuntimeError("conformance: deliberate failure on the last rank")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)

    def train_dataloader(self):
        return DataLoader(make_data(), batch_size=BATCH, shuffle=False)


if __name__ == "__main__":
    model = Net()
    trainer = Trainer(
        strategy={strategy!r}, accelerator={accelerator!r}, devices={devices}, max_steps={steps},
        logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=OUT,
    )
    trainer.fit(model)
    ckpt = os.path.join(OUT, "final.ckpt")
    trainer.save_checkpoint(ckpt)
    if trainer.is_global_zero:
        convert_checkpoint(ckpt, os.path.join(OUT, "portable.ckpt"))
        with open(os.path.join(OUT, "result.json"), "w") as f:
            json.dump({{"world_size": trainer.world_size,
                        "strategy": type(trainer.strategy).__name__}}, f)
'''


class ScriptResult:
    """Exit code, output and wall time of a script run by :func:`run_script`."""

    def __init__(self, returncode: int, stdout: str, stderr: str, seconds: float) -> None:
        self.returncode, self.stdout, self.stderr, self.seconds = returncode, stdout, stderr, seconds

    def check(self) -> ScriptResult:
        """Raise with the script's output when it failed."""
        if self.returncode != 0:
            msg = f"script exited with {self.returncode} after {self.seconds:.1f}s\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
            raise AssertionError(msg)
        return self


def run_script(path: Path, *, timeout: float = 240.0, env: dict[str, str] | None = None) -> ScriptResult:
    """Run ``python path`` in its own process group; on timeout kill the group, never hang."""
    start = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        cwd=str(path.parent),
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{path.name} did not finish within {timeout}s (killed its process group)\n{out}\n{err}")
    return ScriptResult(process.returncode, out, err, time.monotonic() - start)


def reference_run(world_size: int, steps: int) -> tuple[dict[str, Any], list[float]]:
    """Plain PyTorch: SGD on the union of ``world_size`` ranks' batches (DistributedSampler order).

    Returns the final state dict and rank 0's per-step loss (its own half of each global batch).
    """
    import torch

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = torch.randn(SAMPLES, OUTPUTS, generator=g)
    torch.manual_seed(7)
    hidden, head = torch.nn.Linear(FEATURES, 8), torch.nn.Linear(8, OUTPUTS)
    model = torch.nn.Sequential()
    model.add_module("hidden", hidden)
    model.add_module("act", torch.nn.Tanh())
    model.add_module("head", head)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_rank = [list(range(r, SAMPLES, world_size)) for r in range(world_size)]
    batches_per_epoch = len(per_rank[0]) // BATCH
    losses = []
    for step in range(steps):
        b = step % batches_per_epoch
        rank_losses = []
        for rank in range(world_size):
            idx = per_rank[rank][b * BATCH : (b + 1) * BATCH]
            rank_losses.append(torch.nn.functional.mse_loss(model(x[idx]), y[idx]))
        losses.append(rank_losses[0].item())
        optimizer.zero_grad()
        torch.stack(rank_losses).mean().backward()
        optimizer.step()
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if k.split(".")[0] in {"hidden", "head"}}
    return state, losses


@pytest.mark.phalanx_conformance
class StrategyConformance:
    """Subclass with ``strategy`` (registered name) and ``devices`` set; pytest collects the tests."""

    strategy: ClassVar[str] = ""
    devices: ClassVar[int] = 1
    accelerator: ClassVar[str] = "cpu"
    steps: ClassVar[int] = 8
    #: Absolute tolerance on weights and losses against the plain PyTorch reference.
    atol: ClassVar[float] = 1e-5
    timeout: ClassVar[float] = 240.0

    def _write(self, tmp_path: Path, template: str = _SCRIPT, **extra: Any) -> Path:
        script = tmp_path / "conformance_run.py"
        params = dict(
            out=str(tmp_path), features=FEATURES, outputs=OUTPUTS, samples=SAMPLES, batch=BATCH, lr=LR,
            strategy=self.strategy, accelerator=self.accelerator, devices=self.devices, steps=self.steps,
            fail_at_step=-1,
        )
        script.write_text(textwrap.dedent(template.format(**{**params, **extra})))
        return script

    def test_registered_and_available(self) -> None:
        from phalanx.registry import StrategyRegistry
        from phalanx.strategies import Strategy

        assert self.strategy, "set the class attribute `strategy` to the registered name"
        entry = StrategyRegistry.entry(self.strategy)
        assert entry.unavailable_reason() is None, entry.unavailable_reason()
        assert entry.description, f"{self.strategy!r} has no description; pass one to registry.register"
        assert issubclass(StrategyRegistry.get_class(self.strategy), Strategy)

    def test_components_are_filled_in(self) -> None:
        from phalanx import Trainer
        from phalanx.accelerators import Accelerator
        from phalanx.checkpoint_io import CheckpointIO
        from phalanx.environments import ClusterEnvironment
        from phalanx.precision import Precision
        from phalanx.registry import AcceleratorRegistry
        from phalanx.strategies import ParallelStrategy

        trainer = Trainer(strategy=self.strategy, accelerator=self.accelerator, devices=self.devices, logger=False, enable_progress_bar=False)
        strategy = trainer.strategy
        parts = {"accelerator": Accelerator, "precision_plugin": Precision, "checkpoint_io": CheckpointIO}
        if isinstance(strategy, ParallelStrategy):
            parts["cluster_environment"] = ClusterEnvironment
        for part, kind in parts.items():
            value = getattr(strategy, part)
            assert isinstance(value, kind), f"{type(strategy).__name__}.{part} is {value!r} after Trainer connected it, not a {kind.__name__}"
        expected = AcceleratorRegistry.get_class(self.accelerator)
        assert isinstance(strategy.accelerator, expected), f"accelerator={self.accelerator!r} gave {strategy.accelerator!r}"
        assert trainer.world_size == self.devices, f"devices={self.devices} gave world_size={trainer.world_size}"

    def test_fit_matches_plain_pytorch(self, tmp_path: Path) -> None:
        import torch

        run_script(self._write(tmp_path), timeout=self.timeout).check()
        result = json.loads((tmp_path / "result.json").read_text())
        losses = [float(line) for line in (tmp_path / "losses.txt").read_text().split()]
        expected_state, expected_losses = reference_run(result["world_size"], self.steps)
        assert result["world_size"] == self.devices
        assert len(losses) == self.steps
        assert max(abs(a - b) for a, b in zip(losses, expected_losses)) <= self.atol
        portable = torch.load(tmp_path / "portable.ckpt", weights_only=True)["state_dict"]
        for name, value in expected_state.items():
            assert torch.allclose(portable[name], value, atol=self.atol, rtol=0), name

    def test_failing_rank_stops_the_job(self, tmp_path: Path) -> None:
        result = run_script(self._write(tmp_path, fail_at_step=2), timeout=self.timeout)
        assert result.returncode != 0, "a rank raised but the job exited 0"
        assert "deliberate failure on the last rank" in result.stdout + result.stderr
        assert not (tmp_path / "result.json").exists()
