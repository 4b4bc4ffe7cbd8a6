"""The test environments of the default nox run: what each holds and how it is made.

noxfile.py says which sessions run and what they run; this module makes the environments they run
in: the pinned versions, one shared install of torch, this run's wheels of every local
distribution (built once), the venv the core's, the packages' and the integration tests share, and
the xla, ray, lightning, lint and docs venvs, made on a background thread while the tests run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

import nox
import nox.command

ROOT = Path(__file__).resolve().parent.parent
TORCH = os.environ.get("PHALANX_TORCH", "torch==2.13.0")
#: torch-xla pins torch exactly, so the real XLA runs get their own session and venv (`xla`).
XLA_TORCH = ["torch==2.9.0", "torch-xla==2.9.0"]
#: The Lightning release the scripts of tests/lightning are checked against (the `lightning` session).
LIGHTNING = "lightning==2.6.6"
#: Packages with heavy optional dependencies that must be installed after torch without isolation.
NO_BUILD_ISOLATION = {"strategy-deepspeed": ["deepspeed>=0.14", "ninja"]}
#: Optional dependencies a package's tests run for real, installed as the package's extra.
EXTRAS = {"strategy-torchft": "torchft"}
#: The core's extras a package's tests need (fsdp's float8 tests run torchao for real).
CORE_EXTRAS = {"strategy-fsdp": "float8"}

PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
TEST_DEPS = ["pytest>=7", "pytest-timeout>=2"]

#: pip compiles every installed module to bytecode (torch alone has about 5000; the shared
#: environment 16000): a minute of one core per run, mostly for modules no test imports. Without
#: it, Python compiles what is imported on first import and caches it as usual.
os.environ.setdefault("PIP_NO_COMPILE", "1")

#: Each environment's versions from the last full run (``pip freeze``, local distributions left
#: out), passed to its main install as pip constraints: the resolver then checks one candidate per
#: package instead of searching (the shared environment's install took 57.5 s of CPU unconstrained,
#: 28.8 s constrained, and the core's tests wait for it). `nox -s test-times` rewrites them from the
#: environments of its run. A constrained install that fails (a pyproject.toml now asks for a
#: version the file does not admit) is run again without the file, with a line saying to refresh it.
CONSTRAINTS = ROOT / "tools" / "constraints"


def constrained(name: str, command: list[str]) -> list[str]:
    """``command`` (a pip install) with environment ``name``'s constraints file, where there is one."""
    path = CONSTRAINTS / f"{name}.txt"
    return [*command, "--constraint", str(path)] if path.exists() else command


def unconstrained(command: list[str]) -> list[str] | None:
    """``command`` without the constraints ``constrained`` added (None if it had none)."""
    if "--constraint" not in command:
        return None
    at = command.index("--constraint")
    return command[:at] + command[at + 2 :]


STALE = "the install failed with {path}: running it without the file (refresh it: `nox -s test-times`)"

#: The nice value of what runs in the background: the lowest priority (Lightning's tests run at
#: GATE_NICE in the lightning session's checks, see noxfile.py).
LOWEST = 19

#: The documentation toolchain; the API reference is read from the sources (griffe), so no torch;
#: ruff is mkdocstrings' signature formatter (without it signatures print as one long line).
DOCS_DEPS = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.26", "ruff"]
#: What Lightning's own tests import besides Lightning and pytest (the harness's list).
LIGHTNING_SUITE_DEPS = [
    "pytest-xdist>=3", "cloudpickle", "scikit-learn", "pandas", "jsonargparse[signatures]", "omegaconf", "tqdm",
    "rich", "psutil",
]  # fmt: skip


def shared_torch(session: nox.Session, spec: str = TORCH) -> Path:
    """The folder with one shared install of ``spec`` (TORCH), installed there first if it is not.

    torch is most of every session's venv (about 0.9 GB, 30 s to install); the first session of a
    run installs it with `pip --target` into .nox/shared-<spec>/ and each venv that uses it adds
    that folder to its site-packages with a .pth file (``install_torch``), so pip sees torch as
    installed and the sessions' own packages still go into their own venvs. The xla session keeps
    its own torch (torch-xla pins it).
    """
    shared = ROOT / ".nox" / ("shared-" + "".join(c if c.isalnum() or c in ".-" else "_" for c in spec))
    complete = shared / ".complete"
    if not complete.exists():
        if shared.exists():  # an install that was cut off: start again
            shutil.rmtree(shared)
        session.run(sys.executable, "-m", "pip", "install", "--quiet", "--target", str(shared), spec, external=True)
        complete.touch()
    return shared


#: A command (run in a venv by Environment) that puts the shared torch folder given as its
#: argument on that venv's path with a .pth file.
_ADD_TO_PATH = "import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], '_shared_torch.pth').write_text(sys.argv[1] + '\\n')"


def install_torch(session: nox.Session, spec: str = TORCH, *, python: str = "python") -> None:
    """Put the shared install of ``spec`` (``shared_torch``) on the path of ``python``'s venv (this session's by default)."""
    shared = shared_torch(session, spec)
    session.run(python, "-c", _ADD_TO_PATH, str(shared), external=python != "python")


# --- the local distributions: built into wheels once per run -----------------------------------

#: Every distribution of this repository, by folder: the core, the plugins, the test plugin and
#: the example vendor package.
LOCAL = {
    "core": ROOT / "core",
    **{name: ROOT / "packages" / name for name in PACKAGES},
    "testplugin": ROOT / "tests" / "plugins" / "phalanx-testplugin",
    "vendor-strategy": ROOT / "examples" / "vendor-strategy",
}
#: This run's wheels of LOCAL (rebuilt by the first session of each run that needs them).
WHEELHOUSE = ROOT / ".nox" / "wheelhouse"
_wheels: dict[str, Path] = {}


def wheel(session: nox.Session, folder: str, *, python: str = "python") -> str:
    """The path of this run's wheel of ``LOCAL[folder]``, building every local wheel on first use.

    Each distribution used to be built from its folder by every session that installed it (the
    core ten times a run, each build in a fresh isolated environment); now the first session that
    needs one builds them all, without build isolation (hatchling installed once), and every
    session installs the same files.
    """
    if not _wheels:
        shutil.rmtree(WHEELHOUSE, ignore_errors=True)
        external = python != "python"
        session.run(python, "-m", "pip", "install", "--quiet", "hatchling>=1.18", external=external)
        session.run(
            python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
            str(WHEELHOUSE), *(str(path) for path in LOCAL.values()), external=external,
        )  # fmt: skip
        for key, path in LOCAL.items():
            distribution = project(path)["name"].replace("-", "_")
            (built,) = WHEELHOUSE.glob(f"{distribution}-*.whl")
            _wheels[key] = built
    return str(_wheels[folder])


def project(folder: Path) -> dict:
    """The ``[project]`` table of ``folder``'s pyproject.toml."""
    import tomllib

    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


def entry_points(folder: str) -> list[str]:
    """The ``phalanx`` entry-point names ``LOCAL[folder]`` declares (what PHALANX_DISABLE_PLUGINS blocks)."""
    return sorted(project(LOCAL[folder]).get("entry-points", {}).get("phalanx", {}))


def install_package(session: nox.Session, name: str) -> None:
    """Install one of packages/ into the session's own venv with its heavy dependencies in order."""
    extra = NO_BUILD_ISOLATION.get(name)
    if extra:
        session.install("setuptools", "wheel", "packaging", "py-cpuinfo", "psutil")
        session.install("--no-build-isolation", *extra)
    session.install(f"./packages/{name}" + (f"[{EXTRAS[name]}]" if name in EXTRAS else ""))


# --- one environment for the core's, the packages' and the integration tests -------------------

#: The venv tests-core, every tests-<package> and integration share (they need the same set: the
#: core with every extra, every plugin, and the plugins' heavy dependencies).
SHARED_ENV = ROOT / ".nox" / "shared-env"
#: What the shared venv holds besides the local wheels (the core's extras come with its wheel).
SHARED_DEPS = [*TEST_DEPS, "pytest-xdist>=3", "moto[server]>=5"]
_shared_ready = False


def shared_env(session: nox.Session, *, plugins: bool) -> str:
    """The shared venv's python, ready for this session: with every local plugin, or the core alone.

    Made and filled once per run (the first of these sessions pays for it); every later session
    only adds or removes the local plugin wheels, which takes seconds. ``plugins=False`` removes
    them so the core's tests see a core-only install (the third-party libraries stay: with no
    plugin to load them they are inert). A package's tests run with every other plugin blocked
    through ``PHALANX_DISABLE_PLUGINS`` (see ``_package_session`` in noxfile.py), as if installed alone.
    """
    global _shared_ready
    python = str(SHARED_ENV / "bin" / "python")
    if not _shared_ready:
        if not (SHARED_ENV / "bin" / "python").exists():
            session.run(sys.executable, "-m", "venv", str(SHARED_ENV), external=True)
            session.run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip", external=True)
        install_torch(session, python=python)
        core = wheel(session, "core", python=python)
        install = constrained("shared", [python, "-m", "pip", "install", "--quiet", f"{core}[all,s3]", *SHARED_DEPS])
        try:
            session.run(*install, external=True)
        except nox.command.CommandFailed:
            retry = unconstrained(install)
            if retry is None:
                raise
            session.warn(STALE.format(path=CONSTRAINTS / "shared.txt"))
            session.run(*retry, external=True)
        for extra in NO_BUILD_ISOLATION.values():
            session.run(python, "-m", "pip", "install", "--quiet", "setuptools", "wheel", "packaging",
                        "py-cpuinfo", "psutil", external=True)  # fmt: skip
            session.run(python, "-m", "pip", "install", "--quiet", "--no-build-isolation", *extra, external=True)
        # The third-party libraries the plugins need (torchft), then every local wheel of this run.
        extras = [f"{wheel(session, name, python=python)}[{EXTRAS[name]}]" for name in EXTRAS]
        session.run(python, "-m", "pip", "install", "--quiet", *extras, external=True)
        session.run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                    *(wheel(session, key, python=python) for key in LOCAL), external=True)  # fmt: skip
        _shared_ready = True
    local_plugins = [project(path)["name"] for key, path in LOCAL.items() if key != "core"]
    if plugins:
        session.run(python, "-m", "pip", "install", "--quiet", "--no-deps",
                    *(wheel(session, key, python=python) for key in LOCAL if key != "core"), external=True)  # fmt: skip
    else:
        session.run(python, "-m", "pip", "uninstall", "--quiet", "--yes", *local_plugins, external=True)
    return python


# --- the environments of xla, ray, lightning, lint and docs: made while the tests run ----------


class Environment:
    """A venv of its own (.nox/<name>-env) for one session, made by a list of commands.

    The default run (its first session, ``environments``) starts making every one of them in the
    background, one after another on one thread, while the shared environment is filled and the
    tests run; the session that needs one waits for it there. Run alone (`nox -s xla`), a session
    makes its environment in the foreground. Installing torch-xla's torch alone takes two minutes.
    """

    def __init__(self, name: str, steps: Callable[[str], list[list[str]]]) -> None:
        self.name = name
        self.path = ROOT / ".nox" / f"{name}-env"
        self.python = str(self.path / "bin" / "python")
        self.log = ROOT / ".nox" / f"{name}-env.log"
        self._steps = steps
        self._future: Future[None] | None = None
        self.checks_log = ROOT / ".nox" / f"{name}-checks.log"
        self._checks: Future[int] | None = None
        #: The check running in the background now (at most one).
        self._running: set[subprocess.Popen[bytes]] = set()
        #: Set when the session waits for the checks: those not begun yet run at the normal priority.
        self._waited_for = False

    def commands(self) -> list[list[str]]:
        """The commands that make it: a fresh venv, then ``steps`` (pip installs with its python)."""
        shutil.rmtree(self.path, ignore_errors=True)
        return [
            [sys.executable, "-m", "venv", str(self.path)],
            [self.python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
            *self._steps(self.python),
        ]

    def start(self, commands: list[list[str]]) -> None:
        """Run ``commands`` on the background thread, their output in ``self.log``."""
        self._future = _BACKGROUND.submit(self._run, commands)

    def _run(self, commands: list[list[str]]) -> None:
        with self.log.open("w") as log:
            for command in commands:
                if _background(command, log) != 0:
                    retry = unconstrained(command)
                    if retry is None:
                        raise subprocess.CalledProcessError(1, command)
                    log.write(STALE.format(path=CONSTRAINTS / f"{self.name}.txt") + "\n")
                    if _background(retry, log) != 0:
                        raise subprocess.CalledProcessError(1, retry)

    def start_checks(self, commands: list[list[str]], env: dict[str, str] | None = None, nice: int = LOWEST) -> None:
        """Run ``commands`` (this environment's session's checks: lint, the docs build, Lightning's
        tests) on the background thread once the environments are made, at priority ``nice``;
        ``show_checks`` reports them."""
        self._checks = _BACKGROUND.submit(self._run_checks, commands, env or {}, nice)

    def _run_checks(self, commands: list[list[str]], env: dict[str, str], nice: int) -> int:
        with self.checks_log.open("w") as log:
            for command in commands:
                code = _background(command, log, env, nice=0 if self._waited_for else nice, running=self._running)
                if code != 0:
                    log.write(f"exit code {code}\n")
                    return code
        return 0

    @property
    def checks_started(self) -> bool:
        return self._checks is not None

    def show_checks(self, session: nox.Session) -> None:
        """Wait for the checks begun in the background (from now at the normal priority: nothing is
        left to make room for), print their output, fail if one failed."""
        assert self._checks is not None
        session.log(f"waiting for {session.name}'s checks, run in the background (log: {self.checks_log})")
        self._waited_for = True
        for process in list(self._running):
            _normal_priority(process.pid)
        code = self._checks.result()
        print(self.checks_log.read_text(errors="replace"), flush=True)
        if code != 0:
            session.error(f"{session.name} failed (output above, also in {self.checks_log})")

    @property
    def in_background(self) -> bool:
        """Whether this run started making it in the background (the default run does)."""
        return self._future is not None

    def ready(self, session: nox.Session) -> str:
        """This environment's python, once made (waited for, or made now in the foreground)."""
        if self._future is None:
            for command in self.commands():
                session.run(*command, external=True)
            return self.python
        session.log(f"waiting for {self.path.name}, made in the background (log: {self.log})")
        try:
            self._future.result()
        except subprocess.CalledProcessError as error:
            session.error(f"making {self.path.name} failed ({error}); its log:\n{self.log.read_text()[-6000:]}")
        return self.python

    def run(self, session: nox.Session, program: str, *args: str, **kwargs: object) -> None:
        """Run ``program`` (a console script of this environment, or ``python``) in it."""
        executable = self.python if program == "python" else str(self.path / "bin" / program)
        session.run(executable, *args, external=True, **kwargs)  # type: ignore[arg-type]


#: The thread that makes the environments in the background (one at a time: the tests need the
#: other core).
_BACKGROUND = ThreadPoolExecutor(max_workers=1, thread_name_prefix="environments")


def _low_priority(nice: int) -> None:  # pragma: no cover (runs in the child, before exec)
    """Make the child (and what it starts) take the CPU at priority ``nice``: at LOWEST only when
    the tests leave a core idle.

    A session of its own, so that with autogrouping on (Linux groups a session's processes and
    shares the CPU between groups, whatever their nice values) its group can be given the
    priority; the same nice value for kernels without autogrouping. A test job is a session of its
    own too, so what the background starts must not start test jobs (they would escape the priority).
    """
    os.setsid()
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(nice))
    except OSError:  # no autogrouping
        pass
    os.nice(nice)


def _normal_priority(pid: int) -> None:
    """Give the background session of ``pid`` (begun by _low_priority) the normal priority back."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as autogroup:
            autogroup.write("0")
    except OSError:  # it ended, or no autogrouping
        pass
    try:
        os.setpriority(os.PRIO_PGRP, pid, 0)  # its process group: the session _low_priority began
    except OSError:  # it ended, or raising a priority needs a privilege here
        pass


def _background(
    command: list[str],
    log: TextIO,
    env: dict[str, str] | None = None,
    *,
    nice: int = LOWEST,
    running: set[subprocess.Popen[bytes]] | None = None,
) -> int:
    """Run ``command`` in the background at priority ``nice``, its output in ``log``; its exit code.

    The environments and checks made here are needed minutes later, while the tests need the CPU
    now: at the lowest priority they fill the moments the tests leave a core idle (a timed test
    running alone, a session starting, a job waiting on a collective) instead of slowing the tests.
    ``running`` holds the process while it runs (for ``_normal_priority``).
    """
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                               env={**os.environ, **(env or {})}, preexec_fn=functools.partial(_low_priority, nice))  # fmt: skip
    if running is not None:
        running.add(process)
    try:
        return process.wait()
    finally:
        if running is not None:
            running.discard(process)


def _xla_steps(python: str) -> list[list[str]]:
    pip = [python, "-m", "pip", "install", "--quiet"]
    return [
        constrained("xla", [*pip, *XLA_TORCH]),
        [*pip, _WHEELS["core"], f"{_WHEELS['strategy-xla']}[xla]", *TEST_DEPS, "pytest-xdist>=3"],
        [*pip, "--no-deps", "--force-reinstall", _WHEELS["core"], _WHEELS["strategy-xla"]],
    ]


def _ray_steps(python: str) -> list[list[str]]:
    """packages/launcher-ray's tests: Ray Train (a large install: ray, pyarrow, pandas) with the core
    and the strategies its runs train under (ddp, fsdp, the example vendor's local_sgd)."""
    pip = [python, "-m", "pip", "install", "--quiet"]
    local = [_WHEELS[name] for name in ("core", "strategy-ddp", "strategy-fsdp", "vendor-strategy", "launcher-ray")]
    return [
        [python, "-c", _ADD_TO_PATH, str(_TORCH_FOLDER[TORCH])],
        constrained("ray", [*pip, *local[:-1], f"{_WHEELS['launcher-ray']}[ray]", *TEST_DEPS, "pytest-xdist>=3"]),
        [*pip, "--no-deps", "--force-reinstall", *local],
    ]


def _lightning_steps(python: str) -> list[list[str]]:
    pip = [python, "-m", "pip", "install", "--quiet"]
    plugins = [
        _WHEELS[name] for name in ("strategy-ddp", "strategy-deepspeed", "strategy-fsdp", "strategy-model-parallel")
    ]
    return [
        [python, "-c", _ADD_TO_PATH, str(_TORCH_FOLDER[TORCH])],
        constrained(
            "lightning",
            [*pip, f"{_WHEELS['core']}[tensorboard,cli,extra]", LIGHTNING, *TEST_DEPS, *LIGHTNING_SUITE_DEPS],
        ),
        [*pip, "setuptools", "wheel", "packaging", "py-cpuinfo", "psutil"],
        *([*pip, "--no-build-isolation", *extra] for extra in NO_BUILD_ISOLATION.values()),
        [*pip, *plugins],
        [*pip, "--no-deps", "--force-reinstall", _WHEELS["core"], *plugins],
    ]


def _lint_steps(python: str) -> list[list[str]]:
    return [
        [python, "-c", _ADD_TO_PATH, str(_TORCH_FOLDER[TORCH])],
        constrained("lint", [python, "-m", "pip", "install", "--quiet", "ruff", "mypy", "pluggy", "packaging"]),
    ]


def _docs_steps(python: str) -> list[list[str]]:
    return [constrained("docs", [python, "-m", "pip", "install", "--quiet", *DOCS_DEPS])]


#: The environments, in the order the background thread makes them (the order the sessions run).
ENVIRONMENTS = {
    name: Environment(name, steps)
    for name, steps in (
        ("xla", _xla_steps),
        ("ray", _ray_steps),
        ("lightning", _lightning_steps),
        ("lint", _lint_steps),
        ("docs", _docs_steps),
    )
}
#: This run's local wheels by LOCAL key, and the shared torch folder by spec, once ``prepare`` made them.
_WHEELS: dict[str, str] = {}
_TORCH_FOLDER: dict[str, Path] = {}


def prepare(session: nox.Session, *, torch: bool = True) -> None:
    """Build the local wheels (and, with ``torch``, the shared torch) the environments' commands name."""
    if not _WHEELS:
        _WHEELS.update({key: wheel(session, key, python=sys.executable) for key in LOCAL})
    if torch and TORCH not in _TORCH_FOLDER:
        _TORCH_FOLDER[TORCH] = shared_torch(session)
