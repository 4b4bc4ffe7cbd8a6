"""Every built-in callback and two loggers at once, on two processes, with outcomes known in advance.

Run as a user would (``python callbacks_matrix.py --strategy ddp|fsdp --devices 2 --root DIR --out
result.json``); the strategy launches the second rank by re-running this file. The Module logs a
scripted validation score (each rank logs its own value; ``sync_dist`` averages them to
:data:`SCORES`), so EarlyStopping's stop and ModelCheckpoint's top-k are known before the run.
Training is real (plain SGD, StepLR, a ``{0: 1, 1: 2}`` accumulation schedule), so the test can
replay it in plain PyTorch and compare the weights. After fit, ``trainer.predict`` runs with a
per-rank prediction writer. Every rank writes what it saw to ``rank<N>.json`` (its view of the
stop, the step count, the monitors' state and the gathered weights); global rank 0 also writes
``--out`` (where the logs and checkpoints are). The test reads the logs back with TensorBoard's
and the csv module's own readers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks.device_stats_monitor import DeviceStatsMonitor
from phalanx.callbacks.early_stopping import EarlyStopping
from phalanx.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from phalanx.callbacks.lr_monitor import LearningRateMonitor
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.model_summary import ModelSummary
from phalanx.callbacks.prediction_writer import BasePredictionWriter
from phalanx.callbacks.spike_detection import SpikeDetection
from phalanx.callbacks.throughput_monitor import ThroughputMonitor
from phalanx.loggers.csv_logs import CSVLogger
from phalanx.loggers.tensorboard import TensorBoardLogger

FEATURES, HIDDEN = 6, 8
#: 24 training samples, 4 per batch: each of the 2 ranks reads 3 batches per epoch.
TRAIN_SAMPLES, VAL_SAMPLES, BATCH = 24, 8, 4
#: 11 samples in batches of 3: rank 0 predicts 6 (3 + 3), rank 1 predicts 5 (3 + 2), no padding.
PREDICT_SAMPLES, PREDICT_BATCH = 11, 3
LR, GAMMA = 0.1, 0.5
SEED = 1234
#: The validation score of each epoch, after ``sync_dist`` averages the ranks' values.
SCORES = (3.0, 2.0, 1.8, 0.5, 0.4, 0.3)
#: Rank r logs ``SCORES[epoch] + RANK_OFFSETS[r]``; the mean over the two ranks is SCORES[epoch].
RANK_OFFSETS = (-0.25, 0.25)
#: Epoch 1 improves on epoch 0 by 1.0 > MIN_DELTA; epoch 2 only by 0.2, so patience 1 runs out there.
MIN_DELTA, PATIENCE = 0.5, 1
STOP_EPOCH = 2
MAX_EPOCHS = len(SCORES)
ACCUMULATION = {0: 1, 1: 2}
#: A constant the ThroughputMonitor turns into FLOPs per second (the arithmetic is what is checked).
FLOPS_PER_BATCH = 1000


def make_net() -> nn.Sequential:
    """The network, initialised from :data:`SEED` so the test's replay starts from the same weights."""
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def regression_data(samples: int, seed: int) -> TensorDataset:
    """A target with a large constant part: the first losses are alike across batches and then fall
    steadily, so no batch's loss is a spike by SpikeDetection's rule (the test replays the rule)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    weights = torch.linspace(-0.3, 0.3, FEATURES).unsqueeze(1)
    return TensorDataset(x, x @ weights + 2.0 + 0.05 * torch.randn(samples, 1, generator=generator))


def predict_inputs() -> torch.Tensor:
    return torch.randn(PREDICT_SAMPLES, FEATURES, generator=torch.Generator().manual_seed(7))


class MatrixModel(Module):
    """MSE regression with SGD + StepLR; validation logs the scripted score (plus a rank offset)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()
        self.flops_per_batch = FLOPS_PER_BATCH

    def training_step(self, batch: Sequence[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: Sequence[torch.Tensor], batch_idx: int) -> None:
        score = SCORES[self.current_epoch] + RANK_OFFSETS[self.global_rank]
        self.log("val_score", score, on_epoch=True, sync_dist=True)

    def predict_step(self, batch: Sequence[torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)  # no momentum: the replay is one line per step
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class PerRankWriter(BasePredictionWriter):
    """Writes each batch as a JSON line and, at the end, everything as one torch file, per rank."""

    def __init__(self, output_dir: Path) -> None:
        super().__init__(write_interval="batch_and_epoch")
        self.output_dir = output_dir

    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        line = {"batch_idx": batch_idx, "indices": list(batch_indices or []), "predictions": prediction.tolist()}
        with open(self.output_dir / f"batches_rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def write_on_epoch_end(
        self, trainer: Any, pl_module: Any, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        payload = {"predictions": [p.detach().cpu() for p in predictions], "batch_indices": list(batch_indices)}
        torch.save(payload, self.output_dir / f"epoch_rank{trainer.global_rank}.pt")


def full_weights(model: nn.Module) -> dict[str, list[Any]]:
    """The whole weights on every rank: FSDP's DTensor shards are gathered (a collective: all ranks call it)."""
    weights = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        weights[name] = full.detach().cpu().tolist()
    return weights


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", default="2")
    parser.add_argument("--root", required=True, help="the Trainer's default_root_dir")
    parser.add_argument("--out", required=True, help="JSON file for the results (written by global rank 0)")
    return parser.parse_args()


def run() -> None:
    args = parse_args()
    root = Path(args.root)
    model = MatrixModel()
    stopper = EarlyStopping(monitor="val_score", mode="min", min_delta=MIN_DELTA, patience=PATIENCE)
    lr_monitor = LearningRateMonitor()
    checkpoint = ModelCheckpoint(monitor="val_score", mode="min", save_top_k=2, save_last=True)
    spikes = SpikeDetection()
    accumulation = GradientAccumulationScheduler(dict(ACCUMULATION))
    callbacks = [
        stopper,
        lr_monitor,
        checkpoint,
        ThroughputMonitor(batch_size_fn=lambda batch: int(batch[0].size(0)), window_size=2),
        DeviceStatsMonitor(),
        spikes,
        accumulation,
        ModelSummary(),
        PerRankWriter(root),
    ]
    loggers = [TensorBoardLogger(args.root, name="tb"), CSVLogger(args.root, name="csv")]
    trainer = Trainer(
        default_root_dir=args.root,
        accelerator=args.accelerator,
        strategy=args.strategy,
        devices=int(args.devices),
        max_epochs=MAX_EPOCHS,
        callbacks=callbacks,
        logger=loggers,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
    )
    trainer.fit(
        model,
        DataLoader(regression_data(TRAIN_SAMPLES, seed=1), batch_size=BATCH),
        DataLoader(regression_data(VAL_SAMPLES, seed=2), batch_size=BATCH),
    )
    fit_view = {
        "world_size": trainer.world_size,
        "stopped_epoch": stopper.stopped_epoch,
        "current_epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "should_stop": trainer.should_stop,
        "early_stopping_best": float(stopper.best_score),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "lrs": lr_monitor.lrs,
        "best_model_score": float(checkpoint.best_model_score),
        "best_model_path": str(checkpoint.best_model_path),
        "best_k_models": {Path(path).name: float(score) for path, score in checkpoint.best_k_models.items()},
        "last_model_path": str(checkpoint.last_model_path),
        "bad_batches": list(spikes.bad_batches),
        "weights": full_weights(model),
    }
    returned = trainer.predict(model, DataLoader(TensorDataset(predict_inputs()), batch_size=PREDICT_BATCH))
    fit_view["returned_rows"] = sum(len(batch) for batch in returned or [])
    rank = trainer.global_rank
    (root / f"rank{rank}.json").write_text(json.dumps(fit_view), encoding="utf-8")
    if trainer.is_global_zero:
        result = {
            "world_size": trainer.world_size,
            "tensorboard_dir": loggers[0].log_dir,
            "csv_dir": loggers[1].log_dir,
            "checkpoint_dir": str(checkpoint.dirpath),
        }
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    run()
