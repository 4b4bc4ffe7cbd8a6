"""Preemption signals, the exit code of a preempted job, and SLURM requeueing: one copy.

Schedulers announce the end of a job with a signal: SIGTERM (Kubernetes, torchrun, SLURM at the
time limit) and, with ``sbatch --signal=USR1@90``, SIGUSR1 some seconds before. Which signals count
(``PHALANX_PREEMPTION_SIGNALS``), the exit code a preempted process ends with (143, what a process
killed by SIGTERM reports) and ``scontrol requeue`` live here, so the launcher that forwards the
signal to its workers and the fit loop that turns it into a checkpoint agree by construction.

Torch-free; the fit loop's side (the per-step agreement, the checkpoint) is
:mod:`phalanx.trainer.preemption`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.slurm import SLURMEnvironment
from phalanx.errors import MisconfigurationError

__all__ = [
    "CHECK_EVERY_ENV",
    "EXIT_CODE",
    "GRACE_ENV",
    "PREEMPTED_NAME",
    "SIGNALS_ENV",
    "check_every",
    "grace_seconds",
    "parse_signals",
    "preemption_signals",
    "requeue",
]

#: The exit code of a preempted run: what a process killed by SIGTERM reports to its shell.
EXIT_CODE = 143
PREEMPTED_NAME = "preempted.ckpt"
SIGNALS_ENV = "PHALANX_PREEMPTION_SIGNALS"
CHECK_EVERY_ENV = "PHALANX_PREEMPTION_CHECK_EVERY"
GRACE_ENV = "PHALANX_PREEMPTION_GRACE"
#: Seconds the ranks get after a preemption signal to reach the step boundary where they agree to
#: stop; past it (and with no progress for as long) the job counts as hung and exits with 143.
#: Well under the 30-120 s that SLURM and Kubernetes leave between SIGTERM and SIGKILL.
DEFAULT_GRACE = 15.0


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


def check_every() -> int:
    """``PHALANX_PREEMPTION_CHECK_EVERY``: agree every N optimizer steps (default 1).

    Raises:
        MisconfigurationError: Not an int >= 1.
    """
    raw = os.environ.get(CHECK_EVERY_ENV, "1")
    if not raw.isdigit() or int(raw) < 1:
        msg = f"{CHECK_EVERY_ENV}={raw!r} is invalid: expected an int >= 1. Fix: set {CHECK_EVERY_ENV}=1."
        raise MisconfigurationError(msg)
    return int(raw)


def grace_seconds() -> float:
    """``PHALANX_PREEMPTION_GRACE``: seconds to wait for the stop agreement after a signal (default 15).

    Raises:
        MisconfigurationError: Not a number > 0.
    """
    raw = os.environ.get(GRACE_ENV, "")
    if not raw:
        return DEFAULT_GRACE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        msg = f"{GRACE_ENV}={raw!r} is invalid: expected seconds > 0. Fix: set {GRACE_ENV}={DEFAULT_GRACE:g} (the default), or unset it."
        raise MisconfigurationError(msg)
    return value


def preemption_signals(environment: ClusterEnvironment | None) -> list[signal.Signals]:
    """The signals that mean "preempted": ``PHALANX_PREEMPTION_SIGNALS`` (default SIGTERM), plus
    the requeue signal of a SLURM environment (SIGUSR1 by default); none when turned off."""
    signals = parse_signals(os.environ.get(SIGNALS_ENV, "SIGTERM"))
    if signals and isinstance(environment, SLURMEnvironment) and environment.requeue_signal not in signals:
        signals.append(environment.requeue_signal)
    return signals


def requeue() -> None:
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
