"""Start a re-run rank by asking a test harness's pre-warmed process to fork it.

A test suite runs a few hundred multi-process jobs, and each rank the popen launcher starts is a
new interpreter that imports torch before it does anything (about 1.2 s of one core). Where the
test harness offers a process that has torch imported already (``phalanx.testing.warm``: it sets
:data:`VARIABLE` to its socket's path in the jobs it forks), :class:`SubprocessScriptLauncher
<phalanx.launchers.subprocess_script.SubprocessScriptLauncher>` asks it for each rank instead of
running ``python script.py``: the harness forks a child that becomes that command with the
launcher's environment, working directory and standard streams, and kills it when the launcher
dies (as the parent-death signal would). Outside such a harness the variable is unset and nothing
here runs. Set it to ``0`` in a job whose ranks' real start is what a test is about.

The protocol: one JSON line with the request, the launcher's fds 0-2 passed along
(``SCM_RIGHTS``), one line back (``{"pid": N}``, or ``{"cold": reason}`` when the command cannot be
made equivalent, e.g. another interpreter), and, on the same connection, ``{"exit": code}`` when
the rank ends.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

__all__ = ["VARIABLE", "ForkedChild", "WarmRank", "start_warm_rank"]

#: The harness's socket path; unset, empty or ``0``: every rank starts as a new interpreter.
VARIABLE = "PHALANX_TEST_WARM_RANKS"


class ForkedChild:
    """The signalling half of the ``subprocess.Popen`` surface, for a process this one did not fork
    (a warm parent did): subclasses say how its exit status arrives (:meth:`poll`)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None:
        raise NotImplementedError

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmRank(ForkedChild):
    """The ``subprocess.Popen`` surface the launcher uses, for a rank the harness forked.

    The rank is the harness's child, not this process's: its exit status arrives on the
    connection that asked for it.
    """

    def __init__(self, connection: socket.socket, pid: int, args: Sequence[str], received: bytes = b"") -> None:
        self._connection = connection
        self._buffer = received  # what arrived after the reply line
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            code = self._read(left)
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)

    def _read(self, timeout: float | None) -> int | None:
        if self.returncode is None and b"\n" not in self._buffer:
            ready, _, _ = select.select([self._connection], [], [], timeout)
            if ready:
                chunk = self._connection.recv(4096)
                if not chunk:  # the harness ended without a word: the rank died with it
                    self._finish(-signal.SIGKILL)
                self._buffer += chunk
        if self.returncode is None and b"\n" in self._buffer:
            self._finish(int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"]))
        return self.returncode

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._connection.close()


def start_warm_rank(command: Sequence[str], env: dict[str, str], cwd: str) -> WarmRank | None:
    """Ask the harness named by ``env[VARIABLE]`` to fork ``command``; None: start it yourself."""
    path = env.get(VARIABLE, "")
    if path in ("", "0"):
        return None
    request = {"argv": list(command), "env": env, "cwd": cwd, "watch": os.getpid()}
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        reply = b""
        while b"\n" not in reply:
            chunk = connection.recv(4096)
            if not chunk:
                raise ConnectionError("the harness closed the connection")
            reply += chunk
    except OSError:
        connection.close()
        return None
    line, rest = reply.split(b"\n", 1)
    answer = json.loads(line)
    if "pid" not in answer:  # {"cold": why}: the command cannot be made equivalent there
        connection.close()
        return None
    return WarmRank(connection, int(answer["pid"]), command, rest)
