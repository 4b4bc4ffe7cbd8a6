"""Run a test suite on pytest-xdist workers without two multi-process jobs sharing the cores.

Most of a strategy package's tests start processes (two ranks, a torchrun agent, a re-executed
script): two such tests side by side on a 2-core machine would give each rank half a core, and a
test with a time bound (a hang report within 60 s, a rank brought down within 30 s) would then
hold on a fast machine only. In-process tests have no such bound. So under ``pytest -n N
--dist loadgroup`` this plugin puts every test whose module starts processes in one xdist group
(``processes``): they run one after another on one worker, while the in-process tests spread over
the others. Use it as::

    pytest -n 2 --dist loadgroup -p phalanx.testing.scheduling core/tests

A module starts processes when its source calls one of :data:`STARTS_PROCESSES` (subprocess,
phalanx.testing's ``Job`` and ``run_*`` helpers, torchrun, multiprocessing); a test can also say
so itself with ``@pytest.mark.processes``. Without xdist the plugin changes nothing.

The group is handed to xdist's scheduler directly (:class:`ProcessGroupScheduling`): each worker
writes the ids of the tests it put in the group to a file the controller named, and the scheduler
reads them. xdist's own route, a ``@processes`` suffix on each test id, is silently lost under
pytest 9.2 (which no longer reads the attribute xdist writes), and with it the grouping: two
2-rank jobs then ran side by side.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

__all__ = ["GROUP", "STARTS_PROCESSES", "ProcessGroupScheduling", "starts_processes"]

#: The xdist group every process-starting test joins.
GROUP = "processes"
#: Calls in a test module's source that start processes.
STARTS_PROCESSES = re.compile(
    r"\b(subprocess|Popen|Job\(|run_command|run_script|run_python|run_job|run_case|run_kit|run_phalanx|run_torch_ranks|"
    r"run_in_background|start_fit|start_job|measure\(|multiprocessing|mp\.spawn|start_processes|torchrun|"
    r"pytester\.runpytest_subprocess)"
)
_by_path: dict[Path, bool] = {}


def starts_processes(path: Path) -> bool:
    """Whether the module at ``path`` starts processes (its source calls one of STARTS_PROCESSES)."""
    if path not in _by_path:
        try:
            _by_path[path] = bool(STARTS_PROCESSES.search(path.read_text(errors="replace")))
        except OSError:
            _by_path[path] = False
    return _by_path[path]


#: The variables execnet sets in every xdist worker (COLUMNS=80, LINES=24), given back the values
#: the controlling pytest had: a command's output width must not depend on how the suite is run.
_TERMINAL_VARS = ("COLUMNS", "LINES")


#: Where the controller's folder for the workers' group files is kept (config.stash).
_GROUP_FILES = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "processes: the test starts processes (xdist runs these one at a time)")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "phalanx_terminal" in workerinput:
        for name, value in workerinput["phalanx_terminal"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if workerinput is None and getattr(config.option, "numprocesses", None):
        config.stash[_GROUP_FILES] = Path(tempfile.mkdtemp(prefix="phalanx-xdist-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_GROUP_FILES, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without xdist it is never called
def pytest_configure_node(node: Any) -> None:
    """On the controller: hand each worker this process's terminal variables (see _TERMINAL_VARS)
    and the folder it writes its group's test ids to (see ProcessGroupScheduling)."""
    node.workerinput["phalanx_terminal"] = {name: os.environ.get(name) for name in _TERMINAL_VARS}
    folder = node.config.stash.get(_GROUP_FILES, None)
    if folder is not None:
        node.workerinput["phalanx_group_files"] = str(folder)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``, schedule with :class:`ProcessGroupScheduling`; otherwise xdist's own."""
    folder = config.stash.get(_GROUP_FILES, None)
    if folder is None or config.getvalue("dist") != "loadgroup":
        return None
    return ProcessGroupScheduling(config, log, folder)


try:
    from xdist.scheduler import LoadGroupScheduling as _LoadGroupScheduling
except ImportError:  # without pytest-xdist the scheduler is never asked for
    _LoadGroupScheduling = object


class ProcessGroupScheduling(_LoadGroupScheduling):  # type: ignore[misc,valid-type]
    """xdist's ``loadgroup`` scheduling, with the tests of GROUP given to one worker as one unit.

    The workers name those tests in files under ``folder`` while collecting (every worker
    collects the same tests); the scheduler reads them the first time it sorts a test into a
    unit, which xdist does only once every worker has finished collecting.
    """

    def __init__(self, config: pytest.Config, log: Any, folder: Path) -> None:
        super().__init__(config, log)
        self._folder = folder
        self._grouped: set[str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._grouped is None:
            self._grouped = set()
            for path in self._folder.glob("*.json"):
                self._grouped.update(json.loads(path.read_text()))
        if nodeid in self._grouped:
            return GROUP
        return super()._split_scope(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput")):
        return  # not under xdist: nothing to share
    root = config.rootpath
    grouped = []
    for item in items:
        if item.get_closest_marker("processes") or any(starts_processes(path) for path in _sources(item, root)):
            item.add_marker(pytest.mark.xdist_group(GROUP))
            grouped.append(item.nodeid)
    folder = getattr(config, "workerinput", {}).get("phalanx_group_files")
    if folder:  # for ProcessGroupScheduling on the controller; written whole, then renamed
        worker = config.workerinput.get("workerid", "worker")  # type: ignore[attr-defined]
        partial = Path(folder, f"{worker}.json.partial")
        partial.write_text(json.dumps(grouped))
        partial.rename(partial.with_suffix(""))


def _sources(item: pytest.Item, root: Path) -> list[Path]:
    """The test's module, the module that defines its function (a conformance kit's test is
    defined in the kit, which starts the processes, not in the module that subclasses it), and
    the conftest.py files between it and ``root`` that define a fixture it uses (a session fixture
    that runs a job makes each test using it a process-starting test)."""
    module = Path(str(item.fspath))
    paths = [module]
    function = getattr(item, "function", None)
    if function is not None:
        try:
            defined_in = inspect.getsourcefile(inspect.unwrap(function))
        except TypeError:  # a builtin or a callable object without a source file
            defined_in = None
        if defined_in is not None and Path(defined_in) != module:
            paths.append(Path(defined_in))
    names = set(getattr(item, "fixturenames", ()))
    for folder in module.parents:
        conftest = folder / "conftest.py"
        if conftest.exists() and any(re.search(rf"\bdef {re.escape(name)}\(", _source(conftest)) for name in names):
            paths.append(conftest)
        if folder == root or not folder.is_relative_to(root):
            break
    return paths


def _source(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
