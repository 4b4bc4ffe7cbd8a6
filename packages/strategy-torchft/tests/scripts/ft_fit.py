"""Train with ft_ddp (or ft_hsdp, ft_diloco); every group's rank writes its weights, commit log and heal log.

Usage: python ft_fit.py OUT_DIR EPOCHS [options as JSON]
Options: hsdp (use ft_hsdp: FSDP2 inside each group), wrap_linear (ft_hsdp: each Linear its own unit),
diloco (use ft_diloco with these options), inner ("sgd" / "adamw": the Module's optimizer, else Adam),
devices, replica_groups, min_replicas, timeout, quorum_timeout, lighthouse, max_restarts,
accumulate / clip (Trainer's accumulate_grad_batches / gradient_clip_val),
kill_group / kill_step (SIGKILL that group's processes, every rank, during that step, once), step_sleep (seconds
per step, so a restarted group finds the others still training), alone_sleep (seconds per step
while the previous step committed with one group only, in groups other than kill_group: the survivor waits for the restarted group
without slowing the rest of the run), heal_after_alone (the restarted group waits before its fit
until the survivor has committed a step alone, so the drop is seen however fast the restart is),
seed_by_group (each group seeds its Module differently), wait_for_restart (while its
last step or sync was alone, the survivor waits for the restarted group to have set up its fit, so
an ft_diloco group that heals only at a sync finds it still training, however slow the restart),
kill_after_sync (the killed group dies only once group 0 has committed this many syncs, so the
syncs before the kill include it on every run), save_at_step / resume (write a checkpoint when
global_step reaches it; then fit again from that checkpoint and write ``*_resumed.json``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import torch
from ft_common import BATCH_SIZE, SEED, build_layers, dataset, inner_optimizer, loss_fn, write_json
from phalanx_strategy_torchft import FTDDPStrategy, FTDiLoCoStrategy, FTHSDPStrategy
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

import phalanx

OUT = sys.argv[1]
EPOCHS = int(sys.argv[2])
OPTIONS: dict[str, Any] = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
#: Written by the survivor's rank 0 once it has committed a step with its group alone (heal_after_alone).
ALONE = os.path.join(OUT, "committed_alone")
#: How long a restarted group waits for ALONE before it joins anyway (the test then fails on the log).
ALONE_WAIT_SECONDS = 60.0
#: The checkpoint save_at_step writes (the first fit) and resume reads (the second).
CHECKPOINT = os.path.join(OUT, "mid.ckpt")
#: Written by the restarted group when its fit is set up (wait_for_restart).
RESTARTED = os.path.join(OUT, "restarted_fit")
RESUMING = False  # the second fit (resume) saves no checkpoint


class Net(phalanx.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = build_layers()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        strategy = self.trainer.strategy
        marker = os.path.join(
            OUT, "killed" if self.trainer.global_rank == 0 else f"killed_rank{self.trainer.global_rank}"
        )
        if (
            strategy.replica_group_id == OPTIONS.get("kill_group")
            and self.trainer.global_step == OPTIONS.get("kill_step")
            and not os.path.exists(marker)
        ):
            with open(marker, "w") as fh:
                fh.write(str(time.time()))
            if "kill_after_sync" in OPTIONS:
                wait_for_file(os.path.join(OUT, f"synced_{OPTIONS['kill_after_sync']}"))
            os.kill(os.getpid(), signal.SIGKILL)  # after the quorum, before the all-reduce: mid-step
        if self.trainer.global_rank == 0 and self.trainer.global_step == OPTIONS.get("mark_step"):
            write_json(os.path.join(OUT, "stepped"), {"global_step": self.trainer.global_step})  # training is under way
        if OPTIONS.get("step_sleep"):
            time.sleep(OPTIONS["step_sleep"])
        log = strategy.commit_log
        if "kill_after_sync" in OPTIONS and strategy.replica_group_id == 0 and self.trainer.global_rank == 0:
            synced = os.path.join(OUT, f"synced_{sum(e['committed'] for e in log)}")
            if not os.path.exists(synced):
                write_json(synced, {"global_step": self.trainer.global_step})
        alone = bool(log) and log[-1]["committed"] and log[-1]["participants"] == 1
        if OPTIONS.get("heal_after_alone") and alone and self.trainer.global_rank == 0 and not os.path.exists(ALONE):
            write_json(ALONE, {"group": strategy.replica_group_id, "global_step": log[-1]["global_step"]})
        survivor = strategy.replica_group_id != OPTIONS.get("kill_group")  # a restarted ft_diloco group ends alone
        if OPTIONS.get("alone_sleep") and survivor and log and log[-1]["participants"] == 1:
            time.sleep(OPTIONS["alone_sleep"])
        if OPTIONS.get("wait_for_restart") and survivor and alone and not os.path.exists(RESTARTED):
            wait_for_file(RESTARTED)
        return loss_fn(self.net, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return inner_optimizer(OPTIONS.get("inner", "adam"), self.parameters())

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.global_step == OPTIONS.get("save_at_step") and not RESUMING:
            self.trainer.save_checkpoint(CHECKPOINT)

    def on_train_start(self) -> None:
        strategy = self.trainer.strategy
        restarted = os.path.exists(os.path.join(OUT, "killed")) and strategy.replica_group_id == OPTIONS.get(
            "kill_group"
        )
        if restarted and self.trainer.global_rank == 0:
            write_json(RESTARTED, {"group": strategy.replica_group_id})  # set up, about to train
        launcher = self.trainer.strategy.launcher
        lighthouse = getattr(getattr(launcher, "lighthouse", None), "proc", None)
        if lighthouse is not None:
            write_json(os.path.join(OUT, "lighthouse.json"), {"pid": lighthouse.pid})


def wait_for_file(path: str) -> None:
    """Wait for a file another group writes (bounded: a missing file fails the test's assertions)."""
    deadline = time.monotonic() + ALONE_WAIT_SECONDS
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_until_the_survivor_committed_alone() -> None:
    """A restarted group (its kill marker exists at start-up) waits for the survivor's first step alone.

    Without it the outcome depends on the machine: a restart that is back within the survivor's
    stall of about ``timeout`` joins the first quorum after the failure, and no step runs with one
    group. Waiting on the survivor's file makes the drop happen on every run; the wait ends after
    ``ALONE_WAIT_SECONDS`` all the same, so a survivor that never steps alone fails the test's
    assertions on its commit log rather than its timeout.
    """
    deadline = time.monotonic() + ALONE_WAIT_SECONDS
    while not os.path.exists(ALONE):
        if time.monotonic() > deadline:
            print(f"ft_fit: no step committed alone within {ALONE_WAIT_SECONDS:g}s ({ALONE} missing); "
                  "joining anyway", file=sys.stderr, flush=True)  # fmt: skip
            return
        time.sleep(0.05)  # polls the file the survivor writes, it does not guess a delay


def fit(ckpt_path: str | None = None, suffix: str = "") -> None:
    """One fit in every group; each rank writes ``group{g}_rank{r}{suffix}.json``."""
    group = int(os.environ.get("PHALANX_FT_REPLICA_GROUP", "0"))  # unset in the top process: group 0
    torch.manual_seed(SEED + group if OPTIONS.get("seed_by_group") else SEED)
    model = Net()
    kwargs = {
        k: OPTIONS[k]
        for k in ("replica_groups", "min_replicas", "quorum_timeout", "lighthouse", "max_restarts")
        if k in OPTIONS
    }
    if OPTIONS.get("wrap_linear"):  # ft_hsdp: every Linear its own FSDP2 unit
        kwargs["auto_wrap_policy"] = [torch.nn.Linear]
    strategy_class: type[FTDDPStrategy] = FTHSDPStrategy if OPTIONS.get("hsdp") else FTDDPStrategy
    if "diloco" in OPTIONS:
        strategy_class = FTDiLoCoStrategy
        kwargs.update(OPTIONS["diloco"])
    strategy = strategy_class(timeout=OPTIONS.get("timeout", 3.0), **kwargs)
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=OPTIONS.get("devices", 1), strategy=strategy, max_epochs=EPOCHS,
        enable_progress_bar=False, logger=False, enable_checkpointing=False, default_root_dir=OUT,
        accumulate_grad_batches=OPTIONS.get("accumulate", 1), gradient_clip_val=OPTIONS.get("clip"),
    )  # fmt: skip
    started = time.time()
    trainer.fit(model, DataLoader(dataset(), batch_size=BATCH_SIZE, shuffle=True), ckpt_path=ckpt_path)
    name = f"group{strategy.replica_group_id}_rank{trainer.global_rank}{suffix}"
    params = dict(model.named_parameters())
    sharded = {k: list(v.to_local().shape) for k, v in params.items() if isinstance(v, DTensor)}
    state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
    launcher = strategy.launcher
    write_json(
        os.path.join(OUT, f"{name}.json"),
        {
            "state": {k: v.flatten().tolist() for k, v in state.items()},
            "sharded": sharded,
            "commit_log": strategy.commit_log,
            "heal_log": strategy.heal_log,
            "fragments": getattr(strategy, "fragments", None),
            "global_step": trainer.global_step,
            "pid": os.getpid(),
            "fit_seconds": time.time() - started,
            "events": list(getattr(launcher, "events", [])),
            "restarted": os.path.exists(os.path.join(OUT, "killed")),
        },
    )


if __name__ == "__main__":
    if OPTIONS.get("heal_after_alone") and os.path.exists(os.path.join(OUT, "killed")):
        wait_until_the_survivor_committed_alone()
    fit()
    if OPTIONS.get("resume"):
        RESUMING = True
        fit(ckpt_path=CHECKPOINT, suffix="_resumed")
