"""The logger conformance kit: what rank 0 receives, nothing written off rank 0, the log through resume.

```python
from phalanx.testing import LoggerConformance

class TestMyLogger(LoggerConformance):
    logger = "my_tracker"          # the registered name, or the class / a factory (gets save_dir=...)

    @classmethod
    def read_metrics(cls, save_dir):  # what the logger wrote, read back from its files
        return {"train_loss": {0: 1.25, 1: 1.19, ...}}
```

The logger runs in a real 2-rank job (gloo, a generated script in a fresh process; see
:mod:`phalanx.testing.kits._rank_script`): an uninterrupted fit that checkpoints mid-epoch, and a
new Trainer with a fresh logger resuming from that checkpoint. The Module logs ``train_loss``
every step (``log_every_n_steps=1``) and ``val_loss`` at validation.

- **registered**: a registered name is available, described and builds a ``Logger``.
- **rank 0 logs every step**: on rank 0 ``log_metrics`` received ``train_loss`` for every step
  with the value the Module computed, and ``finalize("success")`` was called.
- **nothing written off rank 0**: no rank other than 0 opened a file for writing, created a
  folder or renamed a file under the run's folder (unless ``writes_on_every_rank``). The Trainer
  calls the logger's methods on rank 0 only, but user code reads ``logger.log_dir`` and reaches
  ``logger.experiment`` on every rank (the kit's Module does both in ``on_train_start``): those
  must not create anything elsewhere (``phalanx.loggers.rank_zero_experiment``).
- **written and resumed** (needs :meth:`LoggerConformance.read_metrics`): the files of the
  uninterrupted fit hold every step's ``train_loss`` with the Module's value (a logger that
  leaves rows in a buffer at ``finalize`` loses them); those of the resumed fit hold exactly the
  steps after the checkpoint, with the uninterrupted values. A logger that counts steps itself
  instead of using ``step`` starts again at 0 there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from phalanx.testing.kits._common import build
from phalanx.testing.kits._runs import RankRunKit, Runs

__all__ = ["LoggerConformance"]


class LoggerConformance(RankRunKit):
    """Subclass with ``logger`` set (registered name, class or factory); pytest runs the checks."""

    _kind: ClassVar[str] = "logger"
    logger: ClassVar[Any] = ""
    #: Keyword arguments for the factory besides ``save_dir`` (or overrides of the registered ones).
    logger_params: ClassVar[dict[str, Any]] = {}
    atol: ClassVar[float] = 1e-6
    check_written: ClassVar[bool] = True

    _RESUME_CHECKS: ClassVar[frozenset[str]] = frozenset({"test_written_metrics_survive_resume"})
    _OPT_OUTS: ClassVar[dict[str, str]] = {"test_written_metrics_survive_resume": "check_written"}

    @classmethod
    def _plugin_value(cls) -> Any:
        return cls.logger

    @classmethod
    def _plugin_params(cls) -> dict[str, Any]:
        return cls.logger_params

    @classmethod
    def read_metrics(cls, save_dir: Path) -> dict[str, dict[int, float]]:
        """What the logger wrote under ``save_dir``: metric name -> {step: value}.

        Override it for the logger's format; without it set ``check_written = False``.
        """
        msg = f"{cls.__name__}.read_metrics is not implemented: read the logger's files, or set check_written = False"
        raise NotImplementedError(msg)

    def test_registered_and_described(self, tmp_path: Path) -> None:
        from phalanx.loggers import Logger
        from phalanx.registry import LoggerRegistry

        assert self.logger, "set the class attribute `logger` to the registered name, the class or a factory"
        if isinstance(self.logger, str):
            entry = LoggerRegistry.entry(self.logger)
            assert entry.unavailable_reason() is None, entry.unavailable_reason()
            assert entry.description, f"{self.logger!r} has no description; pass one to registry.register"
        plugin = build(self.logger, LoggerRegistry, {"save_dir": str(tmp_path), **self.logger_params}, what="logger")
        assert isinstance(plugin, Logger), f"{plugin!r} is not a phalanx Logger"

    def test_rank_zero_logs_every_step(self, runs: Runs) -> None:
        self._check_ran(runs)
        record = runs.record("full", 0)
        logged = {
            step: metrics["train_loss"]
            for name, metrics, step in record["calls"]
            if name == "log_metrics" and "train_loss" in metrics
        }
        computed = dict(record["losses"])
        assert sorted(logged) == sorted(computed), (
            f"rank 0's log_metrics got train_loss at steps {sorted(logged)}, expected {sorted(computed)}"
        )
        worst = max(abs(logged[s] - computed[s]) for s in computed)
        assert worst <= self.atol, f"logged train_loss differs from the Module's by up to {worst:.3g}"
        statuses = [args[0] for name, args, _ in record["calls"] if name == "finalize" and args]
        assert "success" in statuses, f"finalize('success') was not called on rank 0 (finalize calls: {statuses})"

    def test_nothing_written_off_rank_zero(self, runs: Runs) -> None:
        self._check_no_writes_off_rank_zero(runs)
        assert runs.writes.get(0), "rank 0 wrote no file under the run's folder: the logger writes nothing"

    def test_written_metrics_survive_resume(self, runs: Runs) -> None:
        self._check_ran(runs)
        full = self.read_metrics(runs.out / "full" / "logs").get("train_loss", {})
        resumed = self.read_metrics(runs.out / "resumed" / "logs").get("train_loss", {})
        computed = dict(runs.record("full", 0)["losses"])
        assert sorted(full) == sorted(computed), (
            f"the uninterrupted fit's files hold train_loss at steps {sorted(full)}, expected {sorted(computed)}"
        )
        worst = max(abs(full[s] - computed[s]) for s in computed)
        assert worst <= self.atol, (
            f"the written train_loss differs from the Module's by up to {worst:.3g} (atol={self.atol:g})"
        )
        after = [step for step in sorted(computed) if step >= self.resume_at]
        assert sorted(resumed) == after, (
            f"the resumed fit's files hold train_loss at steps {sorted(resumed)}, expected {after}"
        )
        worst = max(abs(resumed[s] - full[s]) for s in after)
        assert worst <= self.atol, (
            f"after resume the written train_loss differs from the uninterrupted run's by {worst:.3g}"
        )
