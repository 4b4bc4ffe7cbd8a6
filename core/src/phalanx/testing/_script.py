"""The script every conformance run executes, and the constants its plain-PyTorch twin shares.

A run is a fresh Python process started from this generated file, never the pytest process:
strategies such as ``ddp`` re-execute the user's script, and spawn launchers import it again in
each worker. What the test compares is written to files by the processes themselves (rank 0's
losses, each rank's predictions), because spawned workers hand no Python state back.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

__all__ = ["BATCH", "EVAL_SAMPLES", "FEATURES", "HIDDEN", "LR", "MOMENTUM", "OUTPUTS", "SAMPLES", "render_script"]

FEATURES, HIDDEN, OUTPUTS, SAMPLES, EVAL_SAMPLES, BATCH, LR = 6, 8, 3, 48, 16, 4, 0.1
#: SGD momentum: the optimizer has state, so a resume that drops it gives other weights.
MOMENTUM = 0.9
#: Seeds of the training data, the evaluation data (validate/predict), the test data and the model.
DATA_SEED, VAL_SEED, TEST_SEED, MODEL_SEED = 1234, 99, 100, 7

_TEMPLATE = '''
import json, os, time
import torch
from torch.utils.data import DataLoader, TensorDataset
from phalanx import Module, Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.discovery import convert_checkpoint
from phalanx.strategies import StrategyRegistry

OUT = {out!r}
FEATURES, HIDDEN, OUTPUTS, SAMPLES, EVAL_SAMPLES, BATCH, LR, MOMENTUM = {features}, {hidden}, {outputs}, {samples}, {eval_samples}, {batch}, {lr}, {momentum}
STRATEGY, PARAMS, ACCELERATOR, DEVICES = {strategy!r}, {params!r}, {accelerator!r}, {devices!r}
MODE, STEPS, RESUME_AT, FAIL_AT, EVALUATE = {mode!r}, {steps}, {resume_at}, {fail_at}, {evaluate}


def make_data(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, FEATURES, generator=g), torch.randn(n, OUTPUTS, generator=g)


def make_strategy():
    """The registered name as a user writes it, or an instance when the test overrides init params."""
    return StrategyRegistry.get(STRATEGY, **PARAMS) if PARAMS else STRATEGY


class Net(Module):
    def __init__(self, seed={model_seed}, losses="losses.txt"):
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = torch.nn.Linear(FEATURES, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, OUTPUTS)
        self.losses = losses

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        if self.global_rank == 0:  # written by the worker itself: spawn launchers keep no Python state
            with open(os.path.join(OUT, self.losses), "a") as f:
                f.write(f"{{loss.item()!r}}\\n")
        if FAIL_AT >= 0 and self.global_step == FAIL_AT and self.global_rank == self.trainer.world_size - 1:
            with open(os.path.join(OUT, "failed_at.txt"), "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError("conformance: deliberate failure on the last rank")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        index, x = batch
        out = self(x)
        path = os.path.join(OUT, "predictions", f"rank{{self.global_rank}}-batch{{batch_idx}}.pt")
        torch.save({{"index": index.cpu(), "out": out.detach().cpu()}}, path)
        return out

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)

    def train_dataloader(self):
        return DataLoader(TensorDataset(*make_data({data_seed}, SAMPLES)), batch_size=BATCH, shuffle=False)


def make_trainer(max_steps, callbacks=()):
    return Trainer(
        strategy=make_strategy(), accelerator=ACCELERATOR, devices=DEVICES, max_steps=max_steps,
        logger=False, enable_checkpointing=bool(callbacks), callbacks=list(callbacks),
        enable_progress_bar=False, default_root_dir=OUT,
    )


def finish(trainer, extra):
    ckpt = os.path.join(OUT, "final.ckpt")
    trainer.save_checkpoint(ckpt)
    if trainer.is_global_zero:
        convert_checkpoint(ckpt, os.path.join(OUT, "portable.ckpt"))
        result = {{"world_size": trainer.world_size, "strategy": type(trainer.strategy).__name__,
                   "start_method": getattr(trainer.strategy, "start_method", None), **extra}}
        with open(os.path.join(OUT, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    if MODE == "resume":
        # Saved by a callback inside the training processes, as a user's ModelCheckpoint does: after
        # a spawn/fork fit the main process holds the weights but not the optimizer state.
        every = ModelCheckpoint(dirpath=os.path.join(OUT, "checkpoints"), filename="middle", every_n_train_steps=RESUME_AT)
        first = make_trainer(RESUME_AT, callbacks=[every])
        first.fit(Net(losses="losses_before.txt"))
        middle = os.path.join(OUT, "checkpoints", "middle.ckpt")
        # Rank 0 writes the file (atomically) and nothing makes the other ranks wait for it; they
        # would otherwise look for it before it exists.
        deadline = time.monotonic() + 60
        while not os.path.exists(middle) and time.monotonic() < deadline:
            time.sleep(0.05)
        trainer = make_trainer(STEPS)
        model = Net(seed={model_seed} + 1, losses="losses_after.txt")  # other weights: they must come from the file
        trainer.fit(model, ckpt_path=middle)
        finish(trainer, {{}})
    else:
        trainer = make_trainer(STEPS)
        model = Net()
        trainer.fit(model)
        extra = {{}}
        if EVALUATE:
            x, y = make_data({val_seed}, EVAL_SAMPLES)
            tx, ty = make_data({test_seed}, EVAL_SAMPLES)
            os.makedirs(os.path.join(OUT, "predictions"), exist_ok=True)
            extra["validate"] = trainer.validate(model, DataLoader(TensorDataset(x, y), batch_size=BATCH), verbose=False)
            extra["test"] = trainer.test(model, DataLoader(TensorDataset(tx, ty), batch_size=BATCH), verbose=False)
            index = torch.arange(EVAL_SAMPLES)
            predictions = trainer.predict(model, DataLoader(TensorDataset(index, x), batch_size=BATCH))
            extra["predicted_batches"] = len(predictions) if predictions is not None else None
        finish(trainer, extra)
'''


def render_script(
    path: Path,
    *,
    out: Path,
    strategy: str,
    params: dict[str, Any],
    accelerator: str,
    devices: int,
    mode: str = "fit",
    steps: int = 8,
    resume_at: int = 3,
    fail_at: int = -1,
    evaluate: bool = False,
) -> Path:
    """Write the conformance script to ``path``.

    Args:
        path: Where to write it; its folder is the run's working directory.
        out: Folder the processes write their results into.
        strategy: The registered strategy name.
        params: Init-param overrides; the script builds an instance with ``StrategyRegistry.get``
            when not empty (their ``repr`` must be valid Python), else passes the name.
        accelerator: ``Trainer(accelerator=...)``.
        devices: ``Trainer(devices=...)``.
        mode: ``"fit"`` (one uninterrupted fit) or ``"resume"`` (fit to ``resume_at``, save, and a
            new Trainer resumes from that file to ``steps``).
        steps: ``max_steps`` of the (final) fit.
        resume_at: Where the first fit of ``"resume"`` stops.
        fail_at: The global step at which the last rank raises; -1 for none.
        evaluate: After fit, also run validate, test and predict.
    """
    text = _TEMPLATE.format(
        out=str(out), features=FEATURES, hidden=HIDDEN, outputs=OUTPUTS, samples=SAMPLES,
        eval_samples=EVAL_SAMPLES, batch=BATCH, lr=LR, momentum=MOMENTUM, strategy=strategy, params=dict(params),
        accelerator=accelerator, devices=devices, mode=mode, steps=steps, resume_at=resume_at,
        fail_at=fail_at, evaluate=evaluate, model_seed=MODEL_SEED, data_seed=DATA_SEED,
        val_seed=VAL_SEED, test_seed=TEST_SEED,
    )
    path.write_text(textwrap.dedent(text))
    return path
