"""Preemption: a SIGTERM (or SLURM's warning signal) becomes a checkpoint and a clean exit.

Schedulers announce the end of a job with a signal: SIGTERM (Kubernetes, torchrun, SLURM at the
time limit) and, with ``sbatch --signal=USR1@90``, SIGUSR1 some seconds before. The signal may
reach only one process (the launcher, or one rank). Its handler only sets a flag; at each
optimizer-step boundary every rank agrees through one small all-reduce whether any rank got a
signal, so all ranks stop after the *same* step, write one checkpoint together
(``<checkpoint dir>/preempted.ckpt``, which ``fit(ckpt_path="last")`` picks as the newest), tear
down and exit with code 143 (128 + SIGTERM). Under ``SLURMEnvironment(auto_requeue=True)`` rank
0 first runs ``scontrol requeue $SLURM_JOB_ID``.

The signal set, the exit code and ``scontrol requeue`` are :mod:`phalanx.environments.preemption`'s
(shared with the launcher that forwards signals to its workers). Configuration (environment
variables, read when ``fit`` starts):

- ``PHALANX_PREEMPTION_SIGNALS``: comma-separated signal names, default ``SIGTERM`` (plus the
  SLURM environment's ``requeue_signal``, SIGUSR1 by default, when running under SLURM); ``none``
  turns preemption handling off.
- ``PHALANX_PREEMPTION_CHECK_EVERY``: agree every N optimizer steps (default 1). Larger values
  save the per-step all-reduce at the price of up to N-1 more steps before stopping.

The agreement does not make a step wait: each check starts an asynchronous all-reduce and reads
the previous check's, so the ranks stop together one check after the signal arrived. The same
all-reduce carries ``trainer.should_stop``, so a stop set on one rank stops every rank after the
same step instead of leaving the others hung (:meth:`Preemption.at_step_boundary`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from phalanx.environments.preemption import EXIT_CODE, PREEMPTED_NAME, check_every, preemption_signals, requeue
from phalanx.environments.slurm import SLURMEnvironment
from phalanx.errors import SIGTERMException
from phalanx.trainer.checkpointing import checkpoint_dir

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["Preemption"]


class Preemption:
    """The fit loop's preemption state: the signal flag, the agreement, the checkpoint, the exit."""

    def __init__(self) -> None:
        self.requested: int | None = None  # the signal number this process received
        self.preempted = False
        self.checkpoint_path: str | None = None
        self._every = 1
        self._last_checked = -1
        self._active = False  # signals are caught (fit runs, preemption not turned off)
        self._pending: Any = None  # (async all-reduce work, its tensor) started at the previous check
        self._distributed = False  # more than one process must agree (read once, when armed)

    # ------------------------------------------------------------------ signals
    @staticmethod
    def _slurm(run: Run) -> SLURMEnvironment | None:
        environment = getattr(run.strategy, "cluster_environment", None)
        return environment if isinstance(environment, SLURMEnvironment) else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.requested = signum

    @contextlib.contextmanager
    def armed(self, run: Run) -> Iterator[None]:
        """Catch the preemption signals while ``fit`` trains (main thread only; restored after)."""
        self._every = check_every()
        self._last_checked = -1
        self.requested, self.preempted, self.checkpoint_path = None, False, None
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in preemption_signals(self._slurm(run)):
                previous[signum] = signal.signal(signum, self._handle)
        # The watchdog sees the signals too, at once: a rank stuck in a collective never runs the
        # handler above, so the watchdog ends a hung job that was told to stop (watchdog.py).
        watching = run.watchdog.catching(list(previous)) if run.watchdog is not None else contextlib.nullcontext()
        # The same on every rank (same environment, fit from the main thread), so the collective
        # in should_stop is either run by all ranks or by none.
        self._active = bool(previous)
        self._distributed = run.strategy.world_size > 1
        self._pending = None
        try:
            with watching:
                yield
            self.drain()
        finally:
            self._pending = None  # after a failure, a peer may never join the last check: drop it
            self._active = False
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # ------------------------------------------------------------------ the per-step check
    def at_step_boundary(self, run: Run, global_step: int) -> str | None:
        """After a batch: ``"preempted"`` (checkpoint written), ``"stop"`` (all ranks stop), or None.

        Collective in a distributed run (every rank calls it after the same batches). Two things
        are agreed here, in one small all-reduce: whether any rank got a preemption signal, and
        whether any rank set ``trainer.should_stop`` -- a stop decided on one rank only (a
        hand-written early-stopping callback) would otherwise leave the others waiting in the next
        step's collectives forever. All ranks stop after the same step. Between optimizer steps
        (inside an accumulation window) and off the ``check every`` grid it costs one comparison.
        """
        if global_step == self._last_checked or global_step % self._every:
            return None if self._distributed or not run.should_stop else "stop"
        self._last_checked = global_step
        if not self._distributed:  # written out here: this runs every step of a single-process fit
            if self._active and self.requested is not None:
                return self._preempt(run)
            return "stop" if run.should_stop else None
        signal_now, stop_now = self._agree(run.strategy, self.requested is not None, run.should_stop)
        if signal_now and self._active:
            return self._preempt(run)
        if stop_now:
            run.should_stop = True
            return "stop"
        return None

    def _preempt(self, run: Run) -> str:
        self.preempted = True
        self.checkpoint_path = os.path.join(checkpoint_dir(run.trainer), PREEMPTED_NAME)
        run.trainer.save_checkpoint(self.checkpoint_path)
        run.should_stop = True
        return "preempted"

    def agree_at_epoch_end(self, run: Run) -> None:
        """After an epoch: any rank's ``trainer.should_stop`` (set in an epoch-end hook) stops every rank.

        One blocking agreement per epoch, so ``fit`` ends on every rank or on none.
        """
        if self._distributed:
            run.should_stop = bool(run.strategy.reduce_boolean_decision(run.should_stop, all=False))

    def _agree(self, strategy: Any, signalled: bool, stop: bool) -> tuple[bool, bool]:
        """Whether any rank got a signal / wants to stop, without making every step wait for the others.

        With a torch.distributed group, each check starts an asynchronous all-reduce of this rank's
        two flags and reads the one the previous check started, which finished during the step in
        between: every rank reads the same sums after the same step, so all stop together, one
        check after the signal. A blocking all-reduce per step costs a full round trip (about 0.5 ms
        on gloo), as much as a small model's whole step. A rank that wants to stop waits for the
        current check at once: when every rank wants to (an agreed decision, such as
        EarlyStopping's), all of them see it now and stop after this step, as in one process.
        Without such a group (XLA) it is the strategy's blocking ``reduce_boolean_decision``.
        """
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return (
                bool(strategy.reduce_boolean_decision(signalled, all=False)),
                bool(strategy.reduce_boolean_decision(stop, all=False)),
            )
        tensor = torch.tensor([int(signalled), int(stop)], device=strategy.root_device)
        work = dist.all_reduce(tensor, async_op=True)
        previous, self._pending = self._pending, (work, tensor)
        signalled_before = stop_before = False
        if previous is not None:
            previous[0].wait()
            signalled_before, stop_before = bool(previous[1][0].item() > 0), bool(previous[1][1].item() > 0)
        if stop:
            work.wait()
            if int(tensor[1].item()) == strategy.world_size:  # every rank wants to stop (so every rank waited): now
                return signalled_before or bool(tensor[0].item() > 0), True
        return signalled_before, stop_before

    def drain(self) -> None:
        """Wait for the last check's all-reduce (every rank started it), so none is left in flight."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].wait()

    # ------------------------------------------------------------------ after teardown
    def exit_if_preempted(self, run: Run) -> None:
        """End the process with 143 after a preempted fit (requeueing first under SLURM when asked).

        Raises:
            SIGTERMException: Always, when this fit was preempted (a ``SystemExit`` with code 143).
        """
        if not self.preempted:
            return
        trainer = run.trainer
        environment = self._slurm(run)
        if trainer.is_global_zero and environment is not None and environment.auto_requeue:
            requeue()
        sys.stderr.write(
            f"[phalanx] rank {trainer.global_rank}: preempted at step {trainer.global_step}; checkpoint "
            f"{self.checkpoint_path}; exiting with {EXIT_CODE}.\n"
        )
        sys.stderr.flush()
        raise SIGTERMException(EXIT_CODE)
