"""The DataModule, step signatures, Module hooks and Trainer members a Lightning script uses.

The DataModule's hooks and checkpointed state, training steps without ``batch_idx``, the
``backward`` / ``lr_scheduler_step`` / ``configure_callbacks`` hooks, ``fit(torch.compile(...))``
and the Trainer's read-only members. Single process; the multi-process paths run in tests/lightning.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from trainer_helpers import Net, dataset, loader, quiet

from phalanx import DataModule, Trainer
from phalanx.callbacks import Callback
from phalanx.errors import MisconfigurationError


# ---------------------------------------------------------------------- DataModule
class Data(DataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.calls: list[str] = []
        self.position = 0

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{stage}")
        self.train_set, self.val_set = dataset(32), dataset(8, seed=1)

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown:{stage}")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position + 1}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.position = state_dict["position"]


class SeesData(Net):
    def on_fit_start(self) -> None:
        self.datamodule_seen = self.trainer.datamodule


def test_datamodule_drives_the_data_and_is_checkpointed(tmp_path: Any) -> None:
    data = Data(batch_size=8)
    model = SeesData()
    trainer = Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path))
    trainer.fit(model, datamodule=data)
    assert data.calls == ["prepare_data", "setup:fit", "teardown:fit"]
    assert trainer.global_step == 4 and model.datamodule_seen is data and trainer.datamodule is data
    path = tmp_path / "a.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["Data"] == {"position": 1}
    assert checkpoint["datamodule_hyper_parameters"] == {"batch_size": 8}
    resumed = Data(batch_size=8)
    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(Net(), resumed, ckpt_path=path)  # the DataModule in the dataloaders' position, as Lightning allows
    assert resumed.position == 1 and trainer.global_step == 8 and trainer.ckpt_path == str(path)
    rebuilt = Data.load_from_checkpoint(path)
    assert rebuilt.hparams.batch_size == 8 and rebuilt.position == 1
    results = trainer.test(datamodule=resumed, verbose=False)
    assert "test_loss" in results[0] and resumed.calls[-2:] == ["setup:test", "teardown:test"]


def test_datamodule_bad_input() -> None:
    trainer = Trainer(**quiet(max_epochs=1))
    with pytest.raises(MisconfigurationError, match=r"both datamodule= and train_dataloaders="):
        trainer.fit(Net(), loader(), datamodule=Data())
    with pytest.raises(MisconfigurationError, match=r"expects a phalanx.DataModule, got list"):
        trainer.fit(Net(), datamodule=[1, 2])

    class NoTrain(DataModule):
        pass

    class Transfers(Data):
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return batch

    with pytest.raises(MisconfigurationError, match=r"Transfers defines on_before_batch_transfer.*move them to the Module"):
        trainer.fit(Net(), datamodule=Transfers())

    with pytest.raises(MisconfigurationError, match=r"got no training data"):
        trainer.fit(Net(), datamodule=NoTrain())


def test_datamodule_from_datasets() -> None:
    data = DataModule.from_datasets(dataset(16), val_dataset=dataset(8), batch_size=4)
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(Net(), datamodule=data)
    assert trainer.global_step == 4 and trainer.num_val_batches == [2]


# ---------------------------------------------------------------------- step signatures and hooks
class NoBatchIdx(Net):
    def training_step(self, batch: Any) -> torch.Tensor:  # type: ignore[override]
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any) -> None:  # type: ignore[override]
        self.log("val_loss", nn.functional.mse_loss(self(batch[0]), batch[1]))

    def predict_step(self, batch: Any) -> torch.Tensor:  # type: ignore[override]
        return self(batch[0])


@pytest.mark.parametrize("accumulate", [1, 2])  # 1: the direct step; 2: the layered step
def test_steps_without_batch_idx(accumulate: int) -> None:
    torch.manual_seed(0)
    model = NoBatchIdx()
    trainer = Trainer(**quiet(max_epochs=1, accumulate_grad_batches=accumulate))
    trainer.fit(model, loader(n=16), loader(n=8))
    assert trainer.global_step == 4 // accumulate
    assert trainer.fit_loop.uses_direct_step is (accumulate == 1)
    predictions = trainer.predict(model, loader(n=8))
    assert len(predictions) == 2


class CustomBackward(Net):
    def __init__(self, *, manual: bool = False) -> None:
        super().__init__()
        self.backward_calls = 0
        self.automatic_optimization = not manual

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.backward_calls += 1
        (loss * 2).backward(*args, **kwargs)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.automatic_optimization:
            return super().training_step(batch, batch_idx)
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(nn.functional.mse_loss(self(batch[0]), batch[1]))
        optimizer.step()
        return None


@pytest.mark.parametrize("manual", [False, True])
def test_backward_hook_is_called(manual: bool) -> None:
    torch.manual_seed(0)
    model = CustomBackward(manual=manual)
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(model, loader(n=16))
    assert model.backward_calls == 4
    assert not trainer.fit_loop.uses_direct_step
    # the doubled loss is what trained: equal to plain SGD on 2 x loss
    torch.manual_seed(0)
    reference = CustomBackward()
    optimizer = reference.make_optimizer(reference.parameters())
    reference.train()
    for x, y in loader(n=16):
        optimizer.zero_grad()
        (2 * nn.functional.mse_loss(reference(x), y)).backward()
        optimizer.step()
    for key, value in reference.state_dict().items():
        assert torch.allclose(model.state_dict()[key], value, atol=1e-6), key


class SchedulerHook(Net):
    def __init__(self) -> None:
        super().__init__()
        self.stepped: list[Any] = []

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        self.stepped.append(metric)
        scheduler.step()


class Marker(Callback):
    def __init__(self, name: str) -> None:
        self.name = name


def test_lr_scheduler_step_and_configure_callbacks() -> None:
    model = SchedulerHook()
    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(model, loader(n=8))
    assert model.stepped == [None, None]
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == [pytest.approx(0.1 * 0.1**2)]

    class WithCallbacks(Net):
        def configure_callbacks(self) -> Any:
            return [Marker("module")]

    trainer = Trainer(**quiet(max_epochs=1, callbacks=[Marker("trainer")]))
    trainer.fit(WithCallbacks(), loader(n=8))
    assert [cb.name for cb in trainer.callbacks if isinstance(cb, Marker)] == ["module"]


# ---------------------------------------------------------------------- members
def test_trainer_members() -> None:
    trainer = Trainer(**quiet(max_epochs=1))
    assert trainer.num_devices == 1 and trainer.device_ids == [0] and trainer.num_nodes == 1
    assert trainer.ckpt_path is None and trainer.datamodule is None and not trainer.interrupted
    train, val = loader(n=8), loader(n=8)
    trainer.fit(Net(), train, val)
    assert trainer.train_dataloader is train and trainer.val_dataloaders is val
    assert trainer.test_dataloaders is None and not trainer.received_sigterm
    assert not trainer.sanity_checking and trainer.scaler is None
    last: list[bool] = []

    class LastBatch(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            last.append(trainer.is_last_batch)

    Trainer(**quiet(max_epochs=1, callbacks=[LastBatch()])).fit(Net(), loader(n=12))
    assert last == [False, False, True]

    class Fails(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise ValueError("boom")

    trainer = Trainer(**quiet(max_epochs=1))
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(Fails(), train)
    assert trainer.interrupted


def test_ctrl_c_in_a_single_process_ends_gracefully_with_exit_code_1() -> None:
    """Lightning's graceful shutdown: INTERRUPTED, on_exception and teardown, then SystemExit(1)."""
    seen: list[str] = []

    class CtrlC(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            raise KeyboardInterrupt

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            seen.append(type(exception).__name__)

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            seen.append(f"teardown {stage}")

    trainer = Trainer(**quiet(max_epochs=1, callbacks=[CtrlC()]))
    with pytest.raises(SystemExit) as info:
        trainer.fit(Net(), loader())
    assert info.value.code == 1
    assert trainer.interrupted and trainer.state.status == "interrupted"
    assert seen == ["KeyboardInterrupt", "teardown fit"]


def test_hparams_reach_logger_and_checkpoint(tmp_path: Any) -> None:
    class Hyper(Net):
        def __init__(self, lr: float = 0.05, width: int = 16) -> None:
            super().__init__(lr=lr)
            self.save_hyperparameters()

    from phalanx.loggers import CSVLogger

    logger = CSVLogger(tmp_path)
    trainer = Trainer(enable_progress_bar=False, logger=logger, max_epochs=1, default_root_dir=tmp_path)
    trainer.fit(Hyper(lr=0.01), loader(n=8))
    import yaml

    with open(os.path.join(logger.log_dir, "hparams.yaml")) as handle:
        assert yaml.safe_load(handle) == {"lr": 0.01, "width": 16}
    path = trainer.checkpoint_callback.best_model_path or trainer.checkpoint_callback.last_model_path  # type: ignore[union-attr]
    if not path:
        path = str(next((tmp_path).rglob("*.ckpt")))
    assert torch.load(path, weights_only=False)["hyper_parameters"] == {"lr": 0.01, "width": 16}
    assert math.isclose(Hyper.load_from_checkpoint(path).hparams.lr, 0.01)


def test_fit_a_compiled_module() -> None:
    """``trainer.fit(torch.compile(model))`` trains the Module itself, its forward compiled (Lightning's rule)."""
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="eager")
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(compiled, loader(n=16), loader(n=8))
    assert trainer.lightning_module is model and "forward" in vars(model)
    torch.manual_seed(0)
    reference = Net()
    Trainer(**quiet(max_epochs=1)).fit(reference, loader(n=16), loader(n=8))
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert trainer.validate(compiled, loader(n=8), verbose=False)[0]["val_loss"] > 0


def test_configure_sharded_model_is_still_called() -> None:
    """Lightning 2.0's name of configure_model: ported code that overrides it keeps working."""

    class Old(Net):
        def __init__(self) -> None:
            super().__init__()
            self.head: nn.Module | None = None

        def configure_sharded_model(self) -> None:
            self.head = nn.Linear(1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert self.head is not None
            return self.head(self.net(x))

    model = Old()
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(model, loader(n=8))
    assert isinstance(model.head, nn.Linear) and trainer.global_step == 2
