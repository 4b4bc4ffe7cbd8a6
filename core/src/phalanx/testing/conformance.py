"""The strategy conformance kit: one class a plugin author subclasses in their own test suite.

```python
from phalanx.testing import StrategyConformance

class TestMyStrategy(StrategyConformance):
    strategy = "my_strategy"   # the registered name
    devices = 2
```

pytest then runs every ``test_*`` method below against the installed plugin. What a strategy
owes its users, and so what the kit checks:

- **registered**: the name is registered, available and described, and names a Strategy.
- **components**: after the Trainer configures it, accelerator, precision, checkpoint IO (and, for
  a ParallelStrategy, the cluster environment) are set, and ``devices`` gives that world size.
- **fit**: the final weights and rank 0's losses equal plain PyTorch SGD with momentum on the
  union of the ranks' batches (DistributedSampler order) within ``atol``.
- **start methods** (``check_start_methods``): for each of "popen", "spawn" and "fork", a method
  in the class's ``supported_start_methods`` trains to the same weights; any other is refused at
  construction with an error naming it and the supported ones.
- **resume** (``check_resume``): fit to ``resume_at`` steps (mid-epoch) with a ModelCheckpoint
  saving in the training processes, resume in a new Trainer from a model with other weights, and
  get the losses and weights of the uninterrupted run (within ``resume_atol``; bit-identical by
  default) and of plain PyTorch (within ``atol``). Momentum makes a lost optimizer state show.
- **evaluation** (``check_evaluation``): after fit, ``validate`` / ``test`` give the losses of the
  fitted weights over the whole sets, and ``predict`` covers every sample with plain PyTorch's
  output, on every rank's shard.
- **failure** (``check_failure``): the last rank raising at step 2 makes the job exit non-zero
  within ``failure_exit_seconds`` of the raise, with the error in its output.
- **nothing left behind**, after every run: no process carrying the run's marker environment
  variable or in its session is alive (re-parented grandchildren included; see
  :mod:`phalanx.testing.processes`), and the test process's environment is unchanged.

``strategy_params`` builds the strategy as ``StrategyRegistry.get(strategy, **strategy_params)``
to check a configuration other than the registered one.

Each run is a fresh Python process started from a generated script (strategies such as ddp
re-execute the script, so it must not be the pytest process), with a timeout that kills
everything it started. Runs are tiny (a 6-8-3 MLP, 48 samples, 8 steps) so a suite stays cheap.
A strategy that legitimately cannot do one of the optional checks sets the flag named above to
False (single_device has no start methods); the pytest plugin then deselects that test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from phalanx.testing._reference import reference_evaluation, reference_run
from phalanx.testing._script import EVAL_SAMPLES, render_script
from phalanx.testing.kits._common import ConformanceKit
from phalanx.testing.processes import ScriptResult, run_command, run_script

__all__ = ["START_METHODS_CHECKED", "ScriptResult", "StrategyConformance", "reference_run", "run_command", "run_script"]

#: The start methods the kit tries on every ParallelStrategy (forkserver behaves as spawn here).
START_METHODS_CHECKED = ("popen", "spawn", "fork")
def _max_diff(a: Any, b: Any) -> float:
    return float((a.detach().cpu().double() - b.detach().cpu().double()).abs().max())


def _losses(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.phalanx_conformance
class StrategyConformance(ConformanceKit):
    """Subclass with ``strategy`` (registered name) and ``devices`` set; pytest collects the tests."""

    strategy: ClassVar[str] = ""
    devices: ClassVar[int] = 1
    accelerator: ClassVar[str] = "cpu"
    #: Init-param overrides: the runs build ``StrategyRegistry.get(strategy, **strategy_params)``
    #: (values must be Python literals); empty passes the name, as a user writes it.
    strategy_params: ClassVar[dict[str, Any]] = {}
    steps: ClassVar[int] = 8
    #: Where the resume check's first fit stops: mid-epoch, so the data position is restored too.
    resume_at: ClassVar[int] = 3
    #: Absolute tolerance on weights and losses against the plain PyTorch reference.
    atol: ClassVar[float] = 1e-5
    #: Absolute tolerance of the resumed run's weights against the uninterrupted run's.
    resume_atol: ClassVar[float] = 0.0
    #: A failing rank must end the whole job within this many seconds of raising.
    failure_exit_seconds: ClassVar[float] = 5.0
    timeout: ClassVar[float] = 240.0
    check_start_methods: ClassVar[bool] = True
    check_resume: ClassVar[bool] = True
    check_evaluation: ClassVar[bool] = True
    check_failure: ClassVar[bool] = True

    #: test name -> the class attribute that opts out of it.
    _OPT_OUTS: ClassVar[dict[str, str]] = {
        "test_start_method": "check_start_methods",
        "test_resume_matches_uninterrupted": "check_resume",
        "test_validate_test_predict_after_fit": "check_evaluation",
        "test_failing_rank_stops_the_job": "check_failure",
    }

    # ------------------------------------------------------------------ runs
    @classmethod
    def _run(cls, out: Path, *, params: dict[str, Any] | None = None, **options: Any) -> ScriptResult:
        out.mkdir(parents=True, exist_ok=True)
        script = render_script(
            out / "conformance_run.py",
            out=out,
            strategy=cls.strategy,
            params=cls.strategy_params if params is None else params,
            accelerator=cls.accelerator,
            devices=cls.devices,
            steps=cls.steps,
            resume_at=cls.resume_at,
            **options,
        )
        result = run_script(script, timeout=cls.timeout)
        result.check_leftovers()
        return result

    @pytest.fixture(scope="class")
    @classmethod
    def fitted(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """One fit (then validate / test / predict when checked), shared by the tests that read it."""
        out = tmp_path_factory.mktemp("fit")
        cls._run(out, evaluate=cls.check_evaluation).check()
        return out

    def _strategy_argument(self) -> Any:
        if not self.strategy_params:
            return self.strategy
        from phalanx.registry import StrategyRegistry

        return StrategyRegistry.get(self.strategy, **self.strategy_params)

    def _configured_trainer(self) -> Any:
        """``Trainer(strategy=..., accelerator=..., devices=...)``: the strategy as the Trainer configures it."""
        from phalanx import Trainer

        return Trainer(
            strategy=self._strategy_argument(),
            accelerator=self.accelerator,
            devices=self.devices,
            logger=False,
            enable_progress_bar=False,
        )

    def _check_fit(self, out: Path, losses_file: str = "losses.txt", first_step: int = 0) -> dict[str, Any]:
        """Compare a finished run's weights and rank 0's losses with plain PyTorch; return its state."""
        import torch

        result = json.loads((out / "result.json").read_text())
        assert result["world_size"] == self.devices, (
            f"devices={self.devices} trained with world_size={result['world_size']}"
        )
        expected_state, expected_losses = reference_run(result["world_size"], self.steps)
        losses = _losses(out / losses_file)
        expected_losses = expected_losses[first_step:]
        assert len(losses) == len(expected_losses), (
            f"rank 0 logged {len(losses)} training steps, expected {len(expected_losses)}"
        )
        worst = max(abs(a - b) for a, b in zip(losses, expected_losses))
        assert worst <= self.atol, (
            f"losses differ from plain PyTorch by up to {worst:.3g} (atol={self.atol:g}):\n{losses}\n{expected_losses}"
        )
        state = torch.load(out / "portable.ckpt", weights_only=True)["state_dict"]
        for name, value in expected_state.items():
            diff = _max_diff(state[name], value)
            assert diff <= self.atol, f"{name} differs from plain PyTorch by {diff:.3g} (atol={self.atol:g})"
        return dict(state)

    # ------------------------------------------------------------------ checks
    def test_registered_and_available(self) -> None:
        from phalanx.registry import StrategyRegistry
        from phalanx.strategies import Strategy

        assert self.strategy, "set the class attribute `strategy` to the registered name"
        entry = StrategyRegistry.entry(self.strategy)
        assert entry.unavailable_reason() is None, entry.unavailable_reason()
        assert entry.description, f"{self.strategy!r} has no description; pass one to registry.register"
        assert issubclass(StrategyRegistry.get_class(self.strategy), Strategy)

    def test_components_are_filled_in(self) -> None:
        from phalanx.accelerators import Accelerator
        from phalanx.checkpoint_io import CheckpointIO
        from phalanx.environments import ClusterEnvironment
        from phalanx.precision import Precision
        from phalanx.registry import AcceleratorRegistry
        from phalanx.strategies import ParallelStrategy

        trainer = self._configured_trainer()
        strategy = trainer.strategy
        parts = {"accelerator": Accelerator, "precision_plugin": Precision, "checkpoint_io": CheckpointIO}
        if isinstance(strategy, ParallelStrategy):
            parts["cluster_environment"] = ClusterEnvironment
        for part, kind in parts.items():
            value = getattr(strategy, part)
            assert isinstance(value, kind), (
                f"{type(strategy).__name__}.{part} is {value!r} after Trainer connected it, not a {kind.__name__}"
            )
        expected = AcceleratorRegistry.get_class(self.accelerator)
        assert isinstance(strategy.accelerator, expected), (
            f"accelerator={self.accelerator!r} gave {strategy.accelerator!r}"
        )
        assert trainer.world_size == self.devices, f"devices={self.devices} gave world_size={trainer.world_size}"

    def test_declared_capabilities_hold(self) -> None:
        """What the strategy declares in ``phalanx.strategies.capabilities.CAPABILITIES`` is well
        formed and, where it can be seen without training, true: the start methods are ones the
        launchers know, the preloaded modules import, and ``empty_init_on_meta`` is what
        ``tensor_init_context(empty_init=True)`` really does."""
        import importlib.util

        import torch

        from phalanx.strategies.capabilities import capabilities
        from phalanx.strategies.parallel import START_METHODS

        strategy = self._configured_trainer().strategy
        declared = capabilities(strategy)
        name = type(strategy).__name__
        for flag, value in declared.items():
            if flag in ("supported_start_methods", "launcher_preload"):
                assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), (
                    f"{name}.{flag} = {value!r} must be a tuple of strings"
                )
            else:
                assert isinstance(value, bool), f"{name}.{flag} = {value!r} must be a bool"
        methods = declared.get("supported_start_methods", ("popen",))
        assert methods and set(methods) <= set(START_METHODS), (
            f"{name}.supported_start_methods = {methods!r}: choose among {START_METHODS}"
        )
        for module in declared.get("launcher_preload", ()):
            assert importlib.util.find_spec(module) is not None, f"{name}.launcher_preload names {module!r}, not importable"
        with strategy.tensor_init_context(empty_init=True):
            layer = torch.nn.Linear(2, 2)
        assert layer.weight.is_meta == declared["empty_init_on_meta"], (
            f"{name}.empty_init_on_meta is {declared['empty_init_on_meta']} but tensor_init_context(empty_init=True) "
            f"built a parameter on {layer.weight.device}"
        )

    def test_fit_matches_plain_pytorch(self, fitted: Path) -> None:
        self._check_fit(fitted)

    @pytest.mark.parametrize("start_method", START_METHODS_CHECKED)
    def test_start_method(self, start_method: str, fitted: Path, tmp_path: Path) -> None:
        from phalanx.registry import StrategyRegistry

        cls = StrategyRegistry.get_class(self.strategy)
        supported = getattr(cls, "supported_start_methods", None)
        assert supported is not None, (
            f"{cls.__name__} has no supported_start_methods (not a ParallelStrategy); set "
            f"check_start_methods = False in {type(self).__name__}"
        )
        params = {**self.strategy_params, "start_method": start_method}
        if start_method not in supported:
            with pytest.raises(Exception) as refused:
                StrategyRegistry.get(self.strategy, **params)
            text = str(refused.value)
            assert start_method in text and all(m in text for m in supported), (
                f"{cls.__name__}(start_method={start_method!r}) must be refused naming it and the supported "
                f"{supported}; got: {text!r}"
            )
            return
        if json.loads((fitted / "result.json").read_text())["start_method"] == start_method:
            self._check_fit(fitted)  # the registered strategy uses this method: that run covers it
            return
        self._run(tmp_path, params=params).check()
        self._check_fit(tmp_path)

    def test_resume_matches_uninterrupted(self, fitted: Path, tmp_path: Path) -> None:
        import torch

        self._run(tmp_path, mode="resume").check()
        _, expected_losses = reference_run(self.devices, self.steps)
        before = _losses(tmp_path / "losses_before.txt")
        assert len(before) == self.resume_at, f"the first fit ran {len(before)} steps, expected {self.resume_at}"
        assert max(abs(a - b) for a, b in zip(before, expected_losses)) <= self.atol
        resumed = self._check_fit(tmp_path, "losses_after.txt", first_step=self.resume_at)
        uninterrupted = torch.load(fitted / "portable.ckpt", weights_only=True)["state_dict"]
        for name, value in uninterrupted.items():
            diff = _max_diff(resumed[name], value)
            assert diff <= self.resume_atol, (
                f"resumed {name} differs from the uninterrupted run by {diff:.3g} (resume_atol={self.resume_atol:g})"
            )

    def test_validate_test_predict_after_fit(self, fitted: Path) -> None:
        import torch

        result = json.loads((fitted / "result.json").read_text())
        state = torch.load(fitted / "portable.ckpt", weights_only=True)["state_dict"]
        expected = reference_evaluation(state)
        for stage, key in (("validate", "val_loss"), ("test", "test_loss")):
            metrics = result[stage]
            assert isinstance(metrics, list) and metrics and key in metrics[0], (
                f"trainer.{stage} returned {metrics!r}, expected [{{{key!r}: ...}}]"
            )
            diff = abs(metrics[0][key] - expected[key])
            assert diff <= self.atol, f"trainer.{stage}: {key}={metrics[0][key]!r}, plain PyTorch {expected[key]!r}"
        assert result["predicted_batches"], f"trainer.predict returned no predictions ({result['predicted_batches']!r})"
        seen: dict[int, Any] = {}
        for path in sorted((fitted / "predictions").glob("*.pt")):
            saved = torch.load(path, weights_only=True)
            for index, row in zip(saved["index"].tolist(), saved["out"]):
                seen[index] = row
        assert sorted(seen) == list(range(EVAL_SAMPLES)), (
            f"predict_step saw samples {sorted(seen)}, expected all {EVAL_SAMPLES}"
        )
        worst = max(_max_diff(seen[i], expected["predictions"][i]) for i in seen)
        assert worst <= self.atol, f"predictions differ from plain PyTorch by up to {worst:.3g} (atol={self.atol:g})"

    @pytest.mark.timing  # holds failure_exit_seconds: runs with the machine to itself under xdist
    def test_failing_rank_stops_the_job(self, tmp_path: Path) -> None:
        result = self._run(tmp_path, fail_at=2)
        assert result.returncode != 0, "a rank raised but the job exited 0"
        assert "deliberate failure on the last rank" in result.stdout + result.stderr, (
            f"the error is not reported:\n{result.output()}"
        )
        assert not (tmp_path / "result.json").exists()
        raised = float((tmp_path / "failed_at.txt").read_text())
        assert result.ended is not None
        took = result.ended - raised
        assert took <= self.failure_exit_seconds, (
            f"the job exited {took:.1f}s after a rank raised (limit {self.failure_exit_seconds:g}s): the other ranks "
            f"must not wait for a collective timeout; the launcher should stop them\n{result.output()}"
        )
