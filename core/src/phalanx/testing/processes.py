"""Run multi-process jobs in tests and prove they leave nothing behind.

Every job gets a marker environment variable that all its descendants inherit (re-run scripts,
spawned and forked workers, torchrun's agents and workers), and runs in a session of its own.
After the job, any live process that still carries the marker, or is still in the job's session,
is a leak, even if it was re-parented away from the test process: the marker catches a
descendant that started a new session, the session catches one that cleared its environment.
The scan reads ``/proc`` (Linux), so no third-party process library is needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "MARKER_VAR",
    "Job",
    "describe_processes",
    "kill_marked",
    "marked_processes",
    "new_marker",
    "session_processes",
    "wait_for_exit",
]

#: Environment variable carrying a job's marker; its value starts with the test session's prefix.
MARKER_VAR = "PHALANX_TEST_JOB"
_SESSION = uuid.uuid4().hex[:12]


def new_marker() -> str:
    """A marker unique to one job, starting with this test session's prefix."""
    return f"{_SESSION}-{uuid.uuid4().hex[:8]}"


def marked_processes(prefix: str = _SESSION) -> list[int]:
    """Pids of live (non-zombie) processes whose environment holds a marker starting with ``prefix``."""
    needle = f"{MARKER_VAR}={prefix}".encode()
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(item.startswith(needle) for item in environ.split(b"\0")):
            found.append(int(entry))
    return found


def session_processes(session: int) -> list[int]:
    """Pids of live (non-zombie) processes in session ``session`` (``start_new_session`` makes it the pid)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[3]) == session:
            found.append(int(entry))
    return found


def describe_processes(pids: Sequence[int]) -> str:
    """``pid: command line`` per process, so a leak report says what was left running."""
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            command = "(exited)"
        lines.append(f"{pid}: {command}")
    return "\n".join(lines)


def wait_for_exit(prefix: str = _SESSION, grace: float = 2.0) -> list[int]:
    """Wait up to ``grace`` seconds for marked processes to end; return those still alive."""
    deadline = time.monotonic() + grace
    pids = marked_processes(prefix)
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = marked_processes(prefix)
    return pids


def kill_marked(prefix: str = _SESSION) -> list[int]:
    """SIGKILL every process carrying a marker with ``prefix``; return their pids."""
    pids = marked_processes(prefix)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


class Job:
    """A command started in its own session with a marker; output goes to files (no pipe stalls).

    Args:
        command: The command line (``sys.executable`` is prepended when it starts with a ``.py``).
        workdir: Directory for the output files; also the default working directory.
        env: Extra environment variables.
        cwd: Working directory of the command.
    """

    def __init__(
        self,
        command: Sequence[str],
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        name: str = "job",
    ) -> None:
        command = list(command)
        if command[0].endswith(".py"):
            command.insert(0, sys.executable)
        self.marker = new_marker()
        self.stdout_path = workdir / f"{name}.stdout"
        self.stderr_path = workdir / f"{name}.stderr"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}), MARKER_VAR: self.marker}
        self.started = time.time()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=err, env=full_env, cwd=str(cwd or workdir), start_new_session=True
            )
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """The exit code, or None while running; records :attr:`ended` when first seen exited."""
        code = self.process.poll()
        if code is not None and self.ended is None:
            self.ended = time.time()
        return code

    def wait(self, timeout: float) -> int:
        """Wait for the job; on timeout kill everything it started and raise ``TimeoutError``.

        Any other interruption while waiting (pytest-timeout's, Ctrl-C, ...) also kills the job's
        processes before it propagates: the job runs in a session of its own, so nothing else
        would end it.
        """
        deadline = time.monotonic() + timeout
        try:
            while self.poll() is None:
                if time.monotonic() > deadline:
                    self._kill_all()
                    msg = f"job did not finish within {timeout:g}s; killed it\n{self.output()}"
                    raise TimeoutError(msg)
                time.sleep(0.02)
        except BaseException:
            self._kill_all()
            raise
        return int(self.process.returncode)

    def _kill_all(self) -> None:
        self.kill_leftovers()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the job's whole process group, like Ctrl-C in a terminal."""
        os.killpg(self.process.pid, signum)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        return f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"

    def leftovers(self, grace: float = 2.0) -> list[int]:
        """Processes of this job still alive after ``grace`` seconds.

        The grace covers helpers that exit on their own right after the job (multiprocessing's
        resource tracker notices its parent's exit only when its pipe closes). Both the marker
        and the job's session id are checked (see the module docstring).
        """
        deadline = time.monotonic() + grace
        pids = self._live()
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = self._live()
        return pids

    def kill_leftovers(self) -> list[int]:
        """SIGKILL whatever of the job is still alive (marker or session); return their pids."""
        pids = self._live()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def _live(self) -> list[int]:
        return sorted(set(marked_processes(self.marker)) | set(session_processes(self.process.pid)))
