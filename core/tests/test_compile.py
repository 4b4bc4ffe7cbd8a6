"""``trainer.fit(torch.compile(model))``: unwrapped, wrapped by the strategy, compiled again with the
same options; per-step losses equal the eager run's; one clear error when compiling fails.

The inductor test pays one real compile (about 10-20 s on a CPU); the others use cheap backends.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trainer_helpers import loader, quiet

from phalanx import Module, Trainer
from phalanx.errors import MisconfigurationError
from phalanx.testing.processes import run_command
from phalanx.utilities.compile import compile_context, from_compiled

pytestmark = pytest.mark.timeout(180)


class Tiny(Module):
    """Deterministic (no dropout): compiled and eager losses can be compared step by step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.05)


def _eager_losses(n: int = 24, epochs: int = 2) -> list[float]:
    model = Tiny()
    Trainer(**quiet(max_epochs=epochs)).fit(model, loader(n=n))
    return model.losses


def _inductor_run() -> dict[str, Any]:
    """One fit of ``torch.compile(model)`` with inductor (run in a child process, see below)."""
    import torch._dynamo

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("phalanx.compile").addHandler(Keep())
    model = Tiny()
    compiled = torch.compile(model, backend="inductor", dynamic=False)
    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(compiled, loader(n=24))
    return {
        "same_module": trainer.lightning_module is model,
        "forward_compiled": "forward" in vars(model) and compile_context(model) is compiled.dynamo_ctx,
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "reports": [r for r in records if "torch.compile under strategy='single_device'" in r],
        "losses": model.losses,
    }


def test_fit_compiled_with_inductor_equals_eager() -> None:
    """The real compiler: losses within 1e-4 of eager, the Module itself trained, compile time logged once.

    Inductor caches compiled kernels process-wide (and sets an environment variable to load them), so
    the compiled fit runs in a child process that takes its state with it.
    """
    proc = run_command([sys.executable, __file__], cwd=Path(__file__).parent, env={"OMP_NUM_THREADS": "1"}, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["same_module"] and result["forward_compiled"]
    assert result["graphs"] >= 1  # something was really compiled
    assert len(result["reports"]) == 1 and "took" in result["reports"][0], result["reports"]
    eager = _eager_losses()
    assert len(result["losses"]) == len(eager) == 12
    assert max(abs(a - b) for a, b in zip(result["losses"], eager, strict=True)) < 1e-4
    assert eager[-1] < eager[0]


def test_options_are_kept_and_reapplied_after_wrapping() -> None:
    """The context carries the backend given to torch.compile; a second fit compiles afresh."""
    calls: list[int] = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        calls.append(len(graph.graph.nodes))
        return graph.forward

    import torch._dynamo

    torch._dynamo.reset()
    model = Tiny()
    compiled = torch.compile(model, backend=counting_backend)
    assert from_compiled(compiled) is model and from_compiled(model) is model
    Trainer(**quiet(max_epochs=1)).fit(compiled, loader(n=8))
    assert calls, "the user's backend was not used"
    assert model.losses == pytest.approx(_eager_losses(8, 1), abs=1e-6)
    before = len(calls)
    torch._dynamo.reset()
    Trainer(**quiet(max_epochs=1)).fit(compiled, loader(n=8))
    assert len(calls) > before


def test_a_failing_compile_is_one_clear_error() -> None:
    """A backend that fails: MisconfigurationError naming the strategy and the fixes; nothing trained."""

    def broken_backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        msg = "this backend cannot compile anything"
        raise RuntimeError(msg)

    import torch._dynamo

    torch._dynamo.reset()
    model = Tiny()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(**quiet(max_epochs=1))
    with pytest.raises(MisconfigurationError, match=r"strategy='single_device'.*Fix: train the eager Module") as error:
        trainer.fit(torch.compile(model, backend=broken_backend), loader(n=8))
    assert "this backend cannot compile anything" in str(error.value)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_an_uncompiled_module_is_left_alone() -> None:
    model = Tiny()
    Trainer(**quiet(max_epochs=1)).fit(model, loader(n=8))
    assert compile_context(model) is None and "forward" not in vars(model)


if __name__ == "__main__":
    print(json.dumps(_inductor_run()))
