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
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

__all__ = ["GROUP", "STARTS_PROCESSES", "starts_processes"]

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "processes: the test starts processes (xdist runs these one at a time)")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "phalanx_terminal" in workerinput:
        for name, value in workerinput["phalanx_terminal"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without xdist it is never called
def pytest_configure_node(node: Any) -> None:
    """On the controller: hand each worker this process's terminal variables (see _TERMINAL_VARS)."""
    node.workerinput["phalanx_terminal"] = {name: os.environ.get(name) for name in _TERMINAL_VARS}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput")):
        return  # not under xdist: nothing to share
    root = config.rootpath
    for item in items:
        if item.get_closest_marker("processes") or any(starts_processes(path) for path in _sources(item, root)):
            item.add_marker(pytest.mark.xdist_group(GROUP))


def _sources(item: pytest.Item, root: Path) -> list[Path]:
    """The test's module and the conftest.py files between it and ``root`` that define a fixture it
    uses (a session fixture that runs a job makes each test using it a process-starting test)."""
    module = Path(str(item.fspath))
    paths = [module]
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
