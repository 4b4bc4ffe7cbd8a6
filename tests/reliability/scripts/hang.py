"""Hangs users make, as 2-rank jobs: the watchdog's report, SIGTERM during a hang, checked collectives.

Usage: ``python hang.py CASE STRATEGY OUT [HANG_REPORT_AFTER]``:

- ``rank0_forward``: a callback runs a forward pass (fsdp: the sharded model all-gathers its
  weights) or an ``all_gather`` (ddp) inside ``if trainer.is_global_zero:`` at the end of
  validation; rank 1 goes on alone. The job hangs; the watchdog reports; the test sends SIGTERM.
- ``silent_forward`` (fsdp): a callback runs a forward pass on rank 0 only at the end of the
  first validation. Its all-gathers pair with the same-shaped all-gathers of rank 1's next
  training forward, so the callback returns; the job hangs a step later, with the callback on no
  stack. Rank 0 writes ``OUT/returned`` once the callback has returned.
- ``mismatch``: rank 0 reduces a tensor through the strategy while rank 1 broadcasts an object
  (run with ``PHALANX_DISTRIBUTED_DEBUG=1``: both ranks raise at once, naming both call sites).
- ``one_rank_stop``: a hand-written callback sets ``trainer.should_stop`` on rank 1 only, after
  step 3 (``on_train_batch_end``); ``one_rank_stop_epoch`` does it at the first epoch's end. Each
  rank writes the step it stopped at to ``OUT/rank<R>.json``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from rel_common import Net, eval_loader, train_loader, trainer_kwargs, write_json

from phalanx import Callback, Trainer


class SampleOutputs(Callback):
    """Log a few predictions at the end of validation, on rank 0 only: the mistake under test."""

    def __init__(self, strategy: str, out: str) -> None:
        self.strategy = strategy
        self.out = out

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        with open(os.path.join(self.out, f"validated{trainer.global_rank}"), "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
        if trainer.is_global_zero:
            sample = torch.randn(4, 8)
            # fsdp: a sharded forward all-gathers weights from every rank; ddp: a collective the other rank never joins
            predictions = pl_module(sample) if self.strategy == "fsdp" else pl_module.all_gather(sample)
            print(predictions.shape)


class SilentForward(Callback):
    """A forward pass on rank 0 only, mid-epoch: the desync that returns (see the module doc)."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            with torch.no_grad():
                pl_module(torch.randn(4, 8))  # the line the report must name
            with open(os.path.join(self.out, "returned"), "w", encoding="utf-8") as handle:
                handle.write(str(os.getpid()))


class StopOnOneRank(Callback):
    """Stop on rank 1 only: at step 3, or at the end of the first epoch."""

    def __init__(self, at_epoch_end: bool) -> None:
        self.at_epoch_end = at_epoch_end

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.at_epoch_end and trainer.global_rank == 1 and trainer.global_step == 3:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.at_epoch_end and trainer.global_rank == 1:
            trainer.should_stop = True


class Mismatch(Callback):
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == 2:
            if trainer.global_rank == 0:
                trainer.strategy.reduce(torch.ones(3))
            else:
                trainer.strategy.broadcast({"step": trainer.global_step})


def main() -> None:
    case, strategy, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    model = Net()
    if case == "rank0_forward":
        kwargs = trainer_kwargs(strategy, out, max_epochs=2, callbacks=[SampleOutputs(strategy, out)])
        if len(sys.argv) > 4:  # the Trainer's default (60 s) otherwise
            kwargs["hang_report_after"] = float(sys.argv[4])
        Trainer(**kwargs).fit(model, train_loader(), eval_loader(1))
    elif case == "silent_forward":
        kwargs = trainer_kwargs(strategy, out, max_epochs=2, callbacks=[SilentForward(out)])
        if len(sys.argv) > 4:  # the Trainer's default (50 s) otherwise
            kwargs["hang_report_after"] = float(sys.argv[4])
        Trainer(**kwargs).fit(model, train_loader(), eval_loader(1))
    elif case == "mismatch":
        Trainer(**trainer_kwargs(strategy, out, callbacks=[Mismatch()])).fit(model, train_loader())
    elif case in ("one_rank_stop", "one_rank_stop_epoch"):
        callback = StopOnOneRank(at_epoch_end=case == "one_rank_stop_epoch")
        trainer = Trainer(**trainer_kwargs(strategy, out, max_epochs=3, callbacks=[callback]))
        trainer.fit(model, train_loader())
        write_json(
            os.path.join(out, f"rank{trainer.global_rank}.json"),
            {"global_step": trainer.global_step, "epoch": trainer.current_epoch, "should_stop": trainer.should_stop},
        )
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main()
