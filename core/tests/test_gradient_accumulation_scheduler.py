"""GradientAccumulationScheduler on real fits, against a hand-written PyTorch loop with the same schedule.

The two-process test runs this file as a script (``python test_gradient_accumulation_scheduler.py
OUT``) under the core's own ParallelStrategy, which shards the data but does not synchronise
gradients: each rank's weights must equal a plain loop with the same schedule over that rank's shard.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer

SCHEDULE = {0: 1, 1: 2, 2: 3}


class Linear(Module):
    """A deterministic model (no dropout) so ranks and the reference agree exactly."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(6, 1)
        self.seen_factors: list[int] = []

    def on_train_epoch_start(self) -> None:
        self.seen_factors.append(self.trainer.accumulate_grad_batches)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def plain_scheduled(model: nn.Module, shards: list[list[Any]], schedule: dict[int, int], epochs: int) -> int:
    """Accumulate ``schedule[epoch]`` batches per step; with several shards, average their gradients
    (what DDP would do). Returns the optimizer steps taken."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    factor, steps = 1, 0
    for epoch in range(epochs):
        factor = schedule.get(epoch, factor)
        batches = len(shards[0])
        for batch_idx in range(batches):
            if batch_idx % factor == 0:
                optimizer.zero_grad()
            for shard in shards:
                x, y = shard[batch_idx]
                (nn.functional.mse_loss(model(x), y) / factor / len(shards)).backward()
            if (batch_idx + 1) % factor == 0 or batch_idx + 1 == batches:
                optimizer.step()
                steps += 1
    return steps


def test_scheduled_fit_equals_plain_loop() -> None:
    model = Linear()
    reference = copy.deepcopy(model.layer)
    data = loader(n=36)  # 9 batches: the last window of epochs 1 and 2 is incomplete
    steps = plain_scheduled(reference, [list(data)], SCHEDULE, epochs=3)
    schedule = GradientAccumulationScheduler(scheduling=dict(SCHEDULE))
    trainer = Trainer(max_epochs=3, callbacks=[schedule], **quiet())
    trainer.fit(model, data)
    assert model.seen_factors == [1, 2, 3]
    assert trainer.global_step == steps == 9 + 5 + 3
    for expected, got in zip(reference.parameters(), model.layer.parameters()):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not trainer.fit_loop.uses_direct_step  # the last epoch accumulated


def test_epochs_without_accumulation_take_the_direct_step() -> None:
    trainer = Trainer(max_epochs=2, callbacks=[GradientAccumulationScheduler({1: 1})], **quiet())
    trainer.fit(Linear(), loader(n=16))
    assert trainer.fit_loop.uses_direct_step and trainer.global_step == 8


def test_estimated_stepping_batches_follows_the_schedule() -> None:
    seen: list[float] = []

    class Reads(Linear):
        def configure_optimizers(self) -> torch.optim.Optimizer:
            seen.append(self.trainer.estimated_stepping_batches)
            return super().configure_optimizers()

    trainer = Trainer(max_epochs=4, callbacks=[GradientAccumulationScheduler({0: 1, 1: 2, 2: 3})], **quiet())
    trainer.fit(Reads(), loader(n=36))
    assert seen == [9 + 5 + 3 + 3] and trainer.global_step == 20


def test_missing_epoch_zero_means_no_accumulation_until_the_first_key() -> None:
    scheduling = {2: 4}
    schedule = GradientAccumulationScheduler(scheduling)
    assert schedule.scheduling == {2: 4, 0: 1} == scheduling  # Lightning completes the caller's dict too
    assert [schedule.get_accumulate_grad_batches(e) for e in range(4)] == [1, 1, 4, 4]
    assert schedule.going_to_accumulate_grad_batches()


@pytest.mark.parametrize(
    ("scheduling", "error", "match"),
    [
        ({}, TypeError, "empty schedule"),
        ({-1: 2}, MisconfigurationError, r"Epoch should be an int >= 0.*\[-1\]"),
        ({0: 0}, MisconfigurationError, r"Accumulation factor should be an int > 0.*\[0\]"),
        ({0: 1.5}, MisconfigurationError, r"Accumulation factor should be an int > 0"),
    ],
)
def test_invalid_schedules_are_refused(scheduling: dict[Any, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        GradientAccumulationScheduler(scheduling)


def test_trainer_accumulation_and_a_schedule_conflict() -> None:
    trainer = Trainer(
        max_epochs=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({0: 2})], **quiet()
    )
    with pytest.raises(
        ValueError, match="Either remove `accumulate_grad_batches` from the Trainer or remove the callback"
    ):
        trainer.fit(Linear(), loader(n=8))


def test_manual_optimization_is_refused() -> None:
    class Manual(Linear):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

    trainer = Trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})], **quiet())
    with pytest.raises(RuntimeError, match="not supported for manual optimization"):
        trainer.fit(Manual(), loader(n=8))


def test_a_strategy_that_accumulates_itself_is_refused() -> None:
    from phalanx.strategies import SingleDeviceStrategy

    class SelfAccumulating(SingleDeviceStrategy):
        @property
        def handles_gradient_accumulation(self) -> bool:
            return True

    trainer = Trainer(
        max_epochs=1, strategy=SelfAccumulating("cpu"), callbacks=[GradientAccumulationScheduler({0: 2})], **quiet()
    )
    with pytest.raises(RuntimeError, match="SelfAccumulating` does not support `accumulate_grad_batches` changing"):
        trainer.fit(Linear(), loader(n=8))


def test_setting_an_invalid_factor_names_the_value() -> None:
    trainer = Trainer(**quiet())
    with pytest.raises(MisconfigurationError, match=r"accumulate_grad_batches = 0 is invalid"):
        trainer.accumulate_grad_batches = 0


# ------------------------------------------------------------------ two processes
@pytest.mark.timeout(150)
def test_two_ranks_each_equal_a_plain_loop_over_their_shard(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    data = loader(n=36)  # DistributedSampler without shuffle: rank r takes samples r, r+2, ...
    samples = list(data.dataset)  # type: ignore[arg-type]
    shards = []
    for rank in range(2):
        mine = samples[rank::2]
        shards.append([tuple(torch.stack(t) for t in zip(*mine[i : i + 4])) for i in range(0, len(mine), 4)])
    for rank, record in enumerate(ranks):
        reference = Linear().layer
        steps = plain_scheduled(reference, [shards[rank]], SCHEDULE, epochs=3)
        assert record["global_step"] == steps == 5 + 3 + 2
        assert record["factors"] == [1, 2, 3]
        for want, got in zip(reference.parameters(), record["params"]):
            torch.testing.assert_close(torch.tensor(got), want.detach().flatten(), rtol=0, atol=0)
    assert ranks[0]["params"] != ranks[1]["params"]  # the shards differ, so a rank training on all data fails


def _rank_main(out: str) -> None:
    from phalanx.strategies import ParallelStrategy

    model = Linear()
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ParallelStrategy(),
        callbacks=[GradientAccumulationScheduler(scheduling=dict(SCHEDULE))],
        max_epochs=3,
        default_root_dir=out,
        **quiet(enable_model_summary=False),
    )
    trainer.fit(model, loader(n=36))
    record = {
        "global_step": trainer.global_step,
        "factors": model.seen_factors,
        "params": [p.detach().flatten().tolist() for p in model.layer.parameters()],
    }
    (Path(out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank_main(sys.argv[1])
