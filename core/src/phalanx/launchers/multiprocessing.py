"""Launch by spawning or forking worker processes (``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``).

Works without a script to re-run, so fork is the way to train on several devices from a notebook.
The worker processes run the stage; this process only waits. When they finish, local rank 0's
results come back here: the trained weights, and beyond Lightning the Trainer's
``callback_metrics``, the checkpoint callbacks' best/last paths, and the stage's return value.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as std_mp
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from phalanx.environments.preemption import EXIT_CODE, SIGNALS_ENV, parse_signals
from phalanx.errors import MisconfigurationError
from phalanx.launchers import _results
from phalanx.launchers._pickling import find_unpicklable
from phalanx.launchers._process import (
    SECONDARY_FAILURE_DELAY,
    exit_code_of,
    install_rank_excepthook,
    print_rank_traceback,
    set_parent_death_signal,
    stop_processes,
    tag_exception,
)
from phalanx.launchers.launcher import Launcher

__all__ = ["START_METHODS", "MultiProcessingLauncher", "WorkerFailedError", "check_start_method"]

START_METHODS = ("spawn", "fork", "forkserver")
_POLL_SECONDS = 0.1


class WorkerFailedError(RuntimeError):
    """A worker process of a spawn/fork job failed; its traceback was printed by the worker."""


def check_start_method(
    start_method: str, *, available: tuple[str, ...] | None = None, cuda_initialized: bool | None = None
) -> None:
    """Refuse a start method this platform or this process cannot use, saying what to do instead.

    Args:
        start_method: "spawn", "fork" or "forkserver".
        available: The platform's start methods (default: ``multiprocessing.get_all_start_methods()``).
        cuda_initialized: Whether CUDA is initialised here (default: asks torch). A forked child
            cannot use a CUDA context created by its parent, and fails obscurely if it tries.
    """
    if start_method not in START_METHODS:
        msg = (
            f"start_method={start_method!r} is not a multiprocessing start method; choose one of "
            f"{', '.join(START_METHODS)} (or 'popen' in DDPStrategy to re-run the script)."
        )
        raise MisconfigurationError(msg)
    methods = tuple(std_mp.get_all_start_methods()) if available is None else available
    if start_method not in methods:
        msg = (
            f"start_method={start_method!r} is not supported on this platform (available: "
            f"{', '.join(methods)}). Fix: use strategy='ddp_spawn' (start_method='spawn') or "
            "strategy='ddp'; fork-based strategies (ddp_fork, ddp_notebook) need Linux or macOS."
        )
        raise MisconfigurationError(msg)
    if start_method == "spawn":
        return
    if cuda_initialized is None:
        import torch

        cuda_initialized = bool(torch.cuda.is_initialized())
    if cuda_initialized:
        msg = (
            f"Cannot start processes with start_method={start_method!r}: CUDA is already initialised in "
            "this process, and forked children cannot use it. Something called torch.cuda (moved a "
            "tensor or model to the GPU, queried devices) before the Trainer started. Fix: remove those "
            "calls before fit (restart the notebook kernel), or use strategy='ddp_spawn' or 'ddp'."
        )
        raise MisconfigurationError(msg)


def _check_missing_main_guard() -> None:
    """A spawned child re-imports the main module; without a main guard it would launch again."""
    if getattr(std_mp.current_process(), "_inheriting", False):
        msg = (
            "strategy='ddp_spawn' started a process that imported your script and reached "
            "Trainer.fit again: the script lacks an `if __name__ == '__main__':` guard. Fix: put the "
            "code that builds and runs the Trainer under that guard, or use strategy='ddp'."
        )
        raise RuntimeError(msg)


class _Worker:
    """A :class:`~phalanx.launchers._process.ProcessHandle` over ``multiprocessing.Process``."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.pid = int(process.pid)

    def alive(self) -> bool:
        return bool(self.process.is_alive())

    def wait(self, timeout: float) -> None:
        self.process.join(timeout)


class MultiProcessingLauncher(Launcher):
    """Start ``strategy.num_processes`` workers with torch.multiprocessing and wait for them.

    Args:
        strategy: The parallel strategy; workers read its cluster environment and ranks, and its
            module receives local rank 0's weights afterwards.
        start_method: "spawn" (fresh interpreters; everything is pickled), "fork" (copies of this
            process; works in notebooks) or "forkserver".
        preload: Modules every worker will import anyway (e.g. what DistributedDataParallel
            imports lazily); with fork they are imported once here and shared by all workers
            instead of being imported again in each.
    """

    def __init__(self, strategy: Any, start_method: str = "spawn", *, preload: tuple[str, ...] = ()) -> None:
        check_start_method(start_method, cuda_initialized=False)
        self._strategy = strategy
        self._start_method = start_method
        self._preload = tuple(preload)
        self.procs: list[Any] = []

    @property
    def strategy(self) -> Any:
        """The strategy whose ranks this launcher starts."""
        return self._strategy

    @property
    def start_method(self) -> str:
        """``"spawn"``, ``"fork"`` or ``"forkserver"``."""
        return self._start_method

    @property
    def is_interactive_compatible(self) -> bool:
        """Only fork: spawn/forkserver children must import the code, which a notebook cell is not."""
        return self._start_method == "fork"

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        """Run ``function`` in every worker; return local rank 0's result and load its state here."""
        import torch.multiprocessing as torch_mp

        check_start_method(self._start_method)
        if self._start_method == "spawn":
            _check_missing_main_guard()
        if self._start_method == "fork":
            for module in self._preload:
                importlib.import_module(module)
        env = self._strategy.cluster_environment
        results_dir = tempfile.mkdtemp(prefix="phalanx-workers-")
        results_path = os.path.join(results_dir, "rank0.pt")
        saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
        os.environ["MASTER_ADDR"] = env.main_address
        os.environ["MASTER_PORT"] = str(env.main_port)  # chosen once here so every worker agrees
        try:
            try:
                context = torch_mp.start_processes(
                    _worker_entry,
                    args=(self, function, args, kwargs, trainer, results_path),
                    nprocs=self._strategy.num_processes,
                    join=False,
                    start_method=self._start_method,
                )
            except (pickle.PicklingError, TypeError, AttributeError) as err:
                self._raise_pickling_error(err, function, args, kwargs, trainer)
                raise
            finally:
                _restore_env(saved)
            self.procs = list(context.processes)
            try:
                with self._forwarding_preemption_signals():
                    self._join([_Worker(p) for p in self.procs])
            finally:
                for path in context.error_files:
                    if path and os.path.exists(path):
                        os.unlink(path)
            payload = _results.load(results_path)
        finally:
            shutil.rmtree(results_dir, ignore_errors=True)
        if payload is None:
            return None
        return _results.recover_in_main_process(payload, self._strategy, trainer)

    def kill(self, signum: int) -> None:
        for process in self.procs:
            if process.is_alive() and process.pid:
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass

    @contextlib.contextmanager
    def _forwarding_preemption_signals(self) -> Iterator[None]:
        """Pass a preemption signal sent to this (waiting) process on to every worker.

        A scheduler signals the process it started, which is this one; the workers hold the
        training state, so they must get it to stop at the same step and write the checkpoint.
        """
        self._forwarded: int | None = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = {*parse_signals(os.environ.get(SIGNALS_ENV, "SIGTERM")), signal.SIGUSR1}

        def forward(signum: int, frame: Any) -> None:
            del frame
            self._forwarded = signum
            self.kill(signum)

        previous = {signum: signal.signal(signum, forward) for signum in signals}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _join(self, workers: list[_Worker]) -> None:
        """Wait for all workers; on the first failure stop the rest (SIGTERM, grace, SIGKILL) and raise.

        After a forwarded preemption signal, workers exiting with 143 stopped on purpose (their
        checkpoint is written): the others are waited for, and this process exits 143 too.
        """
        from multiprocessing.connection import wait

        pending = {w.process.sentinel: (rank, w) for rank, w in enumerate(workers)}
        preempted = False
        try:
            while pending:
                for sentinel in wait(list(pending), timeout=_POLL_SECONDS):
                    local_rank, worker = pending.pop(sentinel)  # type: ignore[call-overload]
                    worker.process.join()
                    if worker.process.exitcode == EXIT_CODE and getattr(self, "_forwarded", None):
                        preempted = True
                    elif worker.process.exitcode != 0:
                        stop_processes([w for _, w in pending.values()])
                        self._raise_worker_failed(local_rank, worker)
            if preempted:
                raise SystemExit(EXIT_CODE)
        except KeyboardInterrupt as exc:
            stop_processes([w for _, w in pending.values()])
            tag_exception(exc, 0, quiet=True)
            install_rank_excepthook(fast_exit=True, delay=False)
            raise

    def _raise_worker_failed(self, local_rank: int, worker: _Worker) -> None:
        rank = self._strategy.node_rank * self._strategy.num_processes + local_rank
        code = exit_code_of(int(worker.process.exitcode))
        msg = (
            f"rank {rank} (pid {worker.pid}) exited with code {code}; all other workers were stopped. "
            f"Its traceback is printed above, each line prefixed with [rank {rank}]."
        )
        err = WorkerFailedError(msg)
        tag_exception(err, 0, quiet=True)
        install_rank_excepthook(fast_exit=True, delay=False)
        raise err

    def _raise_pickling_error(self, err: Exception, function: Any, args: Any, kwargs: Any, trainer: Any) -> None:
        if self._start_method == "fork":
            return
        roots = {"trainer": trainer, "function": function, "args": args, "kwargs": kwargs, "strategy": self._strategy}
        found = None
        for name, root in roots.items():
            found = find_unpicklable(root, name)
            if found is not None:
                break
        where = f"`{found[0]}` (a {type(found[1]).__name__})" if found else "an object passed to the workers"
        msg = (
            f"start_method={self._start_method!r} sends the Trainer, the Module and everything they reference "
            f"to each worker by pickling, and {where} cannot be pickled: {type(err).__name__}: {err}. Fix: "
            "make it picklable (define functions and classes at module level, not lambdas or local "
            "objects; drop locks, open files and generators from the object), or use strategy='ddp', "
            "which re-runs your script instead of pickling anything."
        )
        raise MisconfigurationError(msg) from err

    def __getstate__(self) -> dict[str, Any]:
        """Process handles from an earlier run cannot be pickled; workers don't need them."""
        state = self.__dict__.copy()
        state["procs"] = []
        return state


def _restore_env(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _unshare_modules(*roots: Any) -> None:
    """Give this worker private copies of every Module tensor that arrived in shared memory.

    torch's pickler sends tensors to spawned processes through shared memory, so without this every
    worker would train the *same* storage concurrently (Hogwild), racing DDP's own synchronisation.
    """
    import torch
    from torch import nn

    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, nn.Module):
            with torch.no_grad():
                for tensor in [*obj.parameters(), *obj.buffers()]:
                    if tensor.is_shared():
                        tensor.data = tensor.data.clone()
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.extend(v for v in vars(obj).values() if isinstance(v, (nn.Module, list, tuple, dict)))


def _worker_entry(
    local_rank: int,
    launcher: MultiProcessingLauncher,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    trainer: Any,
    results_path: str,
) -> None:
    """What each worker runs: set its rank, run the stage, send local rank 0's results home."""
    set_parent_death_signal()
    strategy = launcher.strategy
    if launcher.start_method != "fork":
        _unshare_modules(strategy, trainer, args, kwargs)
    os.environ["LOCAL_RANK"] = str(local_rank)
    strategy.set_world_ranks()  # this worker's global rank follows from its local rank
    rank = strategy.node_rank * strategy.num_processes + local_rank
    try:
        result = function(*args, **kwargs)
        if local_rank == 0:
            _results.save(_results.collect(strategy, trainer, result), results_path)
    except KeyboardInterrupt:
        os._exit(130)
    except SystemExit as exc:  # a deliberate exit (143 after a preemption checkpoint): no traceback
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException as exc:
        if _asked_to_stop(trainer):
            # The launcher stopped this worker (SIGTERM) because another rank failed; what it raised
            # since is a consequence (a collective with the dead rank), not news: leave quietly.
            os._exit(EXIT_CODE)
        time.sleep(SECONDARY_FAILURE_DELAY)
        print_rank_traceback(rank, type(exc), exc, exc.__traceback__)
        os._exit(1)


def _asked_to_stop(trainer: Any) -> bool:
    """Whether a stop signal reached this worker during fit (its preemption handler recorded it)."""
    preemption = getattr(getattr(trainer, "fit_loop", None), "preemption", None)
    return getattr(preemption, "requested", None) is not None
