"""Asynchronous sharded saves under FSDPStrategy: fit, resume from "last", compare with a plain run.

``python async_resume.py OUT``. Three fits in one launch (both ranks run them in lockstep):
``async`` trains 2 epochs with ``AsyncCheckpointIO`` and ModelCheckpoint (a sharded checkpoint
per epoch plus "last"); ``resumed`` continues from ``ckpt_path="last"`` to 4 epochs, saving
asynchronously again; ``plain`` trains 4 epochs from scratch with synchronous saves. Rank 0
writes each fit's full final weights to ``OUT/<tag>_weights.pt`` and the checkpoint listing to
``OUT/async_files.json``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from common import Block, Net
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import phalanx
from phalanx.callbacks import Callback, ModelCheckpoint
from phalanx.checkpoint_io import AsyncCheckpointIO
from phalanx_strategy_fsdp import FSDPStrategy


class FinalWeights(Callback):
    """Gather the full weights at the end of training (collective) and write them on rank 0."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        full = get_model_state_dict(pl_module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if trainer.is_global_zero:
            torch.save({k: v.clone() for k, v in full.items()}, self.path)


def _fit(out: str, tag: str, *, epochs: int, asynchronous: bool, resume: str | None) -> phalanx.Trainer:
    callbacks: list[Any] = [FinalWeights(os.path.join(out, f"{tag}_weights.pt"))]
    if asynchronous:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(out, "ckpts"), save_last=True, save_top_k=-1))
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=FSDPStrategy(auto_wrap_policy={Block}),
        plugins=[AsyncCheckpointIO()] if asynchronous else None,
        max_epochs=epochs,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        logger=False,
        enable_checkpointing=asynchronous,
        enable_progress_bar=False,
        callbacks=callbacks,
        default_root_dir=out,
    )
    trainer.fit(Net(), ckpt_path=resume)
    return trainer


def main(out: str) -> None:
    trainer = _fit(out, "async", epochs=2, asynchronous=True, resume=None)
    if trainer.is_global_zero:
        folder = os.path.join(out, "ckpts")
        with open(os.path.join(out, "async_files.json"), "w") as handle:
            json.dump({name: sorted(os.listdir(os.path.join(folder, name))) for name in os.listdir(folder)}, handle)
    _fit(out, "resumed", epochs=4, asynchronous=True, resume="last")
    _fit(out, "plain", epochs=4, asynchronous=False, resume=None)


if __name__ == "__main__":
    main(sys.argv[1])
