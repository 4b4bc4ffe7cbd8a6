"""A per-test check that nothing a test started outlives it: processes, listening ports, env vars.

Install it in a suite's ``conftest.py``::

    from phalanx.testing.leaks import nothing_left_behind  # noqa: F401  (an autouse fixture)

How each leak is found (Linux: everything is read from ``/proc``, no third-party library):

* **Processes.** For the duration of a test, :data:`CASE_VAR` holds a value unique to that test in
  ``os.environ``, so every process the test starts inherits it -- re-run scripts, spawned and
  forked workers, torchrun's agents and workers, and ranks that were re-parented to init when
  their launcher died or that started a session of their own. A process that cleared its
  environment is still caught while it stays in the test process's process group. After the
  test, any live process that carries the value, or that joined the process group during the
  test, is a leak. Processes get a short grace to exit by themselves (multiprocessing's resource
  tracker leaves right after its parent), then the leftovers are killed, so the next test starts
  clean, and the test fails naming them.
* **Ports.** A TCP socket in the ``LISTEN`` state, held by the test process (or a leftover
  process), that was not there before the test: a ``TCPStore`` or server nobody closed.
* **Environment.** Any variable of ``os.environ`` added, removed or changed (the few that pytest
  and torch set for themselves excepted); the previous values are restored before failing.
* **Process group.** ``torch.distributed`` left initialised in the test process.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pytest

from phalanx.testing.processes import describe_processes

__all__ = ["CASE_VAR", "IGNORED_ENV", "Snapshot", "find_leaks", "nothing_left_behind", "take_snapshot"]

#: Environment variable carrying the running test's marker (inherited by everything it starts).
CASE_VAR = "PHALANX_TEST_CASE"
#: Variables set by the tools themselves: pytest's bookkeeping, and torch when it first imports
#: inductor (its compile cache directory).
IGNORED_ENV = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "TORCHINDUCTOR_CACHE_DIR",
        CASE_VAR,
        # torch-xla's runtime sets these for the whole process the first time it starts (in-process
        # XLA tests): the library's own state, not something a test forgot to undo.
        "SKIP_MEGASCALE_PJRT_CLIENT",
        "PJRT_LOCAL_PROCESS_COUNT",
    }
)
#: Seconds leftovers get to exit by themselves before they count as leaks.
GRACE = 2.0
_LISTEN = "0A"


@dataclass
class Snapshot:
    """What existed before a test: the marker it got, pids, the test process's sockets, the environment."""

    marker: str
    pids: frozenset[int]
    sockets: frozenset[int]
    environ: dict[str, str] = field(default_factory=dict)
    #: pid -> start time (clock ticks since boot), so that a pid the system reused during the test
    #: (pids wrap around at ``pid_max``) still counts as a new process.
    start_times: dict[int, int] = field(default_factory=dict)


def _pids() -> frozenset[int]:
    try:
        return frozenset(int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    except OSError:  # no /proc: nothing can be checked
        return frozenset()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, or None when it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[2])


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[-1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return any(item == needle for item in handle.read().split(b"\0"))
    except OSError:
        return False


def _socket_inodes(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for entry in entries:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def _listening_ports() -> dict[int, int]:
    """Socket inode -> port of every listening TCP socket (IPv4 and IPv6) in this network namespace."""
    ports: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            columns = row.split()
            if len(columns) > 9 and columns[3] == _LISTEN:
                ports[int(columns[9])] = int(columns[1].rsplit(":", 1)[1], 16)
    return ports


def _own_listening(pids: Iterable[int], *, known: frozenset[int] = frozenset()) -> dict[int, int]:
    """Listening sockets (inode -> port) held by ``pids``, other than the ``known`` inodes.

    The socket tables are read only when there is a new socket to look up: reading them costs
    tens of milliseconds, listing file descriptors almost nothing.
    """
    inodes: set[int] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    inodes -= known
    if not inodes:
        return {}
    return {inode: port for inode, port in _listening_ports().items() if inode in inodes}


def _own_process_group() -> None:
    """Under pytest-xdist, make this worker the leader of its own process group.

    The workers share the controller's group; a process another worker's test started would then
    count as a leak of this worker's test (and be killed). One group per worker keeps each
    worker's check to its own tests.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") and os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)


def take_snapshot() -> Snapshot:
    """Record the state a test starts from and give it a fresh marker (not yet exported)."""
    _own_process_group()
    pids = _pids()
    return Snapshot(
        marker=uuid.uuid4().hex,
        pids=pids,
        start_times={pid: started for pid in pids if (started := _start_time(pid)) is not None},
        sockets=frozenset(_socket_inodes(os.getpid())),
        environ=dict(os.environ),
    )


def _leftover_processes(before: Snapshot) -> list[int]:
    """Live processes started since ``before`` that carry its marker or joined this process group."""
    needle = f"{CASE_VAR}={before.marker}".encode()
    own_group = os.getpgid(0)
    found = []
    reused = {pid for pid, started in before.start_times.items() if _start_time(pid) not in (None, started)}
    for pid in sorted(((_pids() - before.pids) | reused) - {os.getpid()}):
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        if stat[1] == own_group or _carries(pid, needle):
            found.append(pid)
    return found


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def find_leaks(before: Snapshot, *, grace: float = GRACE) -> list[str]:
    """Everything the test left behind since ``before``, one line (or block) per finding.

    Leftover processes are killed and changed environment variables restored, so the next test
    starts clean whatever this one did.
    """
    problems = []
    deadline = time.monotonic() + grace
    processes = _leftover_processes(before)
    while processes and time.monotonic() < deadline:
        time.sleep(0.05)
        processes = _leftover_processes(before)
    ports = set(_own_listening([os.getpid(), *processes], known=before.sockets).values())
    if processes:
        listing = "\n".join(f"  {line[:220]}" for line in describe_processes(processes).splitlines())
        problems.append(f"processes left running (now killed):\n{listing}")
        _kill(processes)
    if ports:
        problems.append(f"TCP ports left listening: {sorted(ports)}")
    changed = sorted(
        key
        for key in set(before.environ) | set(os.environ)
        if key not in IGNORED_ENV and before.environ.get(key) != os.environ.get(key)
    )
    if changed:
        problems.append(f"environment variables changed (now restored): {changed}")
        for key in changed:
            if key in before.environ:
                os.environ[key] = before.environ[key]
            else:
                os.environ.pop(key, None)
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            problems.append("a torch.distributed process group was left initialised in the test process")
    return problems


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Fail the test if a process, a listening port or an env var change outlives it (see the module)."""
    before = take_snapshot()
    os.environ[CASE_VAR] = before.marker
    try:
        yield
    finally:
        os.environ.pop(CASE_VAR, None)
    problems = find_leaks(before)
    if problems:
        pytest.fail("the test left things behind:\n" + "\n".join(problems), pytrace=False)
