"""Train PhalanxNet with a phalanx strategy; each rank writes its final weights and facts.

Usage: python fit.py STRATEGY OUT_DIR [DEVICES] [NUM_NODES]
Rank r writes OUT_DIR/rank{r}.json; the main process of ddp_spawn/ddp_fork writes main.json
(the weights it got back). A second entry point (validate) runs afterwards to prove a Trainer can run again (with ddp: in
the same processes, the process group re-created, no second set of children).
"""

from __future__ import annotations

import os
import sys
import time

import torch
from common import PhalanxNet, loader, state_to_lists, trainer_kwargs, write_json

import phalanx

if __name__ == "__main__":
    strategy, out = sys.argv[1], sys.argv[2]
    devices = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    num_nodes = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    torch.manual_seed(0)
    model = PhalanxNet()
    workers = strategy.startswith(("ddp_spawn", "ddp_fork"))
    # With worker processes, the checkpoint callback's paths must come back to this process too.
    trainer = phalanx.Trainer(
        **trainer_kwargs(
            devices=devices, num_nodes=num_nodes, strategy=strategy, enable_checkpointing=workers, default_root_dir=out
        )
    )
    started = time.time()
    trainer.fit(model, loader())
    fit_seconds = time.time() - started
    # A second entry point in the same processes (skipped for spawn: it would spawn anew).
    metrics = None if strategy.startswith("ddp_spawn") else trainer.validate(model, loader(), verbose=False)
    name = "main" if workers else f"rank{trainer.global_rank}"
    checkpoint = trainer.checkpoint_callback
    write_json(
        os.path.join(out, f"{name}.json"),
        {
            "state": state_to_lists(model.state_dict()),
            "pid": os.getpid(),
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "env": type(trainer.strategy.cluster_environment).__name__,
            "launcher": type(trainer.strategy.launcher).__name__,
            "direct_step": trainer.fit_loop.uses_direct_step,  # nothing customised: the loop's direct step
            "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "validate": metrics,
            "fit_seconds": fit_seconds,
            "best_model_path": getattr(checkpoint, "best_model_path", None),
            "last_model_path": getattr(checkpoint, "last_model_path", None),
        },
    )
