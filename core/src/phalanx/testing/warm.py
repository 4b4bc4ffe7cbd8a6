"""A pre-warmed parent process that forks test jobs with torch already imported.

Importing torch takes 1.5-2 s on an idle machine and several times that on a loaded one, and a
test suite that runs a few hundred scripts pays it once per script before the script does anything.
Where the start of the process is not what a test is about, :class:`~phalanx.testing.processes.Job`
(``warm=True``) asks this module's parent process instead: it has imported torch and
torch.distributed once, and forks a child per job that becomes what ``python script.py args``
(or ``python -m module args``) would have been: the job's environment, working directory, output
files, ``sys.argv``, ``sys.path``, its own session, fresh random seeds, torch's thread count from
``OMP_NUM_THREADS``. What the script then does is real: its launcher re-runs, spawns or forks ranks
exactly as it would, torchrun starts its workers, gloo connects.

A job is started cold (a plain ``subprocess.Popen``) when it cannot be made equivalent: another
interpreter, interpreter options (``-X``, ``-W``, ``-c``...), or an environment variable that takes
effect when the interpreter or torch starts (:data:`COLD_VARIABLES`). ``PHALANX_TEST_WARM=0`` turns
warm starts off for a whole run.

The protocol is one JSON line per request on the parent's stdin, one line per reply on its stdout;
a child's exit status is written to a file beside its output when the parent reaps it (``.exit``),
so a waiting test reads a file, as it reads the job's output. The parent exits when its stdin
closes, i.e. when the test process that started it ends, however it ends.
"""

from __future__ import annotations

import glob
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phalanx.launchers._warm_ranks import VARIABLE as RANKS_VARIABLE

__all__ = ["COLD_VARIABLES", "WarmParent", "can_start_warm", "warm_parent", "warm_rank_pids"]

#: Environment variables read when the interpreter or torch starts, which a forked child could not
#: honour: a job whose environment sets one to a value other than this process's starts cold.
COLD_VARIABLES = (
    "PYTHONHASHSEED",
    "PYTHONHOME",
    "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONMALLOC",
    "PYTHONDEVMODE",
    "PYTHONUTF8",
    "PYTHONIOENCODING",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "MKL_NUM_THREADS",
    "KMP_AFFINITY",
    "GOMP_CPU_AFFINITY",
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_LOGS",
    "COVERAGE_PROCESS_START",
)
#: What the parent imports before it forks anything. Not torch._dynamo, although building any torch
#: optimizer imports it (about 1 s of one core per job; a tiny fit in a warm child takes 1.2 s of CPU
#: without it preloaded, 0.2 s with it): with it preloaded, 2 of 20 runs of a plain torch DDP script
#: (fsdp's reference) hung at its end. Not a fork problem (no thread exists before the fork): torch
#: 2.13's gloo teardown can deadlock. The autograd engine stashes a Python object in the
#: thread-local state each collective of backward captures; when a gloo worker thread drops the
#: last reference to such a collective it needs the GIL, while the main thread holds it in the
#: process group's destructor, joining that worker (seen with py-spy: ``~ProcessGroupGloo`` in
#: ``std::thread::join`` under the DDP reducer's dealloc; the worker in ``~AsyncWork`` waiting in
#: ``gil_scoped_acquire``). What makes it likely is torch._dynamo imported before the process group
#: exists, in a forked process: 3 of 20 warm runs hung when the script itself imported it first,
#: 0 of 20 when the script ran cold with that import, and 0 of 20 warm as written (dynamo comes
#: with the optimizer, after the group). phalanx's own teardown did not hang (30 of 30 warm ddp
#: fits with the preload), but the suite's plain-torch reference scripts do.
PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "torch.utils.data")
#: Set to "0" to start every job cold.
SWITCH = "PHALANX_TEST_WARM"


def can_start_warm(command: Sequence[str], env: dict[str, str]) -> bool:
    """Whether ``command`` run with ``env`` can be forked from the warm parent (see the module doc)."""
    if os.environ.get(SWITCH, "1") == "0" or sys.platform != "linux" or len(command) < 2:
        return False
    if os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return False
    if command[1] == "-m":
        if len(command) < 3:
            return False
    elif command[1].startswith("-") or not command[1].endswith(".py"):
        return False
    return all(env.get(name) == os.environ.get(name) for name in COLD_VARIABLES)


class WarmParent:
    """The client side: starts the parent process lazily and asks it to fork jobs."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        #: Where the parent listens for rank requests and lists the ranks it forked (see
        #: :func:`warm_rank_pids`); None until it has started.
        self.ranks_folder: Path | None = None

    def start(self, command: Sequence[str], *, env: dict[str, str], cwd: Path, stdout: Path, stderr: Path) -> int:
        """Fork ``command`` (``[python, script, ...]`` or ``[python, -m, module, ...]``); return its pid."""
        request = {
            "argv": list(command[1:]),
            "env": env,
            "cwd": str(cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
            "exit": str(exit_file(stdout)),
        }
        with self._lock:
            process = self._running()
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
            reply = process.stdout.readline()
        if not reply:
            msg = f"the warm parent process ended (exit {process.wait()}); set {SWITCH}=0 to start jobs cold"
            raise RuntimeError(msg)
        return int(json.loads(reply)["pid"])

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            # The parent belongs to no job and no test (PHALANX_TEST_JOB / _CASE): the leak checks
            # must not count it, and each job gets its own values in its request.
            env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_TEST_")}
            self._process = subprocess.Popen(
                [sys.executable, "-m", "phalanx.testing.warm"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            assert self._process.stdout is not None
            hello = self._process.stdout.readline()  # {"ranks": folder} once torch is imported
            self.ranks_folder = Path(json.loads(hello)["ranks"]) if hello else None
        return self._process

    def close(self) -> None:
        """End the parent process (its forked jobs are not its to end: each is in a session of its own)."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                assert self._process.stdin is not None
                self._process.stdin.close()
                try:
                    self._process.wait(10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            self._process = None

    @property
    def pid(self) -> int | None:
        """The parent's pid while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None


_parent: WarmParent | None = None


def warm_parent() -> WarmParent:
    """This process's one :class:`WarmParent` (closed at exit)."""
    global _parent
    if _parent is None:
        import atexit

        _parent = WarmParent()
        atexit.register(_parent.close)
    return _parent


def warm_rank_pids(prefix: str) -> list[int]:
    """Live ranks this process's warm parent forked for jobs whose marker starts with ``prefix``.

    A warm rank (:mod:`phalanx.launchers._warm_ranks`) is forked, not started from a new
    interpreter, so ``/proc/PID/environ`` does not show the job's marker, and it is in a session of
    its own: the parent lists each one it forked as a file ``MARKER@PID`` until it reaps it.
    """
    folder = _parent.ranks_folder if _parent is not None else None
    if folder is None:
        return []
    found = []
    for path in (folder / "ranks").glob(f"{glob.escape(prefix)}*@*"):
        pid = int(path.name.rsplit("@", 1)[1])
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z":
                    found.append(pid)
        except OSError:
            continue
    return found


def exit_file(stdout: Path) -> Path:
    """Where the parent writes the exit status of the job whose stdout is ``stdout``."""
    return stdout.with_name(stdout.name + ".exit")


# --- the parent process ----------------------------------------------------------------------


def _serve() -> None:
    import importlib
    import tempfile

    for name in PRELOAD:
        importlib.import_module(name)
    _die_with_parent()
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    threads = _default_threads()
    exits: dict[int, str] = {}
    ranks = _Ranks(Path(tempfile.mkdtemp(prefix="phalanx-warm-")))
    requests = sys.stdin.buffer
    replies = sys.stdout.buffer
    replies.write(json.dumps({"ranks": str(ranks.folder)}).encode() + b"\n")
    replies.flush()
    pending = b""
    while True:
        ready, _, _ = select.select([requests, *ranks.watched()], [], [], 0.01)
        if requests in ready:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                env = request["env"]
                if env.get(RANKS_VARIABLE) != "0":  # the job's re-run ranks are forked here too
                    env[RANKS_VARIABLE] = str(ranks.socket_path)
                pid = os.fork()
                if pid == 0:
                    ranks.close_in_child()
                    _become(request, base_path, threads)  # never returns
                exits[pid] = request["exit"]
                replies.write(json.dumps({"pid": pid}).encode() + b"\n")
                replies.flush()
        ranks.serve([r for r in ready if r is not requests], base_path, threads)
        _reap(exits, ranks)
    # stdin closed: the test process is gone; its jobs finish on their own, reaped by init.
    ranks.close_in_child()


class _Ranks:
    """The parent's side of :mod:`phalanx.launchers._warm_ranks`: fork re-run ranks on request.

    Each rank is listed as ``ranks/MARKER@PID`` while it lives (:func:`warm_rank_pids`), and is
    SIGKILLed when the launcher that asked for it dies, as the parent-death signal the popen
    launcher gives its children would.
    """

    def __init__(self, folder: Path) -> None:
        import socket

        self.folder = folder
        (folder / "ranks").mkdir()
        self.socket_path = folder / "socket"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.socket_path))
        self.listener.listen(64)
        self.live: dict[int, tuple[Any, int | None, Path]] = {}  # pid -> (connection, launcher pidfd, listing)
        self._pidfds: dict[int, int] = {}  # launcher pidfd -> rank pid

    def watched(self) -> list[Any]:
        return [self.listener, *self._pidfds]

    def serve(self, ready: list[Any], base_path: list[str], threads: int) -> None:
        for item in ready:
            if item is self.listener:
                self._fork_one(base_path, threads)
            elif item in self._pidfds:  # the launcher died: its rank goes too
                rank = self._pidfds.pop(item)
                os.close(item)
                connection, _, listing = self.live[rank]
                self.live[rank] = (connection, None, listing)
                try:
                    os.kill(rank, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _fork_one(self, base_path: list[str], threads: int) -> None:
        import socket

        connection, _ = self.listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        while not message.endswith(b"\n"):
            chunk = connection.recv(1 << 20)
            if not chunk:
                break
            message += chunk
        request = json.loads(message)
        command, env = request["argv"], request["env"]
        why = "" if can_start_warm(command, env) else "cannot be made equivalent here"
        pidfd = None
        if not why:
            try:
                pidfd = os.pidfd_open(int(request["watch"]))
            except (OSError, AttributeError):
                why = "the launcher is gone"
        if why:
            connection.sendall(json.dumps({"cold": why}).encode() + b"\n")
            connection.close()
            for fd in fds:
                os.close(fd)
            return
        assert pidfd is not None
        rank_request = {**request, "argv": command[1:]}
        pid = os.fork()
        if pid == 0:
            self.close_in_child()
            connection.close()
            os.close(pidfd)
            _become(rank_request, base_path, threads, fds=fds)  # never returns
        for fd in fds:
            os.close(fd)
        listing = self.folder / "ranks" / f"{env.get('PHALANX_TEST_JOB', 'unmarked')}@{pid}"
        listing.touch()
        self.live[pid] = (connection, pidfd, listing)
        self._pidfds[pidfd] = pid
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def ended(self, pid: int, code: int) -> None:
        connection, pidfd, listing = self.live.pop(pid)
        listing.unlink(missing_ok=True)
        if pidfd is not None:
            self._pidfds.pop(pidfd, None)
            os.close(pidfd)
        try:
            connection.sendall(json.dumps({"exit": code}).encode() + b"\n")
        except OSError:  # the launcher is gone
            pass
        connection.close()

    def close_in_child(self) -> None:
        """Drop the parent's sockets and pidfds (in a forked job or rank, or when the parent ends)."""
        self.listener.close()
        for connection, pidfd, _ in self.live.values():
            connection.close()
            if pidfd is not None:
                os.close(pidfd)
        self.live.clear()
        self._pidfds.clear()


def _reap(exits: dict[int, str], ranks: _Ranks) -> None:
    while exits or ranks.live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in ranks.live:
            ranks.ended(pid, os.waitstatus_to_exitcode(status))
            continue
        path = exits.pop(pid, None)
        if path is not None:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as fh:
                fh.write(str(os.waitstatus_to_exitcode(status)))
            os.replace(tmp, path)  # a reader sees the whole code or no file


def _die_with_parent() -> None:
    """Exit when the test process dies without closing stdin (SIGKILL): PR_SET_PDEATHSIG."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _default_threads() -> int:
    import torch

    return torch.get_num_threads()


def _become(request: dict, base_path: list[str], threads: int, *, fds: Sequence[int] = ()) -> None:
    """In the forked child: turn into the requested job, run it, and end as the interpreter ends a
    script: whatever the job raises (SystemExit, an error) unwinds out of the parent's loop, where
    nothing catches it, and the interpreter reports it, joins the threads, runs atexit and
    finalises (process groups and subprocess handles are released as at any exit)."""
    try:
        os.setsid()
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):  # SIGPIPE stays ignored, as Python has it
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if fds:  # a rank: the launcher's own stdin, stdout and stderr
            _adopt(fds)
        else:
            _redirect(request["stdout"], request["stderr"])
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        argv: list[str] = request["argv"]
        extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        import random

        random.seed()
        _startup_options(env)
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]) if env.get("OMP_NUM_THREADS") else threads)
    except BaseException:  # the job could not be set up: never go on with the parent's loop
        import traceback

        traceback.print_exc()
        raise SystemExit(1) from None
    _run(argv, extra, base_path)
    raise SystemExit(0)


def _startup_options(env: dict[str, str]) -> None:
    """What the interpreter does at start for PYTHONFAULTHANDLER and PYTHONWARNINGS."""
    import faulthandler
    import warnings

    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    options = [option for option in env.get("PYTHONWARNINGS", "").split(",") if option]
    if options:
        sys.warnoptions[:] = options
        for option in options:
            warnings._setoption(option)  # type: ignore[attr-defined]  # how the interpreter applies them


def _redirect(stdout: str, stderr: str) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    _standard_streams()


def _adopt(fds: Sequence[int]) -> None:
    """Make the passed descriptors this process's fds 0, 1 and 2."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    _standard_streams()


def _standard_streams() -> None:
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True, write_through=True
    )
    # What a fresh interpreter's sys.__stdout__ & co. are: the job's streams (faulthandler, atexit).
    sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin  # type: ignore[misc]


def _run(argv: list[str], extra: list[str], base_path: list[str]) -> None:
    """Run the script or module as ``__main__``, as ``python script.py`` / ``python -m mod`` would."""
    import runpy

    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # run_module replaces argv[0] by the module's file
            sys.path[:] = [os.getcwd(), *extra, *base_path]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(script), *extra, *base_path]
            runpy.run_path(script, run_name="__main__")
    except KeyboardInterrupt as error:
        # The interpreter reports it, then ends "killed by SIGINT" (a shell's 130): it cannot be left
        # to unwind here, where the interpreter runs a module (-m) and would exit 1.
        sys.excepthook(type(error), error, error.__traceback__)
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def _finish() -> None:
    """What the interpreter does at exit before finalising: join threads, run atexit, flush."""
    import atexit
    import threading as threads

    try:
        threads._shutdown()  # type: ignore[attr-defined]
    except BaseException:  # a thread that cannot be joined must not stop the exit
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    _serve()
