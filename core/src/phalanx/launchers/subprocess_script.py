"""Launch by re-running the user's script once per extra local rank (``strategy="ddp"``).

Every rank runs the same command the user typed, with ``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE``, ``NODE_RANK`` and ``LOCAL_RANK`` set; this process becomes local rank 0. Nothing is
pickled, every process has the full, up-to-date Trainer state, and the same command scales to many
machines. The price: it needs a script to re-run, so it does not work in notebooks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.errors import MisconfigurationError
from phalanx.launchers._process import (
    GRACE_SECONDS,
    exit_code_of,
    install_rank_excepthook,
    set_parent_death_signal,
    stop_processes,
    tag_exception,
)
from phalanx.launchers._warm_ranks import WarmRank, start_warm_rank
from phalanx.launchers.launcher import Launcher

__all__ = ["SubprocessScriptLauncher", "script_command"]

_POLL_SECONDS = 0.1
#: Set in a process that started children with this launcher (it must outlive them).
_launched_here = threading.Event()
#: How long a failing rank 0 waits to learn whether a child failed first (then rank 0's error is
#: only a consequence, and the child's traceback is the one that matters).
_CAUSE_WINDOW_SECONDS = 0.5


def script_command() -> list[str]:
    """The command that re-runs this program: ``python script.py args`` or ``python -m module args``.

    Raises:
        MisconfigurationError: There is no script (``python -c``, a REPL, a notebook).
    """
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name:
        return [sys.executable, "-m", spec.name, *sys.argv[1:]]
    main_file = getattr(__main__, "__file__", None)
    if not main_file or not sys.argv or sys.argv[0] in ("", "-c"):
        msg = (
            f"strategy='ddp' starts its other ranks by re-running your script, but this program has "
            f"no script to re-run (sys.argv[0]={sys.argv[0] if sys.argv else ''!r}: an interactive "
            "session, a notebook or `python -c`). Fix: put the code in a file and run it with python, "
            "or use strategy='ddp_notebook' (fork) or 'ddp_spawn'."
        )
        raise MisconfigurationError(msg)
    return [sys.executable, os.path.abspath(main_file), *sys.argv[1:]]


class _Child:
    """A :class:`~phalanx.launchers._process.ProcessHandle` over ``subprocess.Popen``."""

    def __init__(self, proc: subprocess.Popen[bytes] | WarmRank, local_rank: int, global_rank: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.local_rank = local_rank
        self.global_rank = global_rank

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass


class SubprocessScriptLauncher(Launcher):
    """Re-run the user's command for local ranks ``1..num_processes-1``; run ``function`` as rank 0.

    When the cluster environment already created the processes (a re-run child, torchrun, SLURM),
    it starts nothing and only runs ``function``.

    The parent watches its children from a thread: if one exits non-zero, the whole local job
    (children and this process) is stopped within about a second, and this process exits with the
    child's code. If rank 0 raises, the children are stopped before the error propagates.

    Args:
        cluster_environment: Source of the rendezvous address/port and of this process's ranks.
        num_processes: Processes per node (local ranks).
        num_nodes: Number of nodes in the job.
    """

    def __init__(self, cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int) -> None:
        self.cluster_environment = cluster_environment
        self.num_processes = num_processes
        self.num_nodes = num_nodes
        self.procs: list[subprocess.Popen[bytes] | WarmRank] = []
        self._children: list[_Child] = []
        self._observer: _ChildObserver | None = None

    @property
    def is_interactive_compatible(self) -> bool:
        return False

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        """Start the other local ranks (unless they exist already), then run ``function`` here."""
        del trainer  # every rank holds its own Trainer; nothing to bring back
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
        rank = self._global_rank()
        distributed = self.num_processes * self.num_nodes > 1
        if distributed:
            # A launching parent waits for its children's verdict in _on_rank_zero_failure instead.
            install_rank_excepthook(fast_exit=True, delay=not _launched_here.is_set())
        try:
            return function(*args, **kwargs)
        except BaseException as exc:
            if distributed:
                tag_exception(exc, rank)
            if self._children:
                self._on_rank_zero_failure()
            raise

    def kill(self, signum: int) -> None:
        for child in self._children:
            if child.alive():
                try:
                    os.kill(child.pid, signum)
                except ProcessLookupError:
                    pass

    def _global_rank(self) -> int:
        env = self.cluster_environment
        return env.node_rank() * self.num_processes + env.local_rank()

    def _call_children_scripts(self) -> None:
        if self._children:
            msg = "SubprocessScriptLauncher already started its processes; it launches once per Trainer run."
            raise RuntimeError(msg)
        env = self.cluster_environment
        if env.local_rank() != 0:
            msg = (
                f"phalanx was asked to start ranks from a process with LOCAL_RANK={env.local_rank()}; only "
                "local rank 0 may launch. Fix: unset LOCAL_RANK, or use a cluster environment whose "
                "creates_processes_externally is True when something else starts the processes."
            )
            raise RuntimeError(msg)
        command = script_command()
        # Exported in this process too: a second Trainer run in this script then sees LOCAL_RANK and
        # does not start a second set of children (they re-run the script and do that run themselves).
        os.environ["MASTER_ADDR"] = env.main_address
        os.environ["MASTER_PORT"] = str(env.main_port)
        os.environ["NODE_RANK"] = str(env.node_rank())
        os.environ["LOCAL_RANK"] = "0"
        os.environ["WORLD_SIZE"] = str(self.num_processes * self.num_nodes)
        parent_pid = os.getpid()

        def preexec() -> None:  # runs in the child between fork and exec
            set_parent_death_signal()
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)

        base_rank = env.node_rank() * self.num_processes
        for local_rank in range(1, self.num_processes):
            child_env = {**os.environ, "LOCAL_RANK": str(local_rank)}
            proc = start_warm_rank(command, child_env, os.getcwd()) or subprocess.Popen(
                command, env=child_env, cwd=os.getcwd(), preexec_fn=preexec
            )
            self.procs.append(proc)
            self._children.append(_Child(proc, local_rank, base_rank + local_rank))
        _launched_here.set()
        self._observer = _ChildObserver(self._children)
        self._observer.start()

    def _on_rank_zero_failure(self) -> None:
        """Rank 0 raised: if a child failed first, let the observer end the job; else stop the children."""
        observer = self._observer
        assert observer is not None
        deadline = time.monotonic() + _CAUSE_WINDOW_SECONDS
        while time.monotonic() < deadline:
            if observer.failed.is_set() or any(c.proc.poll() not in (None, 0) for c in self._children):
                observer.failed.wait(1.0)  # the observer prints, stops everyone, exits this process
                observer.exited.wait()
            time.sleep(0.02)
        observer.stop()
        stop_processes(self._children)

    def __getstate__(self) -> dict[str, Any]:
        """Drop process handles and the thread: they cannot (and need not) travel to another process."""
        state = self.__dict__.copy()
        state.update(procs=[], _children=[], _observer=None)
        return state


class _ChildObserver(threading.Thread):
    """Poll the children; when one fails, stop the job and end this process with its exit code.

    Not a daemon: the interpreter waits for it at exit, so the parent (whose death kills the
    children through their parent-death signal) stays alive until every child has finished.
    """

    def __init__(self, children: Sequence[_Child]) -> None:
        super().__init__(name="phalanx-child-observer", daemon=False)
        self._children = list(children)
        self._stopping = threading.Event()
        self.failed = threading.Event()
        self.exited = threading.Event()

    def stop(self) -> None:
        """Stop watching: the caller is stopping the children deliberately."""
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            codes = [c.proc.poll() for c in self._children]
            failed = next((c for c, code in zip(self._children, codes) if code not in (None, 0)), None)
            if failed is not None and not self._stopping.is_set():
                self._end_job(failed)
                return
            if all(code == 0 for code in codes):
                return
            self._stopping.wait(_POLL_SECONDS)

    def _end_job(self, failed: _Child) -> None:
        self.failed.set()
        code = exit_code_of(failed.proc.returncode or 1)
        reason = "was interrupted" if code == 130 else f"exited with code {code}"
        sys.stderr.write(
            f"[phalanx] rank {failed.global_rank} (pid {failed.pid}) {reason}; stopping all ranks "
            f"(SIGTERM, then SIGKILL after {GRACE_SECONDS:g}s).\n"
        )
        sys.stderr.flush()
        stop_processes([c for c in self._children if c is not failed])
        sys.stdout.flush()
        self.exited.set()
        os._exit(code)
