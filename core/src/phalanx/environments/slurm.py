"""SLURM: ``srun`` started one task per process and published ranks in ``SLURM_*`` variables.

phalanx launches nothing under SLURM (``srun`` already started ``--ntasks-per-node`` tasks on each
node). The rendezvous host is the first node of ``SLURM_NODELIST`` and the port is derived from the
job id, so that every task of a job computes the same address without talking to the others.
"""

from __future__ import annotations

import os
import re
import signal

from phalanx.environments.launched import LaunchedEnvironment
from phalanx.environments.local import parse_int_env
from phalanx.errors import MisconfigurationError

__all__ = ["SLURMEnvironment"]

#: Job names SLURM gives interactive allocations (``srun --pty bash``, ``salloc``): not a training job.
_INTERACTIVE_JOB_NAMES = ("bash", "interactive")
_BRACKET = re.compile(r"\[([^\]]*)\]")


class SLURMEnvironment(LaunchedEnvironment):
    """Ranks and rendezvous as ``srun`` assigned them; phalanx's setters are ignored.

    Args:
        auto_requeue: After a preempted ``fit`` wrote its checkpoint (see
            :mod:`phalanx.trainer.preemption`), rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` so
            SLURM starts the job again; a script passing ``fit(ckpt_path="last")`` then continues.
        requeue_signal: The warning signal that ``sbatch --signal=USR1@90`` sends; it is handled
            like SIGTERM (checkpoint, exit 143) while ``fit`` runs.
    """

    launcher_name = "SLURM"
    world_size_variable = "SLURM_NTASKS"
    global_rank_variable = "SLURM_PROCID"
    local_rank_variable = "SLURM_LOCALID"
    node_rank_variable = "SLURM_NODEID"

    def __init__(self, *, auto_requeue: bool = False, requeue_signal: int = signal.SIGUSR1) -> None:
        if not isinstance(auto_requeue, bool):
            msg = f"SLURMEnvironment(auto_requeue={auto_requeue!r}) expects True or False. Fix: pass auto_requeue=True."
            raise MisconfigurationError(msg)
        valid = {int(s) for s in signal.Signals} - {int(signal.SIGKILL), int(signal.SIGSTOP)}
        if isinstance(requeue_signal, bool) or not isinstance(requeue_signal, int) or int(requeue_signal) not in valid:
            msg = (
                f"SLURMEnvironment(requeue_signal={requeue_signal!r}) is not a catchable signal; choices include "
                "signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM. Fix: pass requeue_signal=signal.SIGUSR1 and submit "
                "with `sbatch --signal=USR1@90`."
            )
            raise MisconfigurationError(msg)
        self.auto_requeue = auto_requeue
        self.requeue_signal = signal.Signals(requeue_signal)

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR`` when the user set it, else the first host of ``SLURM_NODELIST``."""
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        nodelist = os.environ.get("SLURM_NODELIST", os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1"))
        return self.resolve_root_node_address(nodelist)

    @property
    def main_port(self) -> int:
        """``MASTER_PORT`` when set, else 15000 + the job id's last four digits (same on every task)."""
        if "MASTER_PORT" in os.environ:
            return parse_int_env("MASTER_PORT", os.environ["MASTER_PORT"])
        job_id = os.environ.get("SLURM_JOB_ID", "")
        digits = "".join(ch for ch in job_id if ch.isdigit())
        return 15000 + int(digits[-4:]) if digits else 12910

    @classmethod
    def detect(cls) -> bool:
        """True inside an ``srun`` step of a batch job (not an interactive ``srun --pty bash`` shell)."""
        return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in _INTERACTIVE_JOB_NAMES

    @staticmethod
    def resolve_root_node_address(nodes: str) -> str:
        """First host of a SLURM node list.

        Handles space- or comma-separated lists and bracket ranges, keeping zero padding:
        ``"node[07-09,12],gpu1"`` -> ``"node07"``; ``"r[1-2]n[3,5]"`` -> ``"r1n3"``.
        """
        nodes = nodes.strip()
        first, depth = [], 0
        for ch in nodes:
            if ch == "[":
                depth += 1
            elif ch == "]":
                depth -= 1
            elif depth == 0 and ch in ", ":
                break
            first.append(ch)
        return _BRACKET.sub(lambda m: re.split(r"[,-]", m.group(1))[0], "".join(first))

    def node_rank(self) -> int:
        return self._read(self.node_rank_variable)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail early when the Trainer's process count differs from the tasks SLURM allocated."""
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        if per_node.isdigit() and int(per_node) != num_devices:
            msg = (
                f"Trainer(devices={num_devices}) does not match SLURM's --ntasks-per-node={per_node}; "
                f"each task is one process. Fix: pass devices={per_node}, or submit the job with "
                f"--ntasks-per-node={num_devices}."
            )
            raise MisconfigurationError(msg)
        nnodes = os.environ.get("SLURM_NNODES", os.environ.get("SLURM_JOB_NUM_NODES"))
        if nnodes is not None and nnodes.isdigit() and int(nnodes) != num_nodes:
            msg = (
                f"Trainer(num_nodes={num_nodes}) does not match SLURM's --nodes={nnodes}. "
                f"Fix: pass num_nodes={nnodes}, or submit the job with --nodes={num_nodes}."
            )
            raise MisconfigurationError(msg)
        ntasks = self.world_size()
        if ntasks != num_devices * num_nodes:
            msg = (
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) asks for "
                f"{num_devices * num_nodes} processes, but SLURM started SLURM_NTASKS={ntasks}. "
                f"Fix: submit with --nodes={num_nodes} --ntasks-per-node={num_devices}, or set "
                "devices and num_nodes to match the allocation."
            )
            raise MisconfigurationError(msg)
