"""Run a test suite on pytest-xdist workers: two tests at a time, a test with a time bound alone.

Most of a strategy package's tests start processes (two ranks, a torchrun agent, a re-executed
script). Measured on 2 cores, such a job keeps about one core busy on average: its ranks start one
after another, wait for each other at the rendezvous and in collectives, and rank 0 alone writes
the results. So two of them side by side fill the machine instead of oversubscribing it (one after
another, the integration tests took 877 s; two at a time, 476 s). A test that holds a wall-clock
bound (a hang report within 60 s, a failing rank bringing the job down within 3 s) is different:
it must see the machine it would see alone. Under ``pytest -n 2`` this plugin

- makes every test hold a lock on the machine while it runs (setup, call and teardown): *shared*
  by default, so the two workers run side by side; *exclusive* for a test marked
  ``@pytest.mark.timing``, which waits for the other worker's test to end and keeps it waiting
  until its own has (a turnstile keeps a waiting timed test from being starved by shared ones);
  the wait happens before pytest-timeout's clock starts;
- hands xdist's scheduler units of work (:class:`ScopeScheduling`): a test is a unit of its own,
  but a module whose tests share a fixture of that module is one unit (a module-scoped fixture
  that runs a job runs it once), and the tests that use a fixture outliving one test defined in
  another file that starts processes (a session fixture in a ``conftest.py`` running a job that
  several modules read) form one unit, so that job runs once too, on one worker;
- runs the timed tests as one block: they form one unit, handed out first, and a worker keeps the
  exclusive lock from one timed test to the next. Timed tests spread over the run made the other
  worker wait, each time, for whatever long test it had just begun to end (measured on the core's
  tests: a worker idle 126 s of 276 s); one block pays that wait once;
- with ``--phalanx-cpu-slots N``, lets at most N tests run at once unless they are marked
  ``@pytest.mark.waits`` (a test asleep for most of its run: a hang waited out until its report,
  a restart's delay): each other test holds one of N slots. Run with one worker more than slots,
  a third test runs beside two while one of them only waits, and two tests that work never
  share the machine with more than each other.

Use it as::

    pytest -n 2 --dist loadgroup -p phalanx.testing.scheduling core/tests

With ``--phalanx-durations FILE`` (a JSON object, test id to seconds, from an earlier run; see
``--phalanx-record-durations``) the units start longest first, so that the run does not end with
one worker alone on a long test begun late; a test the file does not know counts
:data:`UNKNOWN_SECONDS`.

A file starts processes when its source calls one of :data:`STARTS_PROCESSES` (subprocess,
phalanx.testing's ``Job`` and ``run_*`` helpers, torchrun, multiprocessing). Without xdist the
plugin changes nothing.

The units reach xdist's scheduler directly: each worker writes the units it found to a file the
controller named, and the scheduler reads them. xdist's own route for groups, an ``@group``
suffix on each test id, is silently lost under pytest 9.2 (which no longer reads the attribute
xdist writes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import fcntl
except ImportError:  # not POSIX: no machine lock (tests then run as xdist schedules them)
    fcntl = None  # type: ignore[assignment]

__all__ = ["SHARED_LOCK", "STARTS_PROCESSES", "ScopeScheduling", "TIMING", "UNKNOWN_SECONDS", "WAITS", "starts_processes"]

#: The marker of a test that holds a wall-clock bound: it runs with the machine to itself.
TIMING = "timing"
#: The marker of a test asleep for most of its run: it takes none of ``--phalanx-cpu-slots``.
WAITS = "waits"
#: How often a test waiting for a CPU slot looks for a free one (one test at a time looks).
SLOT_POLL_SECONDS = 0.05
#: A folder for the machine lock shared by several pytest runs at once (two sessions' tests side by
#: side): a timed test of either then waits for the other's tests too. Unset: each run has its own.
#: The controlling pytest takes it out of its environment, so its tests' processes do not inherit it.
SHARED_LOCK = "PHALANX_MACHINE_LOCK"
#: The unit of work of every timed test (outside a job-running fixture's unit): one block, first.
_TIMED_UNIT = "tests marked timing"
#: What a test missing from the durations file is assumed to take (a new test: most are quick).
UNKNOWN_SECONDS = 1.0
#: Calls in a source file that start processes.
STARTS_PROCESSES = re.compile(
    r"\b(subprocess|Popen|Job\(|run_command|run_script|run_python|run_job|run_case|run_kit|run_phalanx|run_torch_ranks|"
    r"run_in_background|start_fit|start_job|measure\(|multiprocessing|mp\.spawn|start_processes|torchrun|"
    r"pytester\.runpytest_subprocess)"
)
_by_path: dict[Path, bool] = {}


def starts_processes(path: Path) -> bool:
    """Whether the source file at ``path`` starts processes (it calls one of STARTS_PROCESSES)."""
    if path not in _by_path:
        _by_path[path] = bool(STARTS_PROCESSES.search(_source(path)))
    return _by_path[path]


#: The variables execnet sets in every xdist worker (COLUMNS=80, LINES=24), given back the values
#: the controlling pytest had: a command's output width must not depend on how the suite is run.
_TERMINAL_VARS = ("COLUMNS", "LINES")
#: The controller's folder for the workers' unit files and the machine lock (config.stash).
_FOLDER = pytest.StashKey[Path]()
#: The SHARED_LOCK folder the controller was given (config.stash), if any: the lock's folder then.
_LOCK_FOLDER = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("phalanx scheduling", "phalanx.testing.scheduling (under pytest-xdist)")
    group.addoption(
        "--phalanx-durations", metavar="FILE", default=None,
        help="per-test seconds of an earlier run (JSON: test id -> seconds); units of work start longest first",
    )  # fmt: skip
    group.addoption(
        "--phalanx-record-durations", action="store_true", default=False,
        help="write this run's per-test seconds (setup + call + teardown) to the --phalanx-durations file",
    )  # fmt: skip
    group.addoption(
        "--phalanx-cpu-slots", metavar="N", type=int, default=0,
        help=f"at most N tests at once that are not marked {WAITS} (give xdist more workers than N)",
    )  # fmt: skip


#: Per test id, the seconds its reports took in this run (setup + call + teardown; controller).
_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    path = config.getoption("phalanx_durations", None)
    if not path or not config.getoption("phalanx_record_durations", False) or hasattr(config, "workerinput"):
        return
    seconds = {nodeid: round(value, 2) for nodeid, value in sorted(_seconds.items())}
    partial = Path(f"{path}.{os.getpid()}.tmp")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text(json.dumps(seconds, indent=0) + "\n")
    partial.replace(path)


def _read_durations(path: str | None) -> dict[str, float]:
    """The ``--phalanx-durations`` file's test id -> seconds ({} when there is none yet)."""
    if not path:
        return {}
    try:
        return {str(k): float(v) for k, v in json.loads(Path(path).read_text()).items()}
    except FileNotFoundError:
        return {}


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "phalanx_terminal" in workerinput:
        for name, value in workerinput["phalanx_terminal"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if workerinput is None and getattr(config.option, "numprocesses", None):
        config.stash[_FOLDER] = Path(tempfile.mkdtemp(prefix="phalanx-xdist-"))
    if workerinput is None:
        # Taken out of the environment before the workers start: the processes the tests start
        # (a nested pytest run among them) must not take a lock their own test already holds.
        shared = os.environ.pop(SHARED_LOCK, None)
        if shared:
            config.stash[_LOCK_FOLDER] = Path(shared)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without xdist it is never called
def pytest_configure_node(node: Any) -> None:
    """On the controller: hand each worker this process's terminal variables (see _TERMINAL_VARS)
    and the folder of the unit files and the machine lock."""
    node.workerinput["phalanx_terminal"] = {name: os.environ.get(name) for name in _TERMINAL_VARS}
    folder = node.config.stash.get(_FOLDER, None)
    if folder is not None:
        node.workerinput["phalanx_folder"] = str(folder)
        node.workerinput["phalanx_lock"] = str(node.config.stash.get(_LOCK_FOLDER, folder))
        node.workerinput["phalanx_cpu_slots"] = node.config.getoption("phalanx_cpu_slots", 0)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``, schedule with :class:`ScopeScheduling`; otherwise xdist's own."""
    folder = config.stash.get(_FOLDER, None)
    if folder is None or config.getvalue("dist") != "loadgroup":
        return None
    return ScopeScheduling(config, log, folder)


try:
    from xdist.scheduler import LoadScopeScheduling as _LoadScopeScheduling
except ImportError:  # without pytest-xdist the scheduler is never asked for
    _LoadScopeScheduling = object


class ScopeScheduling(_LoadScopeScheduling):  # type: ignore[misc,valid-type]
    """xdist's scope scheduling with this plugin's units of work.

    A test is a unit of its own, unless it uses a fixture that outlives one test: one defined in
    its own module makes the module one unit (the fixture runs once), one defined in another file
    that starts processes (a session fixture of a ``conftest.py`` running a job) puts it in one
    unit with every test using a fixture of that file (the job runs once, on one worker). The
    workers write each test's unit to a file under ``folder`` while collecting (every worker
    collects the same tests); the scheduler reads them the first time it sorts a test into a
    unit, which xdist does only once every worker has finished collecting.
    """

    def __init__(self, config: pytest.Config, log: Any, folder: Path) -> None:
        super().__init__(config, log)
        self._folder = folder
        self._units: dict[str, str] | None = None
        self._durations = _read_durations(config.getoption("phalanx_durations", None))
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:
            self._units = {}
            for path in self._folder.glob("*.units.json"):
                self._units.update(json.loads(path.read_text()))
        return self._units.get(nodeid, nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:
            self._ordered = True
            self._order()
        super()._assign_work_unit(node)

    def _order(self) -> None:
        """The timed block first (while it runs the other worker only waits, so it is best over
        before the end, where one worker may have nothing left to do), then, given durations, the
        longest units first (ties keep xdist's order)."""
        cost = {
            scope: sum(self._durations.get(nodeid, UNKNOWN_SECONDS) for nodeid in tests)
            for scope, tests in self.workqueue.items()
        }
        order = sorted(self.workqueue, key=lambda scope: (scope != _TIMED_UNIT, -cost[scope] if self._durations else 0))
        for scope in order:
            self.workqueue.move_to_end(scope)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = getattr(config, "workerinput", {}).get("phalanx_folder")
    if not folder:
        return  # not an xdist worker of this plugin's controller
    units = {item.nodeid: _unit(item) for item in items}
    worker = config.workerinput.get("workerid", "worker")  # type: ignore[attr-defined]
    partial = Path(folder, f"{worker}.units.json.partial")  # written whole, then renamed
    partial.write_text(json.dumps(units))
    partial.rename(partial.with_suffix(""))


#: The lock a worker still holds from its last test: a timed test followed by another keeps it.
_held: list[contextlib.ExitStack] = []


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run the test holding the machine: exclusively if marked TIMING, shared otherwise (xdist only),
    and, under ``--phalanx-cpu-slots``, one CPU slot unless it is marked WAITS.

    A timed test whose next test on this worker is timed too keeps the exclusive lock for it.
    """
    workerinput = getattr(item.config, "workerinput", {})
    folder = workerinput.get("phalanx_lock")
    if not folder or fcntl is None:
        return (yield)
    timed = _timed(item)
    if not _held:
        stack = contextlib.ExitStack()
        stack.enter_context(_machine(Path(folder), exclusive=timed))
        slots = workerinput.get("phalanx_cpu_slots", 0)
        if slots and not timed and item.get_closest_marker(WAITS) is None:
            stack.enter_context(_cpu_slot(Path(workerinput["phalanx_folder"]), slots))
        _held.append(stack)
    try:
        return (yield)
    finally:
        if not (timed and nextitem is not None and _timed(nextitem)):
            _held.pop().close()


def _timed(item: pytest.Item) -> bool:
    return item.get_closest_marker(TIMING) is not None


@contextlib.contextmanager
def _machine(folder: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the machine lock (a readers-writer lock of two flock'ed files) while the block runs.

    Every test passes the turnstile before taking the lock; a timed test keeps the turnstile until
    it has the lock exclusively, so tests arriving meanwhile queue behind it instead of starving it.
    """
    assert fcntl is not None
    with open(folder / "turnstile", "a") as turnstile, open(folder / "machine", "a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


@contextlib.contextmanager
def _cpu_slot(folder: Path, slots: int) -> Iterator[None]:
    """Hold one of ``slots`` CPU slots (flock'ed files in this run's ``folder``) while the block runs.

    Waiting tests queue on one lock; the first in the queue looks for a free slot every
    SLOT_POLL_SECONDS (flock cannot wait for any one of several files). A worker that dies
    releases its slot with its files.
    """
    assert fcntl is not None
    held = None
    with open(folder / "slot-queue", "a") as queue:
        fcntl.flock(queue, fcntl.LOCK_EX)
        try:
            while held is None:
                for index in range(slots):
                    handle = open(folder / f"slot-{index}", "a")  # noqa: SIM115 (kept open while held)
                    try:
                        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        handle.close()
                        continue
                    held = handle
                    break
                else:
                    time.sleep(SLOT_POLL_SECONDS)
        finally:
            fcntl.flock(queue, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()


def _unit(item: pytest.Item) -> str:
    """The unit of work ``item`` belongs to (see ScopeScheduling).

    Fixtures are found by their source: a ``@pytest.fixture(scope=...)`` other than "function"
    whose ``def`` names one of the test's fixtures (``item.fixturenames``, which includes the
    fixtures its fixtures use), in the test's module or a ``conftest.py`` between it and the
    rootdir.
    """
    module = Path(str(item.fspath))
    names = set(getattr(item, "fixturenames", ()))
    root = item.config.rootpath
    own_shared = _defines_shared_fixture(module, names)
    job_files = []
    for folder in module.parents:
        conftest = folder / "conftest.py"
        if conftest.exists() and starts_processes(conftest) and _defines_shared_fixture(conftest, names):
            job_files.append(conftest)
        if folder == root or not folder.is_relative_to(root):
            break
    if job_files:
        return "fixtures of " + ", ".join(str(path) for path in job_files)
    if _timed(item):
        return _TIMED_UNIT  # one block (a module's shared fixture still runs once: its tests stay in order)
    if own_shared:
        return item.nodeid.split("::", 1)[0]
    return item.nodeid


#: A fixture that outlives one test: ``@pytest.fixture(... scope="module" ...)`` (or class,
#: package, session), possibly under further decorators, then its ``def``.
_SHARED_FIXTURE = re.compile(
    r"@pytest\.fixture\([^)]*scope=[\"'](?:class|module|package|session)[\"'][^)]*\)\s*(?:@[^\n]*\n\s*)*def (\w+)\("
)
_shared_fixtures: dict[Path, set[str]] = {}


def _defines_shared_fixture(path: Path, names: set[str]) -> bool:
    """Whether ``path`` defines a fixture that outlives one test under one of ``names``."""
    if path not in _shared_fixtures:
        _shared_fixtures[path] = set(_SHARED_FIXTURE.findall(_source(path)))
    return bool(_shared_fixtures[path] & names)


def _source(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
