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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from phalanx.launchers._warm_ranks import ForkedChild
from phalanx.testing.warm import can_start_warm, exit_file, warm_parent, warm_rank_pids

__all__ = [
    "MARKER_VAR",
    "RANK_VARIABLES",
    "ForkedProcess",
    "Job",
    "ScriptResult",
    "describe_processes",
    "kill_marked",
    "marked_processes",
    "new_marker",
    "run_command",
    "run_commands",
    "run_script",
    "session_processes",
    "wait_for_exit",
]

#: Environment variable carrying a job's marker; its value starts with the test session's prefix.
MARKER_VAR = "PHALANX_TEST_JOB"
_SESSION = uuid.uuid4().hex[:12]
#: What makes a process think it is a rank of a running job (torchrun / a launcher set them).
RANK_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


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
    return sorted(set(found) | set(warm_rank_pids(prefix)))  # forked ranks do not show the marker


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


class ForkedProcess(ForkedChild):
    """The ``subprocess.Popen`` surface a :class:`Job` uses, for a job forked by the warm parent.

    The job is the warm parent's child, not this process's: its exit status arrives as a file
    (``exit_path``) that the parent writes when it reaps the job.
    """

    def __init__(self, pid: int, exit_path: Path) -> None:
        self.pid = pid
        self.exit_path = exit_path
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.exit_path.exists():
            self.returncode = int(self.exit_path.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


class Job:
    """A command started in its own session with a marker; output goes to files (no pipe stalls).

    Args:
        command: The command line (``sys.executable`` is prepended when it starts with a ``.py``).
        workdir: Directory for the output files; also the default working directory.
        env: Extra environment variables.
        cwd: Working directory of the command.
        name: Stem of the output files (``NAME.stdout``, ``NAME.stderr``).
        unset: Variables of this process's environment the command does not inherit: by default
            :data:`RANK_VARIABLES`, so a job started from a test that itself runs as a rank
            (under torchrun) launches its own ranks; ``env`` may set them again.
        warm: Fork the command from the pre-warmed parent process (torch already imported) when it
            can be made equivalent (:func:`phalanx.testing.warm.can_start_warm`); for every test
            whose subject is not the start of the process itself.
    """

    def __init__(
        self,
        command: Sequence[str],
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        name: str = "job",
        warm: bool = False,
        unset: Sequence[str] = RANK_VARIABLES,
    ) -> None:
        command = list(command)
        if command[0].endswith(".py"):
            command.insert(0, sys.executable)
        self.marker = new_marker()
        self.stdout_path = workdir / f"{name}.stdout"
        self.stderr_path = workdir / f"{name}.stderr"
        full_env = {k: v for k, v in os.environ.items() if k not in unset}
        full_env.update({"PYTHONUNBUFFERED": "1", **(env or {}), MARKER_VAR: self.marker})
        self.started = time.time()
        self.warm = warm and can_start_warm(command, full_env)
        self.process: subprocess.Popen[bytes] | ForkedProcess
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            if self.warm:
                exit_file(self.stdout_path).unlink(missing_ok=True)  # a previous job's of the same name
                self.process = ForkedProcess(
                    warm_parent().start(
                        command, env=full_env, cwd=cwd or workdir, stdout=self.stdout_path, stderr=self.stderr_path
                    ),
                    exit_file(self.stdout_path),
                )
            else:
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
                    self.kill()
                    msg = f"job did not finish within {timeout:g}s; killed it\n{self.output()}"
                    raise TimeoutError(msg)
                time.sleep(0.02)
        except BaseException:
            self.kill()
            raise
        code = self.process.returncode
        assert code is not None  # poll() saw the exit
        return int(code)

    def kill(self) -> None:
        """SIGKILL everything the job started (its own process too) and wait for its exit status."""
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


class ScriptResult:
    """Exit code, output, wall time and leftovers of a command run by :func:`run_command`.

    Attributes:
        leftovers: ``pid: command line`` of processes still alive after the command exited (they
            were killed); empty when it cleaned up after itself.
        ended: ``time.time()`` when the command was first seen exited, for "how fast" checks.
    """

    def __init__(
        self,
        returncode: int,
        stdout: str,
        stderr: str,
        seconds: float,
        *,
        leftovers: str = "",
        ended: float | None = None,
    ) -> None:
        self.returncode, self.stdout, self.stderr, self.seconds = returncode, stdout, stderr, seconds
        self.leftovers, self.ended = leftovers, ended

    def output(self) -> str:
        return f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"

    def check(self) -> ScriptResult:
        """Raise with the script's output when it failed or left processes running."""
        if self.returncode != 0:
            msg = f"script exited with {self.returncode} after {self.seconds:.1f}s\n{self.output()}"
            raise AssertionError(msg)
        self.check_leftovers()
        return self

    def check_leftovers(self) -> None:
        """Raise when the run left processes behind (they were killed already)."""
        if self.leftovers:
            msg = f"the run exited but left processes running (killed now):\n{self.leftovers}\n{self.output()}"
            raise AssertionError(msg)


def run_command(
    command: Sequence[str],
    *,
    cwd: Path,
    logs: Path | None = None,
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
    warm: bool = True,
    unset: Sequence[str] = RANK_VARIABLES,
) -> ScriptResult:
    """Run ``command`` as a marked job in its own session; never hang, never leak.

    On timeout everything the job started is killed and the test fails with its output. After
    it exits, processes of the job still alive 2 s later are killed and listed in
    :attr:`ScriptResult.leftovers`. ``command`` may start with a ``.py`` file (run with this
    Python) or be e.g. ``[sys.executable, "-m", "torch.distributed.run", ...]``. Output goes to
    files (no pipe can fill and stall the job) in ``logs``, else in a temporary folder removed
    once read. ``warm`` forks the command from the pre-warmed parent (torch already imported; see
    :mod:`phalanx.testing.warm`) where it can be made equivalent; pass ``warm=False`` where the
    start of the process is what the test is about.
    """
    start = time.monotonic()
    folder = logs if logs is not None else Path(tempfile.mkdtemp(prefix="phalanx-run-"))
    try:
        job = Job(command, folder, env=env, cwd=cwd, name="run", warm=warm, unset=unset)
        try:
            code = job.wait(timeout)
        except TimeoutError:
            import pytest  # only here: the CLI (phalanx doctor) uses this module without pytest

            pytest.fail(
                f"{' '.join(command)} did not finish within {timeout:g}s (killed everything it started)\n{job.output()}"
            )
        leftovers = job.leftovers()
        described = describe_processes(leftovers) if leftovers else ""
        job.kill_leftovers()
        return ScriptResult(
            code, job.stdout, job.stderr, time.monotonic() - start, leftovers=described, ended=job.ended
        )
    finally:
        if logs is None:
            shutil.rmtree(folder, ignore_errors=True)


def run_commands(
    commands: Sequence[Sequence[str]],
    *,
    cwd: Path,
    envs: Sequence[dict[str, str] | None] | None = None,
    timeout: float = 240.0,
    warm: bool = True,
) -> list[ScriptResult]:
    """Run ``commands`` at once (e.g. one per rank, as torchrun would) and wait for all of them.

    Like :func:`run_command` for each, with one deadline for all: when it passes, or anything
    interrupts the wait, every process of every command is killed before the test fails.
    ``envs`` gives each command its own extra variables.
    """
    start = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="phalanx-run-"))
    jobs: list[Job] = []
    try:
        for index, command in enumerate(commands):
            env = envs[index] if envs is not None else None
            jobs.append(Job(command, folder, env=env, cwd=cwd, name=f"run{index}", warm=warm))
        deadline = time.monotonic() + timeout
        for job in jobs:
            try:
                job.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                import pytest

                outputs = "\n".join(other.output() for other in jobs)
                pytest.fail(f"{len(jobs)} commands did not finish within {timeout:g}s (all killed)\n{outputs}")
        results = []
        for job in jobs:
            leftovers = job.leftovers()
            job.kill_leftovers()
            results.append(
                ScriptResult(
                    int(job.process.returncode or 0),
                    job.stdout,
                    job.stderr,
                    time.monotonic() - start,
                    leftovers=describe_processes(leftovers) if leftovers else "",
                    ended=job.ended,
                )
            )
        return results
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
        shutil.rmtree(folder, ignore_errors=True)


def run_script(
    path: Path, *, timeout: float = 240.0, env: dict[str, str] | None = None, warm: bool = True
) -> ScriptResult:
    """Run ``python path`` in its folder with :func:`run_command` (output files go there too)."""
    return run_command([str(path)], cwd=path.parent, logs=path.parent, timeout=timeout, env=env, warm=warm)
