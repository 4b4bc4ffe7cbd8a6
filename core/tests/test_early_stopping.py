"""EarlyStopping on real fits: the Module logs a scripted value per epoch, so every stop is predictable.

The two-process test runs this file as a script (``python test_early_stopping.py CASE OUT``) under
the core's own ParallelStrategy (no strategy package needed): each rank logs a different sequence
and both ranks must stop at the same epoch and exit.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.callbacks import EarlyStopping
from phalanx.callbacks.callback import Callback
from phalanx.callbacks.early_stopping import EarlyStoppingReason
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer

NAN = math.nan


class Scripted(Module):
    """Logs ``values[epoch]`` (the last one once the script runs out) as ``name``.

    ``where="validation"`` logs in ``validation_step`` (epoch mean of one repeated value: the value
    itself); ``where="train"`` logs in ``training_step`` with ``on_epoch=True``. A sanity check
    logs ``sanity_value`` instead, so a callback that wrongly counts it is caught.
    """

    def __init__(
        self, values: Sequence[float], *, name: str = "score", where: str = "validation", sanity_value: float = 0.0
    ) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 1)
        self.values = list(values)
        self.name = name
        self.where = where
        self.sanity_value = sanity_value
        self.validated_epochs: list[int] = []

    def value(self) -> float:
        return self.values[min(self.current_epoch, len(self.values) - 1)]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.where == "train":
            self.log(self.name, self.value(), on_step=False, on_epoch=True)
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.trainer.sanity_checking:
            self.log(self.name, self.sanity_value)
            return
        if batch_idx == 0:
            self.validated_epochs.append(self.current_epoch)
        if self.where == "validation":
            self.log(self.name, self.value())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(
    tmp_path: Path, model: Scripted, *callbacks: Callback, val: bool = True, ckpt_path: Any = None, **kwargs: Any
) -> Trainer:
    kwargs.setdefault("max_epochs", 20)
    kwargs.setdefault("enable_model_summary", False)
    kwargs.setdefault("enable_checkpointing", any(isinstance(c, ModelCheckpoint) for c in callbacks))
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=list(callbacks), **quiet(**kwargs))
    trainer.fit(model, loader(n=8), loader(n=4) if val else None, ckpt_path=ckpt_path)
    return trainer


# ------------------------------------------------------------------ patience and the improvement test
def test_stops_after_patience_checks_without_improvement(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=3)
    trainer = _fit(tmp_path, Scripted([5, 4, 4, 4.5, 4, 4, 4]), es)
    # epoch 0: 5 (best), 1: 4 (best), 2, 3, 4: no improvement -> the third of them stops fit
    assert (es.stopped_epoch, es.wait_count, trainer.current_epoch) == (4, 3, 5)
    assert es.best_score.item() == 4.0
    assert trainer.should_stop
    assert es.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    assert es.stopping_reason_message is not None and "did not improve in the last 3" in es.stopping_reason_message


def test_an_improvement_resets_the_count(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=2)
    trainer = _fit(tmp_path, Scripted([5, 6, 4, 6, 3, 7, 8, 9]), es)
    # the misses at epochs 1 and 3 would exhaust patience; the improvement at 2 resets the count (and
    # the one at 4 again), so the two misses in a row at 5 and 6 stop fit
    assert es.stopped_epoch == 6
    assert trainer.current_epoch == 7
    assert es.best_score.item() == 3.0


def test_never_stops_while_improving(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=1)
    trainer = _fit(tmp_path, Scripted([float(10 - e) for e in range(6)]), es, max_epochs=6)
    assert trainer.current_epoch == 6
    assert (es.stopped_epoch, es.wait_count) == (0, 0)
    assert es.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    assert es.stopping_reason_message is None


def test_patience_counts_validation_checks_not_epochs(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=2)
    model = Scripted([5.0] * 20)
    trainer = _fit(tmp_path, model, es, check_val_every_n_epoch=3)
    # validation at epochs 2, 5, 8: best at 2, misses at 5 and 8 -> stop after epoch 8
    assert model.validated_epochs == [2, 5, 8]
    assert es.stopped_epoch == 8
    assert trainer.current_epoch == 9


def test_min_delta_an_improvement_of_exactly_min_delta_does_not_count(tmp_path: Path) -> None:
    values = [10, 9, 8.5, 7.5, 8.0]
    es = EarlyStopping("score", min_delta=1.0, patience=2)
    trainer = _fit(tmp_path, Scripted(values), es)
    # 10 best; 9 (gain 1.0, not > 1) misses; 8.5 (gain 1.5) resets; 7.5 (gain 1.0) and 8.0 miss
    assert (es.stopped_epoch, trainer.current_epoch) == (4, 5)
    assert es.best_score.item() == 8.5
    plain = EarlyStopping("score", patience=2)  # every decrease counts: best 7.5, misses at 4 and 5
    _fit(tmp_path, Scripted(values), plain)
    assert (plain.stopped_epoch, plain.best_score.item()) == (5, 7.5)


def test_mode_max_treats_larger_as_better(tmp_path: Path) -> None:
    values = [1, 2, 3, 3, 3, 3]
    high = EarlyStopping("score", mode="max", patience=2)
    assert _fit(tmp_path, Scripted(values), high).current_epoch == 5  # misses at 3, 4
    assert high.best_score.item() == 3.0
    low = EarlyStopping("score", mode="min", patience=2)
    assert _fit(tmp_path, Scripted(values), low).current_epoch == 3  # misses at 1, 2
    assert low.best_score.item() == 1.0


def test_mode_max_min_delta(tmp_path: Path) -> None:
    es = EarlyStopping("score", mode="max", min_delta=0.5, patience=1)
    _fit(tmp_path, Scripted([1.0, 2.0, 2.25]), es)
    assert (es.stopped_epoch, es.best_score.item()) == (2, 2.0)


# ------------------------------------------------------------------ thresholds and non-finite values
def test_stopping_threshold_stops_at_once_when_beaten(tmp_path: Path) -> None:
    es = EarlyStopping("score", stopping_threshold=2.0, patience=100)
    trainer = _fit(tmp_path, Scripted([5, 4, 3, 2, 1.5, 1]), es)
    # 2.0 is not below 2.0 (strict); 1.5 is
    assert (es.stopped_epoch, trainer.current_epoch) == (4, 5)
    assert es.stopping_reason is EarlyStoppingReason.STOPPING_THRESHOLD
    assert "Stopping threshold reached" in (es.stopping_reason_message or "")


def test_stopping_threshold_in_max_mode(tmp_path: Path) -> None:
    es = EarlyStopping("score", mode="max", stopping_threshold=0.9, patience=100)
    _fit(tmp_path, Scripted([0.5, 0.75, 0.9375, 0.5]), es)
    assert es.stopped_epoch == 2


def test_divergence_threshold_stops_when_worse(tmp_path: Path) -> None:
    es = EarlyStopping("score", divergence_threshold=10.0, patience=100)
    trainer = _fit(tmp_path, Scripted([1, 2, 10, 50, 1]), es)
    assert (es.stopped_epoch, trainer.current_epoch) == (3, 4)  # 10 is not worse than 10; 50 is
    assert es.stopping_reason is EarlyStoppingReason.DIVERGENCE_THRESHOLD
    high = EarlyStopping("score", mode="max", divergence_threshold=0.0, patience=100)
    _fit(tmp_path, Scripted([1, 2, -1, 3]), high)
    assert high.stopped_epoch == 2


@pytest.mark.parametrize("bad", [NAN, math.inf])
def test_check_finite_stops_on_nan_or_inf(tmp_path: Path, bad: float) -> None:
    es = EarlyStopping("score", patience=100)
    trainer = _fit(tmp_path, Scripted([3, 2, bad, 1]), es)
    assert (es.stopped_epoch, trainer.current_epoch) == (2, 3)
    assert es.stopping_reason is EarlyStoppingReason.NON_FINITE_METRIC
    assert es.best_score.item() == 2.0
    assert "not finite" in (es.stopping_reason_message or "")


def test_check_finite_off_counts_nan_as_no_improvement(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=2, check_finite=False)
    trainer = _fit(tmp_path, Scripted([3, NAN, NAN, 1]), es)
    assert (es.stopped_epoch, trainer.current_epoch) == (2, 3)
    assert es.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    assert es.best_score.item() == 3.0


# ------------------------------------------------------------------ where and when checks run
def test_sanity_check_and_other_stages_are_not_checked(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=1)
    model = Scripted([1, 1, 1], sanity_value=NAN)  # a counted sanity check would stop at epoch 0
    trainer = _fit(tmp_path, model, es, max_epochs=1, num_sanity_val_steps=1)
    assert (trainer.current_epoch, es.wait_count, es.best_score.item()) == (1, 0, 1.0)
    trainer.validate(model, loader(n=4))  # outside fit: no check
    assert (es.wait_count, es.stopped_epoch) == (0, 0)


def test_fast_dev_run_disables_the_check(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=1)
    _fit(tmp_path, Scripted([NAN]), es, fast_dev_run=True)
    assert es.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    assert math.isinf(es.best_score.item()) and es.wait_count == 0


def test_without_validation_checks_at_train_epoch_end(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=2)
    trainer = _fit(tmp_path, Scripted([3, 3, 3, 3], where="train"), es, val=False)
    assert (es.stopped_epoch, trainer.current_epoch) == (2, 3)


def test_check_on_train_epoch_end_reads_training_metrics_with_validation_present(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=1, check_on_train_epoch_end=True)
    trainer = _fit(tmp_path, Scripted([3, 4], where="train"), es, check_val_every_n_epoch=5)
    assert (es.stopped_epoch, trainer.current_epoch) == (1, 2)


def test_check_after_validation_when_validation_runs_twice_per_epoch(tmp_path: Path) -> None:
    es = EarlyStopping("score", patience=2)
    model = Scripted([5.0])
    trainer = _fit(tmp_path, model, es, val_check_interval=1)  # 2 training batches: 2 validations per epoch
    # checks: epoch 0 twice (best, miss), epoch 1 first validation (miss) -> stop mid-epoch 1
    assert model.validated_epochs == [0, 0, 1] and es.stopped_epoch == 1
    assert trainer.global_step == 3


def test_min_epochs_holds_off_the_stop(tmp_path: Path) -> None:
    values = [1, 2, 2, 2, 2, 2, 2, 2]
    quick = EarlyStopping("score", patience=1)
    assert _fit(tmp_path, Scripted(values), quick).current_epoch == 2
    held = EarlyStopping("score", patience=1)
    trainer = _fit(tmp_path, Scripted(values), held, min_epochs=5)
    assert trainer.current_epoch == 5
    assert held.stopped_epoch == 4  # asked at every check from epoch 1 on; honoured once min_epochs ran


# ------------------------------------------------------------------ the metric must exist
def test_strict_missing_metric_raises_naming_metric_and_fix(tmp_path: Path) -> None:
    es = EarlyStopping("val_acc")
    with pytest.raises(MisconfigurationError) as info:
        _fit(tmp_path, Scripted([1.0]), es)
    message = str(info.value)
    assert "'val_acc'" in message and "['score']" in message and "strict=False" in message
    assert isinstance(info.value, RuntimeError)  # what Lightning raises, so ported handlers still catch it


def test_non_strict_missing_metric_skips_and_warns_when_verbose(tmp_path: Path) -> None:
    es = EarlyStopping("val_acc", strict=False, patience=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, Scripted([1.0]), es, max_epochs=3)
    assert trainer.current_epoch == 3 and es.wait_count == 0
    assert not [w for w in caught if "val_acc" in str(w.message)]
    loud = EarlyStopping("val_acc", strict=False, verbose=True)
    with pytest.warns(RuntimeWarning, match="val_acc"):
        _fit(tmp_path, Scripted([1.0]), loud, max_epochs=1)


# ------------------------------------------------------------------ configuration
def test_invalid_mode_names_value_choices_and_fix() -> None:
    with pytest.raises(MisconfigurationError, match=r"mode='auto'.*'min', 'max', got auto.*mode='min'"):
        EarlyStopping("score", mode="auto")
    with pytest.raises(MisconfigurationError, match="monitor=None"):
        EarlyStopping(None)  # type: ignore[arg-type]


def test_state_key_separates_monitor_and_mode() -> None:
    keys = {EarlyStopping(m, mode=mode).state_key for m in ("a", "b") for mode in ("min", "max")}
    assert len(keys) == 4
    assert EarlyStopping("a", patience=1).state_key == EarlyStopping("a", patience=9).state_key


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_verbose_logs_improvements_and_the_reason(tmp_path: Path) -> None:
    logger, records = logging.getLogger("phalanx.callbacks.early_stopping"), _Records()
    logger.addHandler(records)
    try:
        _fit(tmp_path, Scripted([3, 2, 2]), EarlyStopping("score", patience=1, verbose=True))
        _fit(tmp_path, Scripted([3, 2, 2]), EarlyStopping("score", patience=1))  # not verbose: silent
    finally:
        logger.removeHandler(records)
    lines = records.lines
    assert lines[0] == "Metric score improved. New best score: 3.000"
    assert lines[1] == "Metric score improved by 1.000 >= min_delta = 0.0. New best score: 2.000"
    assert "did not improve in the last 1 checks" in lines[2] and len(lines) == 3


# ------------------------------------------------------------------ resume
def test_state_survives_a_checkpoint_resume(tmp_path: Path) -> None:
    values = [5, 4, 4, 4, 4, 4, 4, 4, 4, 4]
    whole = EarlyStopping("score", patience=3)
    assert _fit(tmp_path / "whole", Scripted(values), whole).current_epoch == 5

    ckpt = ModelCheckpoint(tmp_path / "ckpt", save_last=True, save_top_k=0)
    first = EarlyStopping("score", patience=3)
    _fit(tmp_path, Scripted(values), ckpt, first, max_epochs=3)  # ModelCheckpoint listed first: still saved after
    assert first.wait_count == 1
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["callbacks"][first.state_key]
    assert saved["wait_count"] == 1 and saved["best_score"].item() == 4.0 and saved["patience"] == 3

    resumed = EarlyStopping("score", patience=3)
    trainer = _fit(tmp_path, Scripted(values), resumed, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    # a fresh count would see 4 as an improvement at epoch 3 and stop at epoch 6 instead
    assert (trainer.current_epoch, resumed.stopped_epoch) == (5, whole.stopped_epoch) == (5, 4)
    assert resumed.best_score.item() == 4.0


def test_state_dict_round_trip() -> None:
    es = EarlyStopping("score", mode="max", patience=4)
    es.wait_count, es.stopped_epoch, es.best_score = 2, 7, torch.tensor(0.75)
    es.stopping_reason, es.stopping_reason_message = EarlyStoppingReason.STOPPING_THRESHOLD, "why"
    other = EarlyStopping("score", mode="max", patience=1)
    other.load_state_dict(es.state_dict())
    assert other.state_dict() | {"best_score": 0} == es.state_dict() | {"best_score": 0}
    assert other.best_score.item() == 0.75 and other.patience == 4
    assert other.stopping_reason is EarlyStoppingReason.STOPPING_THRESHOLD


# ------------------------------------------------------------------ ranks agree
@pytest.mark.timeout(150)
def test_ranks_with_different_metrics_stop_together(tmp_path: Path) -> None:
    ranks = _run_ranks(tmp_path, "diverging")
    # rank 0 improves every epoch; rank 1 is flat and runs out of patience after epoch 2
    assert [r["wait_count"] for r in ranks] == [0, 2]
    for r in ranks:
        assert (r["current_epoch"], r["stopped_epoch"], r["global_step"]) == (3, 2, ranks[0]["global_step"])
        assert r["reason"] == "PATIENCE_EXHAUSTED" and r["message"].startswith("[rank: 1] ")


@pytest.mark.timeout(150)
def test_a_metric_missing_on_one_rank_skips_the_check_on_every_rank(tmp_path: Path) -> None:
    ranks = _run_ranks(tmp_path, "lenient")
    # rank 0 alone would stop after epoch 1 (flat metric, patience 1); it must skip like rank 1
    assert [(r["current_epoch"], r["stopped_epoch"], r["wait_count"]) for r in ranks] == [(4, 0, 0)] * 2


@pytest.mark.timeout(150)
def test_a_metric_missing_on_one_rank_fails_the_job_when_strict(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, "strict", str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code != 0
    assert job.leftovers() == [], job.output()
    assert "found no metric 'score'" in job.output()


def _run_ranks(tmp_path: Path, case: str) -> list[dict[str, Any]]:
    job = Job([sys.executable, __file__, case, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


class _PerRank(Scripted):
    """Rank 0 logs 10, 9, 8, ... (``diverging``) or a flat 5; rank 1 logs a flat 5, or nothing."""

    def __init__(self, case: str) -> None:
        super().__init__([5.0])
        self.case = case

    def value(self) -> float:
        return float(10 - self.current_epoch) if self.case == "diverging" and self.global_rank == 0 else 5.0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.case == "diverging" or self.global_rank == 0:
            super().validation_step(batch, batch_idx)


def _rank_main(case: str, out: str) -> None:
    """Two processes on the core's own ParallelStrategy; each rank writes what its callback saw."""
    from phalanx.strategies import ParallelStrategy

    es = EarlyStopping("score", patience=2 if case == "diverging" else 1, strict=case != "lenient")
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ParallelStrategy(),
        callbacks=[es],
        max_epochs=4 if case == "lenient" else 20,
        default_root_dir=out,
        num_sanity_val_steps=0,
        **quiet(enable_model_summary=False),
    )
    trainer.fit(_PerRank(case), loader(n=8), loader(n=8))
    record = {
        "current_epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "stopped_epoch": es.stopped_epoch,
        "wait_count": es.wait_count,
        "reason": es.stopping_reason.name,
        "message": es.stopping_reason_message,
    }
    (Path(out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2])
