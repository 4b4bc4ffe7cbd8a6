"""Launch the replica groups of a local ``ft_ddp`` run, and restart a group that dies.

A local run is one command: this process becomes replica group 0 and re-runs the script once per
other group (each a separate process tree, like one torchrun job per group on a cluster). Unlike
ddp's launcher, a group that exits non-zero does not stop the job: the other groups keep training,
and this launcher starts the group again (``max_restarts`` times), which then heals from a live
peer. The lighthouse (started here when no address is given) outlives every group and is stopped
when the job ends. A lighthouse that dies ends the job: no group is restarted then, since none
could form a quorum.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from phalanx.launchers.launcher import Launcher
from phalanx.launchers.subprocess_script import script_command
from phalanx_strategy_torchft._local_lighthouse import LocalLighthouse, die_with_parent

__all__ = ["ENV_GROUP", "ENV_LIGHTHOUSE", "ENV_START", "GroupsConfig", "ReplicaGroupsLauncher"]

#: This process belongs to replica group N (set by this launcher, or by a cluster's job script).
ENV_GROUP = "PHALANX_FT_REPLICA_GROUP"
#: The lighthouse address the launcher gives every group.
ENV_LIGHTHOUSE = "PHALANX_FT_LIGHTHOUSE"
#: host:port of the store where the groups of a fresh start meet before their first quorum.
ENV_START = "PHALANX_FT_START_STORE"
#: Variables of the top process's own rendezvous that a group must not inherit.
_RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "GROUP_RANK")
_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class GroupsConfig:
    """What the launcher needs from the strategy (a frozen policy: it is read from threads)."""

    num_groups: int
    min_replicas: int
    lighthouse: str | None
    timeout: timedelta
    max_restarts: int
    finish_timeout: float
    #: How long a local lighthouse's quorum waits for a live group that has not asked yet (None: ``timeout``).
    join_timeout: timedelta | None = None


class ReplicaGroupsLauncher(Launcher):
    """Start groups 1..R-1 and the lighthouse, run ``function`` as group 0 through ``inner``.

    Args:
        inner: The launcher of this group's own ranks (ddp's script launcher).
        config: Number of groups, lighthouse, restarts.
    """

    def __init__(self, inner: Launcher, config: GroupsConfig) -> None:
        self.inner = inner
        self.config = config
        self.lighthouse: LocalLighthouse | None = None
        self.groups: dict[int, subprocess.Popen[bytes]] = {}
        self.restarts: dict[int, int] = {}
        self.events: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._start_store: Any = None

    @property
    def is_interactive_compatible(self) -> bool:
        return False

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        """In a group process: run this group's ranks. In the top process: start everything first.

        The groups and the lighthouse live as long as this process, like ddp's re-run ranks: every
        group runs the whole script, so a second ``fit`` (a resume) happens in each of them too.
        They are stopped at exit (after ``finish_timeout`` for the others' last steps), or at once
        when this process fails.
        """
        if os.environ.get(ENV_GROUP) is not None:
            return self.inner.launch(function, *args, trainer=trainer, **kwargs)
        import torch.distributed as dist

        config = self.config
        address = config.lighthouse
        if address is None:
            self.lighthouse = LocalLighthouse(
                min_replicas=config.min_replicas,
                join_timeout=config.join_timeout or config.timeout,
                heartbeat_timeout=config.timeout,
            )
            address = self.lighthouse.address
        self._start_store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        os.environ[ENV_LIGHTHOUSE] = address
        os.environ[ENV_START] = f"127.0.0.1:{self._start_store.port}"
        self._command = script_command()
        self._base_env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS_VARS}
        for group in range(1, config.num_groups):
            self._start_group(group, fresh=True)
        os.environ[ENV_GROUP] = "0"
        self._watcher = threading.Thread(target=self._watch, name="phalanx-ft-groups", daemon=True)
        self._watcher.start()
        atexit.register(self._finish)
        try:
            return self.inner.launch(function, *args, trainer=trainer, **kwargs)
        except BaseException:
            self._stop.set()
            self._stop_groups(grace=0.0)
            raise

    def kill(self, signum: int) -> None:
        with self._lock:
            for proc in self.groups.values():
                if proc.poll() is None:
                    try:
                        os.kill(proc.pid, signum)
                    except ProcessLookupError:
                        pass

    # ------------------------------------------------------------------ groups
    def _start_group(self, group: int, *, fresh: bool) -> None:
        env = {**self._base_env, ENV_GROUP: str(group)}
        if not fresh:
            env.pop(ENV_START, None)  # a restarted group joins the running quorum, it meets nobody
        proc = subprocess.Popen(self._command, env=env, cwd=os.getcwd(), preexec_fn=die_with_parent)
        with self._lock:
            self.groups[group] = proc

    def _watch(self) -> None:
        """Restart a group that exited non-zero while the job (and its lighthouse) is alive."""
        while not self._stop.wait(_POLL_SECONDS):
            for group, proc in list(self.groups.items()):
                code = proc.poll()
                if code in (None, 0) or isinstance(proc, _Finished) or self._stop.is_set():
                    continue  # running, done, or already given up on
                done = self.restarts.get(group, 0)
                lighthouse_dead = self.lighthouse is not None and not self.lighthouse.alive()
                if done >= self.config.max_restarts or lighthouse_dead:
                    why = "the lighthouse is gone" if lighthouse_dead else f"max_restarts={self.config.max_restarts}"
                    self._event(f"replica group {group} exited with code {code}; not restarted ({why})")
                    with self._lock:
                        self.groups[group] = _Finished(code)  # type: ignore[assignment]
                    continue
                self.restarts[group] = done + 1
                self._event(
                    f"replica group {group} exited with code {code}; restarting it "
                    f"({done + 1}/{self.config.max_restarts}), it heals from a live group"
                )
                self._start_group(group, fresh=False)

    def _event(self, text: str) -> None:
        self.events.append(text)
        print(f"phalanx ft_ddp: {text}", file=sys.stderr, flush=True)

    def _finish(self) -> None:
        """This process is done: give the groups ``finish_timeout`` to end their script, then stop all."""
        deadline = time.monotonic() + self.config.finish_timeout
        while time.monotonic() < deadline and any(p.poll() is None for p in self.groups.values()):
            time.sleep(_POLL_SECONDS)
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        self._stop_groups(grace=5.0)
        for name in (ENV_START, ENV_LIGHTHOUSE, ENV_GROUP):
            os.environ.pop(name, None)
        self._start_store = None

    def _stop_groups(self, *, grace: float) -> None:
        with self._lock:
            procs = list(self.groups.values())
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.lighthouse is not None:
            self.lighthouse.stop()

    def __getstate__(self) -> dict[str, Any]:
        """Process handles and threads do not travel to another process."""
        state = self.__dict__.copy()
        state.update(groups={}, lighthouse=None, _stop=None, _lock=None, _watcher=None, _start_store=None)
        return state


class _Finished:
    """Stands in for a group that will not run again, so the watcher stops looking at it."""

    def __init__(self, code: int) -> None:
        self.returncode = code
        self.pid = -1

    def poll(self) -> int:
        return self.returncode

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode
