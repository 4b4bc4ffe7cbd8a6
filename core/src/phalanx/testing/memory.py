"""The conformance kit's memory check: a strategy's estimate against what its ranks really hold.

```python
from phalanx.testing import StrategyConformance
from phalanx.testing.memory import MemoryConformance

class TestMyStrategy(StrategyConformance, MemoryConformance):
    strategy = "my_strategy"
    devices = 2
```

For a strategy whose plugin answers ``phalanx_estimate_memory``, one run of
:mod:`phalanx.testing.memory_probe` trains its model (three linear layers, ``memory_width`` wide,
AdamW, two steps) on ``devices`` CPU ranks, and each rank counts the bytes of every live tensor
storage after the step and measures the second step's peak with torch's ``MemTracker``. Per rank,
within ``memory_tolerance`` (10 %):

- the parameter bytes at rest equal the estimate's ``parameters``;
- the estimate's ``total`` equals the measured peak: nothing the library allocates is forgotten
  (buckets, gathered units, the optimizer step's temporaries: ``other``, ``transient``, ``step``)
  and nothing is over-counted. The estimate is asked for CPU ranks (``device_type="cpu"``), where
  torch's optimizers step one tensor at a time.

A strategy that gives no estimate passes (it is shown as "no estimate", never guessed); a
strategy that keeps its state off the device (offloading) sets ``check_memory = False``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from phalanx.memory import MemoryEstimate, MemoryRequest
from phalanx.model_shapes import build_on_meta, summarize_model
from phalanx.planning import estimate_memory
from phalanx.testing.processes import Job

__all__ = ["MemoryConformance", "measure", "planned"]


def planned(strategy: str, *, width: int | str, devices: int) -> MemoryEstimate | None:
    """The installed plugins' estimate for the probe's model under ``strategy`` (AdamW, CPU; float32
    unless the spec asks for float8).

    ``width`` and ``strategy`` are the probe's specs (``"b256"``, ``"fsdp+ac"``, ``"fsdp+f8"``).
    """
    from phalanx.registry import StrategyRegistry
    from phalanx.testing.memory_probe import build, input_shape, spec_precision, strategy_params

    name, overrides = strategy_params(strategy)
    entry = StrategyRegistry.entry(name)
    summary = summarize_model(build_on_meta(lambda: build(width)), input_shape=input_shape(width))
    params = {**entry.init_params, **overrides}
    request = MemoryRequest(
        name, entry.target_path, params, summary, devices=devices, precision=spec_precision(strategy), device_type="cpu"
    )
    return estimate_memory(request)


def measure(
    out: Path, strategies: list[str], widths: list[int | str], *, timeout: float = 300.0
) -> dict[str, list[dict[str, int]]]:
    """Run the probe once for every (width, strategy); ``"name-width"`` -> one record per rank."""
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    command = [sys.executable, "-m", "phalanx.testing.memory_probe", str(out), ",".join(map(str, widths)), *strategies]
    job = Job(command, out, env=env, name="memory_probe", warm=True)
    code = job.wait(timeout)
    if code != 0:
        msg = f"the memory probe exited with {code}:\n{job.output()}"
        raise AssertionError(msg)
    found: dict[str, list[dict[str, int]]] = {}
    for path in sorted(out.glob("*-rank*.json")):
        key = path.name.rsplit("-rank", 1)[0]
        found.setdefault(key, []).append(json.loads(path.read_text()))
    return found


class MemoryConformance:
    """Mixin for a conformance class: the strategy's estimate holds to the measured per-rank bytes."""

    strategy: ClassVar[str] = ""
    devices: ClassVar[int] = 2
    check_memory: ClassVar[bool] = True
    #: The name measured, when not :attr:`strategy`: the probe records what each rank holds from the
    #: ranks' own processes, so a spawn/fork name (whose workers end before the record is written)
    #: names its script-launched twin, e.g. ``"ddp"`` for ``"ddp_fork"``.
    memory_strategy: ClassVar[str] = ""
    memory_width: ClassVar[int] = 512
    memory_tolerance: ClassVar[float] = 0.10
    memory_timeout: ClassVar[float] = 300.0

    @pytest.mark.timeout(400)
    def test_memory_estimate_matches_measured(self, tmp_path: Path) -> None:
        if not self.check_memory:
            pytest.skip(f"{type(self).__name__}.check_memory is False")
        name = self.memory_strategy or self.strategy
        estimate = planned(name, width=self.memory_width, devices=self.devices)
        if estimate is None:
            return  # no estimate: listed as such, never guessed
        ranks = measure(tmp_path, [name], [self.memory_width], timeout=self.memory_timeout)
        records = ranks[f"{name}-{self.memory_width}"]
        assert len(records) == self.devices, records
        tol = self.memory_tolerance
        for rank, got in enumerate(records):
            where = f"{name} rank {rank}: estimate {estimate} vs measured {got}"
            assert abs(estimate.parameters - got["parameters"]) <= tol * got["parameters"], where
            peak = got["tracked_peak"]
            variants = self.memory_peak_variants(estimate)
            if variants and any(abs(v - peak) <= tol * peak for v in variants):
                continue  # the peak of a documented variant path of the strategy (see memory_peak_variants)
            if variants and estimate.total <= peak <= max(variants):
                continue
            assert estimate.total >= (1 - tol) * peak, f"estimate total below the measured peak; {where}"
            assert estimate.total <= (1 + tol) * peak, f"estimate total above the measured peak; {where}"

    def memory_peak_variants(self, estimate: MemoryEstimate) -> list[int]:
        """Other peaks a step of this strategy really reaches, beside ``estimate.total`` (none by default).

        Override it when the measured peak varies between runs for a reason the strategy documents
        (a buffer a library's worker thread sometimes frees late): the check then accepts a peak
        within the tolerance of the estimate or of one of these, or between the two.
        """
        return []
