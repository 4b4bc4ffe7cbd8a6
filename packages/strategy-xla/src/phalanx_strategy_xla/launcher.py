"""Start one worker per XLA device with torch-xla's own launcher (``xmp.spawn``).

torch-xla must start the workers itself: PJRT assigns each its devices and ordinals while it
creates them. It accepts either one process (run right here, no fork) or one per device; there is
no "use 3 of 8". The main process must not have touched an XLA device before, or the runtime
refuses to launch. Results come back the way the core's spawn launcher brings them: local rank 0
writes its weights, metrics and return value to a file, which this process loads.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from phalanx.errors import MisconfigurationError
from phalanx.launchers.launcher import Launcher
from phalanx.utilities import load_worker_results, save_worker_results
from phalanx_strategy_xla import _runtime
from phalanx_strategy_xla.environment import XLAEnvironment

__all__ = ["XLALauncher"]


class XLALauncher(Launcher):
    """Run the stage on every XLA device through ``torch_xla.distributed.xla_multiprocessing.spawn``.

    Args:
        strategy: The ``XLAStrategy``; its ``num_processes`` is 1 or every device on the host.
        start_method: "fork" (default, as Lightning: works in notebooks, nothing re-imported) or "spawn".
    """

    def __init__(self, strategy: Any, start_method: str = "fork") -> None:
        if start_method not in ("fork", "spawn", "forkserver"):
            msg = f"XLALauncher(start_method={start_method!r}) is invalid; choose 'fork', 'spawn' or 'forkserver'."
            raise MisconfigurationError(msg)
        self._strategy = strategy
        self._start_method = start_method

    @property
    def is_interactive_compatible(self) -> bool:
        """Forked workers (the default) run code defined in a notebook cell; spawned ones cannot."""
        return self._start_method == "fork"

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        """Run ``function`` on every replica; return replica 0's result (weights loaded here).

        Raises:
            MisconfigurationError: Several processes were asked for after this process already
                started the XLA runtime (torch-xla cannot launch then).
        """
        _runtime.import_torch_xla("strategy='xla'")
        import torch_xla.distributed.xla_multiprocessing as xmp

        nprocs = self._strategy.num_processes
        if nprocs <= 1:
            holder: dict[str, Any] = {}
            xmp.spawn(_run_in_place, args=(self, function, args, kwargs, holder), nprocs=1)
            return holder.get("result")
        if _runtime.runtime_initialized():
            msg = (
                f"strategy='xla' with {nprocs} devices must launch its workers before this process uses an XLA "
                "device, but the XLA runtime is already running here (a tensor or model was moved to XLA, or "
                "another XLA run happened in this process). Fix: create no XLA tensors before Trainer.fit, "
                "and run each multi-device XLA job in a fresh process."
            )
            raise MisconfigurationError(msg)
        results_dir = tempfile.mkdtemp(prefix="phalanx-xla-")
        results_path = os.path.join(results_dir, "rank0.pt")
        try:
            xmp.spawn(
                _run_in_worker,
                args=(self, function, args, kwargs, trainer, results_path),
                nprocs=None,  # torch-xla: None means one worker per device, the only other choice than 1
                start_method=self._start_method,
            )
            return load_worker_results(results_path, self._strategy, trainer)
        finally:
            shutil.rmtree(results_dir, ignore_errors=True)


def _mark_launched(strategy: Any) -> None:
    strategy._launched = True
    environment = strategy.cluster_environment
    if isinstance(environment, XLAEnvironment):
        environment.launched = True


def _run_in_place(
    index: int,
    launcher: XLALauncher,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    holder: dict[str, Any],
) -> None:
    """One replica, in this very process: the objects are the caller's, nothing to copy back."""
    del index
    _mark_launched(launcher._strategy)
    holder["result"] = function(*args, **kwargs)


def _run_in_worker(
    index: int,
    launcher: XLALauncher,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    trainer: Any,
    results_path: str,
) -> None:
    """What each worker runs; replica 0 of each host writes the results file."""
    del index
    import torch_xla.core.xla_model as xm

    if len(xm.get_xla_supported_devices()) > 1:
        # Several devices per process (TPU v2/v3) run as threads sharing these objects: copy them.
        trainer, function, args, kwargs = copy.deepcopy((trainer, function, args, kwargs))
    strategy = trainer.strategy if trainer is not None else launcher._strategy
    _mark_launched(strategy)
    result = function(*args, **kwargs)
    if strategy.local_rank == 0:
        save_worker_results(strategy, trainer, result, results_path)
