"""Train ``common.Net`` with phalanx's FSDPStrategy; the tests run this file in a subprocess.

``python train.py OUT TAG CONFIG_JSON``. CONFIG keys: ``devices``, ``strategy`` (FSDPStrategy
kwargs; policy classes by name), ``precision``, ``epochs``, ``max_steps``, ``resume`` (a path),
``save_epochs`` (checkpoint at each epoch end; ``full_last_epoch`` makes the last one a full file),
``verify_against`` (reference weights file: on fit start, compare the loaded weights with its
epoch ``verify_epoch``), ``resave`` (save the loaded state there on fit start), ``mismatch`` (then
try to resume a different model from ``resume``), ``full_file`` (then resume from that full file).
Each rank writes ``OUT/TAG_rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from common import FORWARD_CALLS, Block, Net, write_json
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import phalanx
from phalanx.callbacks import Callback
from phalanx.errors import CheckpointError
from phalanx_strategy_fsdp import FSDPStrategy

_CLASSES = {"Block": Block}


class Actions(Callback):
    """Checkpoints at epoch ends; verification and re-saving right after a restore."""

    def __init__(self, out: str, tag: str, config: dict[str, Any]) -> None:
        self.out, self.tag, self.config = out, tag, config
        self.max_error: float | None = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self.config.get("save_epochs"):
            return
        if self.config.get("full_last_epoch") and trainer.current_epoch == self.config.get("epochs", 2) - 1:
            trainer.strategy.state_dict_type = "full"
        trainer.save_checkpoint(os.path.join(self.out, f"{self.tag}_epoch{trainer.current_epoch}"))

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        reference = self.config.get("verify_against")
        if reference:
            full = get_model_state_dict(pl_module, options=StateDictOptions(full_state_dict=True))
            expected = torch.load(reference, weights_only=True)[self.config.get("verify_epoch", 0)]
            self.max_error = max(float((full["net." + k] - v).abs().max()) for k, v in expected.items())
        if self.config.get("resave"):
            trainer.save_checkpoint(os.path.join(self.out, self.config["resave"]))


def _strategy(kwargs: dict[str, Any]) -> FSDPStrategy:
    for key in ("auto_wrap_policy", "activation_checkpointing_policy"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = {_CLASSES[name] for name in kwargs[key]}
    if isinstance(kwargs.get("device_mesh"), list):
        kwargs["device_mesh"] = tuple(kwargs["device_mesh"])
    return FSDPStrategy(**kwargs)


def _trainer(config: dict[str, Any], callbacks: list[Any]) -> phalanx.Trainer:
    return phalanx.Trainer(
        accelerator="cpu",
        devices=config.get("devices", 2),
        strategy=_strategy(dict(config.get("strategy", {}))),
        precision=config.get("precision", "32-true"),
        max_epochs=config.get("epochs", 2),
        max_steps=config.get("max_steps", -1),
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=callbacks,
        default_root_dir=config["out"],
    )


def main(out: str, tag: str, config: dict[str, Any]) -> None:
    config = {**config, "out": out}
    actions = Actions(out, tag, config)
    trainer = _trainer(config, [actions])
    model = Net()
    trainer.fit(model, ckpt_path=config.get("resume"))
    result: dict[str, Any] = {
        "losses": model.losses,
        "global_step": trainer.global_step,
        "block_forwards": FORWARD_CALLS["Block"],
        "verify_max_error": actions.max_error,
    }
    if config.get("mismatch"):
        try:
            _trainer(config, []).fit(Net(hidden=32), ckpt_path=config["resume"])
            result["mismatch_error"] = None
        except CheckpointError as error:
            result["mismatch_error"] = str(error)
    if config.get("full_file"):  # a full (single-file) checkpoint, loaded and resharded by every rank
        full_config = {**config, "resave": None, "verify_epoch": 1, "max_steps": 6}
        full_actions = Actions(out, tag, full_config)
        _trainer(full_config, [full_actions]).fit(Net(), ckpt_path=config["full_file"])
        result["full_file_max_error"] = full_actions.max_error
    write_json(os.path.join(out, f"{tag}_rank{trainer.global_rank}.json"), result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
