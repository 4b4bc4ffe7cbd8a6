"""Preemption: a SIGTERM (or SLURM's warning signal) becomes a checkpoint and a clean exit.

Schedulers announce the end of a job with a signal: SIGTERM (Kubernetes, torchrun, SLURM at the
time limit) and, with ``sbatch --signal=USR1@90``, SIGUSR1 some seconds before. The signal may
reach only one process (the launcher, or one rank). Its handler only sets a flag; at each
optimizer-step boundary every rank agrees through one small all-reduce whether any rank got a
signal, so all ranks stop after the *same* step, write one checkpoint together
(``<checkpoint dir>/preempted.ckpt``, which ``fit(ckpt_path="last")`` picks as the newest), tear
down and exit with code 143 (128 + SIGTERM). Under ``SLURMEnvironment(auto_requeue=True)`` rank
0 first runs ``scontrol requeue $SLURM_JOB_ID``.

Configuration (environment variables, read when ``fit`` starts):

- ``PHALANX_PREEMPTION_SIGNALS``: comma-separated signal names, default ``SIGTERM`` (plus the
  SLURM environment's ``requeue_signal``, SIGUSR1 by default, when running under SLURM); ``none``
  turns preemption handling off.
- ``PHALANX_PREEMPTION_CHECK_EVERY``: agree every N optimizer steps (default 1). Larger values
  save the per-step all-reduce at the price of up to N-1 more steps before stopping.

The agreement does not make a step wait: each check starts an asynchronous all-reduce and reads
the previous check's, so the ranks stop together one check after the signal arrived.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.environments.slurm import SLURMEnvironment
    from phalanx.trainer.trainer import Trainer

__all__ = ["EXIT_CODE", "PREEMPTED_NAME", "Preemption", "parse_signals"]

#: The exit code of a preempted run: what a process killed by SIGTERM reports to its shell.
EXIT_CODE = 143
PREEMPTED_NAME = "preempted.ckpt"
SIGNALS_ENV = "PHALANX_PREEMPTION_SIGNALS"
CHECK_EVERY_ENV = "PHALANX_PREEMPTION_CHECK_EVERY"


def parse_signals(text: str) -> list[signal.Signals]:
    """``"SIGTERM,USR1"`` -> signals; ``"none"`` -> [].

    Raises:
        MisconfigurationError: An unknown signal name.
    """
    if text.strip().lower() in ("", "none", "0", "off"):
        return []
    found = []
    for raw in text.split(","):
        name = raw.strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if not hasattr(signal.Signals, name) or name in ("SIGKILL", "SIGSTOP"):
            choices = "SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP"
            msg = (
                f"{SIGNALS_ENV}={text!r}: {raw.strip()!r} is not a signal that can be caught; choices include "
                f"{choices}. Fix: set e.g. {SIGNALS_ENV}=SIGTERM,SIGUSR1, or 'none' to turn preemption off."
            )
            raise MisconfigurationError(msg)
        found.append(signal.Signals[name])
    return found


def _check_every() -> int:
    raw = os.environ.get(CHECK_EVERY_ENV, "1")
    if not raw.isdigit() or int(raw) < 1:
        msg = f"{CHECK_EVERY_ENV}={raw!r} is invalid: expected an int >= 1. Fix: set {CHECK_EVERY_ENV}=1."
        raise MisconfigurationError(msg)
    return int(raw)


class Preemption:
    """The fit loop's preemption state: the signal flag, the agreement, the checkpoint, the exit."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.requested: int | None = None  # the signal number this process received
        self.preempted = False
        self.checkpoint_path: str | None = None
        self._every = 1
        self._last_checked = -1
        self._active = False  # signals are caught (fit runs, preemption not turned off)
        self._pending: Any = None  # (async all-reduce work, its tensor) started at the previous check
        self._distributed = False  # more than one process must agree (read once, when armed)

    # ------------------------------------------------------------------ signals
    def _signals(self) -> list[signal.Signals]:
        signals = parse_signals(os.environ.get(SIGNALS_ENV, "SIGTERM"))
        environment = self._slurm()
        if signals and environment is not None and environment.requeue_signal not in signals:
            signals.append(environment.requeue_signal)
        return signals

    def _slurm(self) -> SLURMEnvironment | None:
        from phalanx.environments.slurm import SLURMEnvironment
        from phalanx.strategies import ParallelStrategy

        strategy = self.trainer.strategy
        if isinstance(strategy, ParallelStrategy) and isinstance(strategy.cluster_environment, SLURMEnvironment):
            return strategy.cluster_environment
        return None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.requested = signum

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Catch the preemption signals while ``fit`` trains (main thread only; restored after)."""
        self._every = _check_every()
        self._last_checked = -1
        self.requested, self.preempted, self.checkpoint_path = None, False, None
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals():
                previous[signum] = signal.signal(signum, self._handle)
        # The same on every rank (same environment, fit from the main thread), so the collective
        # in should_stop is either run by all ranks or by none.
        self._active = bool(previous)
        self._distributed = self.trainer.strategy.world_size > 1
        self._pending = None
        try:
            yield
            self.drain()
        finally:
            self._pending = None  # after a failure, a peer may never join the last check: drop it
            self._active = False
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # ------------------------------------------------------------------ the per-step check
    def should_stop(self, global_step: int) -> bool:
        """At an optimizer-step boundary: did any rank get a signal? If so, checkpoint and stop.

        Collective (every rank calls it after the same steps); between optimizer steps (inside an
        accumulation window) and off the ``check every`` grid it costs one integer comparison.
        """
        if not self._active or global_step == self._last_checked or global_step % self._every:
            return False
        self._last_checked = global_step
        trainer = self.trainer
        stop = self._agree(trainer.strategy) if self._distributed else self.requested is not None
        if not stop:
            return False
        self.preempted = True
        self.checkpoint_path = str(self._directory() / PREEMPTED_NAME)
        trainer.save_checkpoint(self.checkpoint_path)
        trainer.should_stop = True
        return True

    def _agree(self, strategy: Any) -> bool:
        """Whether any rank got a signal, without making this step wait for the others.

        With a torch.distributed group, each check starts an asynchronous all-reduce of this rank's
        flag and reads the one the previous check started, which finished during the step in
        between: every rank reads the same sum after the same step, so all stop together, one check
        after the signal. A blocking all-reduce per step costs a full round trip (about 0.5 ms on
        gloo), as much as a small model's whole step. Without such a group (XLA) it is the
        strategy's blocking ``reduce_boolean_decision``.
        """
        import torch
        import torch.distributed as dist

        flag = self.requested is not None
        if not (dist.is_available() and dist.is_initialized()):
            return bool(strategy.reduce_boolean_decision(flag, all=False))
        tensor = torch.tensor([int(flag)], device=strategy.root_device)
        work = dist.all_reduce(tensor, async_op=True)
        previous, self._pending = self._pending, (work, tensor)
        if previous is None:
            return False
        previous[0].wait()
        return bool(previous[1].item() > 0)

    def drain(self) -> None:
        """Wait for the last check's all-reduce (every rank started it), so none is left in flight."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].wait()

    def _directory(self) -> Path:
        for callback in self.trainer.checkpoint_callbacks:
            if callback.dirpath:
                return Path(callback.dirpath)
        return Path(self.trainer.default_root_dir) / "checkpoints"

    # ------------------------------------------------------------------ after teardown
    def exit_if_preempted(self) -> None:
        """End the process with 143 after a preempted fit (requeueing first under SLURM when asked).

        Raises:
            SystemExit: Always, when this fit was preempted.
        """
        if not self.preempted:
            return
        trainer = self.trainer
        environment = self._slurm()
        if trainer.is_global_zero and environment is not None and environment.auto_requeue:
            _requeue()
        sys.stderr.write(
            f"[phalanx] rank {trainer.global_rank}: preempted at step {trainer.global_step}; checkpoint "
            f"{self.checkpoint_path}; exiting with {EXIT_CODE}.\n"
        )
        sys.stderr.flush()
        raise SystemExit(EXIT_CODE)


def _requeue() -> None:
    """``scontrol requeue $SLURM_JOB_ID``: SLURM starts the job again, which resumes from "last"."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{job}_{task}" if job and task else os.environ.get("SLURM_JOB_ID")
    if not job_id:
        sys.stderr.write("[phalanx] auto_requeue: SLURM_JOB_ID is not set; not requeueing.\n")
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        sys.stderr.write(f"[phalanx] auto_requeue: `scontrol requeue {job_id}` failed: {error}\n")
        return
    outcome = (
        "requeued"
        if result.returncode == 0
        else f"`scontrol requeue` exited {result.returncode}: {result.stderr.strip()}"
    )
    sys.stderr.write(f"[phalanx] auto_requeue: job {job_id} {outcome}\n")
