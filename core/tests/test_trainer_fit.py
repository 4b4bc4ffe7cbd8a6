"""Trainer.fit against a hand-written PyTorch loop: same seed and data give identical numbers."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from trainer_helpers import LossRecorder, Net, loader, plain_fit, quiet

from phalanx.trainer.trainer import Trainer


def _pair(**kwargs: object) -> tuple[Net, Net]:
    torch.manual_seed(1)
    model = Net(**kwargs)  # type: ignore[arg-type]
    return model, copy.deepcopy(model)


def _assert_same(reference: Net, trained: Net, ref_losses: list[torch.Tensor], losses: list[torch.Tensor]) -> None:
    assert len(ref_losses) == len(losses)
    for expected, got in zip(ref_losses, losses):
        assert torch.equal(expected, got)
    for (name, expected), (_, got) in zip(reference.state_dict().items(), trained.state_dict().items()):
        assert torch.equal(expected, got), name


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fit_matches_plain_loop_bit_for_bit(optimizer: str) -> None:
    reference, model = _pair(optimizer=optimizer)
    torch.manual_seed(7)
    ref_losses, _ = plain_fit(reference, loader(shuffle=True), epochs=2)
    recorder = LossRecorder()
    torch.manual_seed(7)
    trainer = Trainer(max_epochs=2, callbacks=[recorder], **quiet())
    trainer.fit(model, loader(shuffle=True))
    _assert_same(reference, model, ref_losses, recorder.losses)
    assert trainer.global_step == 20
    assert trainer.current_epoch == 2


@pytest.mark.parametrize(("accumulate", "clip"), [(3, None), (3, (0.05, "norm")), (1, (0.01, "value"))])
def test_accumulation_and_clipping_match_plain_loop(accumulate: int, clip: tuple[float, str] | None) -> None:
    reference, model = _pair()
    torch.manual_seed(3)
    ref_losses, _ = plain_fit(reference, loader(), epochs=2, accumulate=accumulate, clip=clip)
    recorder = LossRecorder()
    torch.manual_seed(3)
    kwargs = {"gradient_clip_val": clip[0], "gradient_clip_algorithm": clip[1]} if clip else {}
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=accumulate, callbacks=[recorder], **quiet(**kwargs))
    trainer.fit(model, loader())
    _assert_same(reference, model, ref_losses, recorder.losses)
    # 10 batches per epoch: windows of 3 plus a final partial window that still steps
    assert trainer.global_step == 2 * math.ceil(10 / accumulate)


def _step_lr(interval: str, frequency: int):
    def make(optimizer: torch.optim.Optimizer) -> dict[str, object]:
        sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"scheduler": sched, "interval": interval, "frequency": frequency}

    return make


@pytest.mark.parametrize(("interval", "frequency"), [("epoch", 1), ("step", 1), ("step", 3), ("epoch", 2)])
def test_lr_schedulers_step_like_plain_loop(interval: str, frequency: int) -> None:
    sched = _step_lr(interval, frequency)
    reference, model = _pair(scheduler=sched)
    torch.manual_seed(5)
    ref_losses, ref_lrs = plain_fit(reference, loader(), epochs=3, scheduler=sched)
    recorder = LossRecorder()
    torch.manual_seed(5)
    Trainer(max_epochs=3, callbacks=[recorder], **quiet()).fit(model, loader())
    _assert_same(reference, model, ref_losses, recorder.losses)
    assert recorder.lrs == ref_lrs


def test_reduce_on_plateau_uses_monitored_metric() -> None:
    def plateau(optimizer: torch.optim.Optimizer) -> dict[str, object]:
        return {
            "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.1),
            "monitor": "val_loss",
        }

    class Flat(Net):
        def validation_step(self, batch: object, batch_idx: int) -> None:
            self.log("val_loss", 1.0)  # never improves: the LR drops after every epoch but the first

    model = Flat(scheduler=plateau, lr=0.01)
    trainer = Trainer(max_epochs=3, **quiet())
    trainer.fit(model, loader(), loader(n=8))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01 * 0.1 * 0.1)

    broken = Net(
        scheduler=lambda opt: {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt), "monitor": "nope"}
    )
    with pytest.raises(ValueError, match="nope"):
        Trainer(max_epochs=1, **quiet()).fit(broken, loader())


def test_max_steps_stops_mid_epoch_and_limits() -> None:
    trainer = Trainer(max_steps=7, **quiet())
    trainer.fit(Net(), loader())
    assert (trainer.global_step, trainer.current_epoch, trainer.fit_loop.batches_done) == (7, 0, 7)

    trainer = Trainer(max_epochs=2, limit_train_batches=3, **quiet())
    trainer.fit(Net(), loader())
    assert (trainer.global_step, trainer.num_training_batches) == (6, 3)

    trainer = Trainer(max_epochs=1, limit_train_batches=0.5, **quiet())
    trainer.fit(Net(), loader())
    assert trainer.global_step == 5


class _CountVal(Net):
    def __init__(self) -> None:
        super().__init__()
        self.val_runs: list[tuple[int, int]] = []

    def on_validation_start(self) -> None:
        self.val_runs.append((self.current_epoch, self.trainer.fit_loop.batches_done))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"max_epochs": 2}, [(0, 10), (1, 10)]),
        ({"max_epochs": 1, "val_check_interval": 0.5}, [(0, 5), (0, 10)]),
        ({"max_epochs": 1, "val_check_interval": 3}, [(0, 3), (0, 6), (0, 9)]),
        ({"max_epochs": 4, "check_val_every_n_epoch": 2}, [(1, 10), (3, 10)]),
        ({"max_epochs": 2, "val_check_interval": 15, "check_val_every_n_epoch": None}, [(1, 5)]),
        ({"max_epochs": 2, "limit_val_batches": 0}, []),
    ],
)
def test_validation_schedule(kwargs: dict[str, object], expected: list[tuple[int, int]]) -> None:
    model = _CountVal()
    trainer = Trainer(**quiet(**kwargs, num_sanity_val_steps=0))
    trainer.fit(model, loader(), loader(n=8))
    assert model.val_runs == expected


def test_validation_does_not_change_training() -> None:
    with_val, without_val = _pair()
    torch.manual_seed(11)
    Trainer(max_epochs=2, val_check_interval=0.3, **quiet()).fit(
        with_val, loader(shuffle=True), loader(n=8, shuffle=True)
    )
    torch.manual_seed(11)
    Trainer(max_epochs=2, **quiet()).fit(without_val, loader(shuffle=True))
    for a, b in zip(with_val.parameters(), without_val.parameters()):
        assert torch.equal(a, b)


def test_validate_test_predict_outputs() -> None:
    model = Net()
    trainer = Trainer(**quiet())
    data = loader(n=12, batch_size=4)
    x, y = data.dataset.tensors
    model.eval()
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(model(x), y)
        outputs = model(x)
    model.train()
    (val,) = trainer.validate(model, data, verbose=False)
    assert set(val) == {"val_loss"}
    assert val["val_loss"] == pytest.approx(expected.item(), rel=1e-6)
    (test,) = trainer.test(model, data, verbose=False)
    assert test["test_loss"] == pytest.approx(expected.item(), rel=1e-6)
    predictions = trainer.predict(model, data)
    assert len(predictions) == 3
    assert torch.equal(torch.cat(predictions), outputs)
    assert model.training is True


def test_multiple_eval_dataloaders_get_suffixes() -> None:
    class Multi(Net):
        def validation_step(self, batch: object, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("val_loss", torch.tensor(float(dataloader_idx)))

        def predict_step(self, batch: object, batch_idx: int, dataloader_idx: int = 0) -> int:
            return dataloader_idx

    trainer = Trainer(**quiet())
    results = trainer.validate(Multi(), [loader(n=8), loader(n=4)], verbose=False)
    assert results == [{"val_loss/dataloader_idx_0": 0.0}, {"val_loss/dataloader_idx_1": 1.0}]
    assert trainer.predict(Multi(), [loader(n=8), loader(n=4)]) == [[0, 0], [1]]


def test_manual_optimization_with_two_optimizers() -> None:
    class Manual(Net):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: object, batch_idx: int) -> None:
            first, second = self.optimizers()
            x, y = batch  # type: ignore[misc]
            loss = torch.nn.functional.mse_loss(self(x), y)
            first.zero_grad()
            second.zero_grad()
            self.manual_backward(loss)
            first.step()
            second.step()

        def configure_optimizers(self) -> list[torch.optim.Optimizer]:
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[3].parameters(), lr=0.1),
            ]

    torch.manual_seed(1)
    model = Manual()
    reference = copy.deepcopy(model)
    # The same two-optimizer loop by hand: same data order, same dropout draws, same updates.
    torch.manual_seed(5)
    first, second = reference.configure_optimizers()
    reference.train()
    for x, y in loader():
        loss = torch.nn.functional.mse_loss(reference(x), y)
        first.zero_grad()
        second.zero_grad()
        loss.backward()
        first.step()
        second.step()
    torch.manual_seed(5)
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader())
    assert trainer.global_step == 20  # each optimizer's step counts, as in Lightning: 10 batches x 2
    for (name, expected), (_, got) in zip(reference.state_dict().items(), model.state_dict().items()):
        assert torch.equal(expected, got), name


def test_on_train_batch_start_minus_one_ends_epoch() -> None:
    class Stopper(Net):
        def on_train_batch_start(self, batch: object, batch_idx: int) -> int | None:
            return -1 if batch_idx == 4 else None

    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(Stopper(), loader())
    assert (trainer.global_step, trainer.current_epoch) == (8, 2)


def test_iterable_without_length_steps_last_partial_window() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from loader().dataset

    data = torch.utils.data.DataLoader(Stream(), batch_size=4)
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=3, **quiet())
    trainer.fit(Net(), data, loader(n=8))
    assert trainer.global_step == 4
    assert "val_loss" in trainer.callback_metrics
