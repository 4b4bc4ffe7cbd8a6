"""Developer and CI sessions. `nox` runs the default set (every package's tests, integration, lint).

Sessions use pip in virtualenvs. torch is pinned to one CPU build for tests (TORCH below); package
metadata keeps a wide range, so users install whatever torch fits their machine.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import nox

ROOT = Path(__file__).parent
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
#: The variable that blocks plugins by entry-point name (phalanx reads it at discovery).
DISABLE = "PHALANX_DISABLE_PLUGINS"

#: pip compiles every installed module to bytecode (torch alone has about 5000; the shared
#: environment 16000): a minute of one core per run, mostly for modules no test imports. Without
#: it, Python compiles what is imported on first import and caches it as usual.
os.environ.setdefault("PIP_NO_COMPILE", "1")

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "environments",
    "tests-core",
    *[f"tests-{p}" for p in PACKAGES],
    "integration",
    "xla",
    "lightning",
    "lint",
    "docs",
]
#: The documentation toolchain; the API reference is read from the sources (griffe), so no torch;
#: ruff is mkdocstrings' signature formatter (without it signatures print as one long line).
DOCS_DEPS = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.26", "ruff"]


#: Each session's wall time in the last run (``_session`` writes it; tools/test_times.py reads it).
SESSION_TIMES = ROOT / ".nox" / "session-times.json"
#: Each pytest run's per-test times (JUnit XML, one file per session; tools/test_times.py reads them).
JUNIT_DIR = ROOT / ".nox" / "junit"


def _session(*args: object, **kwargs: object):
    """``nox.session`` that also records the session's wall time in SESSION_TIMES.

    The record is how the suite's cost is measured and kept in view (``nox -s test-times``
    regenerates docs/test-times.md from a full run).
    """

    def decorate(func):
        @functools.wraps(func)
        def timed(session: nox.Session, *a: object, **k: object) -> None:
            start = time.monotonic()
            try:
                func(session, *a, **k)
            finally:
                seconds = round(time.monotonic() - start, 1)
                SESSION_TIMES.parent.mkdir(parents=True, exist_ok=True)
                times = json.loads(SESSION_TIMES.read_text()) if SESSION_TIMES.exists() else {}
                times[session.name] = seconds
                SESSION_TIMES.write_text(json.dumps(times, indent=1) + "\n")
                session.log(f"{session.name} took {seconds:.0f} s")

        return nox.session(timed, *args, **kwargs)

    return decorate


def _shared_torch(session: nox.Session, spec: str = TORCH) -> Path:
    """The folder with one shared install of ``spec`` (TORCH), installed there first if it is not.

    torch is most of every session's venv (about 0.9 GB, 30 s to install); the first session of a
    run installs it with `pip --target` into .nox/shared-<spec>/ and each venv that uses it adds
    that folder to its site-packages with a .pth file (``_install_torch``), so pip sees torch as
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


#: A command (run in a venv by _Environment) that puts the shared torch folder given as its
#: argument on that venv's path with a .pth file.
_ADD_TO_PATH = "import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], '_shared_torch.pth').write_text(sys.argv[1] + '\\n')"


def _install_torch(session: nox.Session, spec: str = TORCH, *, python: str = "python") -> None:
    """Put the shared install of ``spec`` (``_shared_torch``) on the path of ``python``'s venv (this session's by default)."""
    shared = _shared_torch(session, spec)
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


def _wheel(session: nox.Session, folder: str, *, python: str = "python") -> str:
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
            project = _project(path)["name"].replace("-", "_")
            (wheel,) = WHEELHOUSE.glob(f"{project}-*.whl")
            _wheels[key] = wheel
    return str(_wheels[folder])


def _project(folder: Path) -> dict:
    """The ``[project]`` table of ``folder``'s pyproject.toml."""
    import tomllib

    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


def _entry_points(folder: str) -> list[str]:
    """The ``phalanx`` entry-point names ``LOCAL[folder]`` declares (what PHALANX_DISABLE_PLUGINS blocks)."""
    return sorted(_project(LOCAL[folder]).get("entry-points", {}).get("phalanx", {}))


#: pytest-xdist on two workers, two tests at a time (a 2-rank job keeps about one core busy); a
#: test marked ``timing`` runs with the machine to itself, and a module, or the tests sharing a
#: job-running session fixture, stay on one worker (phalanx.testing.scheduling).
XDIST = ["-n", "2", "--dist", "loadgroup", "-p", "phalanx.testing.scheduling"]
#: Per session, each test's seconds in the last ``nox -s test-times`` run (written there through
#: RECORD_DURATIONS): the scheduler starts the longest units of work first.
DURATIONS_DIR = ROOT / "tools" / "test-durations"
RECORD_DURATIONS = "PHALANX_RECORD_DURATIONS"


def _pytest(
    session: nox.Session,
    *paths: str,
    env: dict[str, str] | None = None,
    python: str = "python",
    workers: bool = False,
) -> None:
    """Run pytest on ``paths`` (on XDIST's workers if ``workers``), recording per-test times (JUNIT_DIR)."""
    # --durations: the slowest tests in every CI log, where trimming the suite starts
    JUNIT_DIR.mkdir(parents=True, exist_ok=True)
    junit = f"--junitxml={JUNIT_DIR / (session.name + '.xml')}"
    xdist = [*XDIST, f"--phalanx-durations={DURATIONS_DIR / (session.name + '.json')}"] if workers else []
    if workers and os.environ.get(RECORD_DURATIONS) == "1":
        xdist.append("--phalanx-record-durations")
    session.run(
        python, "-m", "pytest", *paths, "-ra", "--durations=25", junit, *xdist, *session.posargs,
        env=env, external=python != "python",
    )  # fmt: skip


def _install_package(session: nox.Session, name: str) -> None:
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


def _shared_env(session: nox.Session, *, plugins: bool) -> str:
    """The shared venv's python, ready for this session: with every local plugin, or the core alone.

    Made and filled once per run (the first of these sessions pays for it); every later session
    only adds or removes the local plugin wheels, which takes seconds. ``plugins=False`` removes
    them so the core's tests see a core-only install (the third-party libraries stay: with no
    plugin to load them they are inert). A package's tests run with every other plugin blocked
    through ``PHALANX_DISABLE_PLUGINS`` (see ``_package_session``), as if installed alone.
    """
    global _shared_ready
    python = str(SHARED_ENV / "bin" / "python")
    if not _shared_ready:
        if not (SHARED_ENV / "bin" / "python").exists():
            session.run(sys.executable, "-m", "venv", str(SHARED_ENV), external=True)
            session.run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip", external=True)
        _install_torch(session, python=python)
        core = _wheel(session, "core", python=python)
        session.run(python, "-m", "pip", "install", "--quiet", f"{core}[all,s3]", *SHARED_DEPS, external=True)
        for extra in NO_BUILD_ISOLATION.values():
            session.run(python, "-m", "pip", "install", "--quiet", "setuptools", "wheel", "packaging",
                        "py-cpuinfo", "psutil", external=True)  # fmt: skip
            session.run(python, "-m", "pip", "install", "--quiet", "--no-build-isolation", *extra, external=True)
        # The third-party libraries the plugins need (torchft), then every local wheel of this run.
        extras = [f"{_wheel(session, name, python=python)}[{EXTRAS[name]}]" for name in EXTRAS]
        session.run(python, "-m", "pip", "install", "--quiet", *extras, external=True)
        session.run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                    *(_wheel(session, key, python=python) for key in LOCAL), external=True)  # fmt: skip
        _shared_ready = True
    local_plugins = [_project(path)["name"] for key, path in LOCAL.items() if key != "core"]
    if plugins:
        session.run(python, "-m", "pip", "install", "--quiet", "--no-deps",
                    *(_wheel(session, key, python=python) for key in LOCAL if key != "core"), external=True)  # fmt: skip
    else:
        session.run(python, "-m", "pip", "uninstall", "--quiet", "--yes", *local_plugins, external=True)
    return python


# --- the environments of xla, lightning, lint and docs: made while the tests run ---------------


class _Environment:
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
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=ROOT)

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


def _xla_steps(python: str) -> list[list[str]]:
    pip = [python, "-m", "pip", "install", "--quiet"]
    return [
        [*pip, *XLA_TORCH],
        [*pip, _WHEELS["core"], f"{_WHEELS['strategy-xla']}[xla]", *TEST_DEPS],
        [*pip, "--no-deps", "--force-reinstall", _WHEELS["core"], _WHEELS["strategy-xla"]],
    ]


def _lightning_steps(python: str) -> list[list[str]]:
    pip = [python, "-m", "pip", "install", "--quiet"]
    plugins = [
        _WHEELS[name] for name in ("strategy-ddp", "strategy-deepspeed", "strategy-fsdp", "strategy-model-parallel")
    ]
    return [
        [python, "-c", _ADD_TO_PATH, str(_TORCH_FOLDER[TORCH])],
        [*pip, f"{_WHEELS['core']}[tensorboard,cli,extra]", LIGHTNING, *TEST_DEPS, *LIGHTNING_SUITE_DEPS],
        [*pip, "setuptools", "wheel", "packaging", "py-cpuinfo", "psutil"],
        *([*pip, "--no-build-isolation", *extra] for extra in NO_BUILD_ISOLATION.values()),
        [*pip, *plugins],
        [*pip, "--no-deps", "--force-reinstall", _WHEELS["core"], *plugins],
    ]


def _lint_steps(python: str) -> list[list[str]]:
    return [
        [python, "-c", _ADD_TO_PATH, str(_TORCH_FOLDER[TORCH])],
        [python, "-m", "pip", "install", "--quiet", "ruff", "mypy", "pluggy", "packaging"],
    ]


def _docs_steps(python: str) -> list[list[str]]:
    return [[python, "-m", "pip", "install", "--quiet", *DOCS_DEPS]]


#: The environments, in the order the background thread makes them (the order the sessions run).
ENVIRONMENTS = {
    name: _Environment(name, steps)
    for name, steps in (
        ("xla", _xla_steps),
        ("lightning", _lightning_steps),
        ("lint", _lint_steps),
        ("docs", _docs_steps),
    )
}
#: This run's local wheels by LOCAL key, and the shared torch folder by spec, once ``_prepare`` made them.
_WHEELS: dict[str, str] = {}
_TORCH_FOLDER: dict[str, Path] = {}


def _prepare(session: nox.Session, *, torch: bool = True) -> None:
    """Build the local wheels (and, with ``torch``, the shared torch) the environments' commands name."""
    if not _WHEELS:
        _WHEELS.update({key: _wheel(session, key, python=sys.executable) for key in LOCAL})
    if torch and TORCH not in _TORCH_FOLDER:
        _TORCH_FOLDER[TORCH] = _shared_torch(session)


@_session(venv_backend="none")
def environments(session: nox.Session) -> None:
    """Start making the xla, lightning, lint and docs environments in the background (first in the default run).

    They are ready, or nearly, by the time their sessions come: the minutes of installing
    torch-xla's torch, Lightning and the linters overlap the tests instead of adding to them.
    """
    _prepare(session, torch=False)
    started = ["xla"]  # torch-xla brings its own torch: start it before the shared torch is there
    ENVIRONMENTS["xla"].start(ENVIRONMENTS["xla"].commands())
    _prepare(session)
    for name, environment in ENVIRONMENTS.items():
        if name not in started:
            environment.start(environment.commands())
    for environment in ENVIRONMENTS.values():
        session.log(f"making {environment.path.name} in the background (log: {environment.log})")


@_session(name="tests-core", venv_backend="none")
def tests_core(session: nox.Session) -> None:
    """Core unit tests: registries, discovery, contracts, Trainer on one device, with every optional
    backend installed (logger backends, jsonargparse, matplotlib, rich) so each is tested for real;
    no plugin package is installed."""
    _pytest(session, "core/tests", python=_shared_env(session, plugins=False), workers=True)


def _package_session(name: str) -> None:
    @_session(name=f"tests-{name}", venv_backend="none")
    def run(session: nox.Session) -> None:
        python = _shared_env(session, plugins=True)
        others = [ep for key in LOCAL if key not in ("core", name) for ep in _entry_points(key)]
        _pytest(session, f"packages/{name}/tests", python=python, env={DISABLE: ",".join(others)}, workers=True)

    run.__doc__ = f"Tests of packages/{name}, every other plugin blocked (as if installed with the core only)."


for _name in PACKAGES:
    _package_session(_name)


@_session(venv_backend="none")
def integration(session: nox.Session) -> None:
    """Everything installed together, plus the test plugin and the example vendor package (its
    own distribution, tested as its vendor would): discovery and end-to-end runs."""
    python = _shared_env(session, plugins=True)
    # tests/remote: a real S3 API server (moto's server mode) on loopback, driven through s3fs
    _pytest(
        session, "tests", "examples/vendor-strategy/tests", env={"PHALANX_REQUIRE_S3": "1"}, python=python, workers=True
    )
    # The benchmarks' smoke run (`nox -s bench -- --quick`, every script for a few steps, about 5
    # minutes) is not part of this session: `nox -s bench -- --quick` runs it.


@_session(venv_backend="none")
def xla(session: nox.Session) -> None:
    """packages/strategy-xla on real torch-xla (XLA:CPU) in its own venv: torch-xla pins its torch."""
    _prepare(session)
    env = ENVIRONMENTS["xla"]
    env.ready(session)
    # A skip for want of torch-xla fails here (packages/strategy-xla/tests/xla_required.py).
    _pytest(
        session, "packages/strategy-xla/tests", env={"PJRT_DEVICE": "CPU", "PHALANX_REQUIRE_TORCH_XLA": "1"},
        python=env.python,
    )  # fmt: skip


@_session()
def lightning(session: nox.Session) -> None:
    """Lightning beside phalanx: the scripts of tests/lightning under real Lightning, and Lightning's own tests on phalanx.

    1. The scripts of tests/lightning unmodified under real Lightning: the integration session runs
       the same scripts renamed to phalanx (tests/lightning/rename.py); this proves they are genuine
       Lightning programs and that the expected numbers are Lightning's. A Lightning that does not
       import fails here instead of skipping.
    2. The API surface of both, module path by module path (tools/lightning_surface.py).
    3. Lightning's own public-API tests, renamed, on phalanx (tools/lightning_suite.py gate): the
       session fails when fewer than LIGHTNING_SUITE_MIN % of those that pass on Lightning pass on phalanx
       (at most LIGHTNING_SUITE_CASES cases of each parametrized test). The
       harness with Lightning's tests lives outside this repository (PHALANX_LIGHTNING_SUITE, or
       ../shared/lightning-suite beside the checkout); where it is absent this step says so and is
       not run.
    """
    _prepare(session)
    env = ENVIRONMENTS["lightning"]
    env.ready(session)
    _pytest(
        session, "tests/lightning/test_under_lightning.py", env={"PHALANX_REQUIRE_LIGHTNING": "1"}, python=env.python
    )
    env.run(session, "python", "tools/lightning_surface.py")
    env.run(session, "python", "tools/lightning_suite.py", "gate", "--if-found", "--min", str(LIGHTNING_SUITE_MIN),
                "--cases-per-test", str(LIGHTNING_SUITE_CASES))  # fmt: skip


#: The share (percent) of Lightning's passing public-API tests that must pass on phalanx for the
#: lightning session to pass: the target is 95 and the suite is at 95.1 % (369 of 388); the gate
#: sits a margin below, so one slow test on a loaded machine does not fail the run, and a real
#: regression (20 tests) does.
LIGHTNING_SUITE_MIN = 90
#: At most this many cases of each parametrized Lightning test run in the session (274 of the 388
#: recorded tests, about a third of the time: Lightning's spike-detection test alone has 24
#: two-process cases, 60 % of the whole list's time). `tools/lightning_suite.py gate` without
#: `--cases-per-test`, or the harness's run.sh, runs them all.
LIGHTNING_SUITE_CASES = 3
#: What Lightning's own tests import besides Lightning and pytest (the harness's list).
LIGHTNING_SUITE_DEPS = [
    "pytest-xdist>=3", "cloudpickle", "scikit-learn", "pandas", "jsonargparse[signatures]", "omegaconf", "tqdm",
    "rich", "psutil",
]  # fmt: skip


@_session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff, mypy on the core, and the layering rule (core imports no plugin; _plugin.py no torch)."""
    _prepare(session)
    env = ENVIRONMENTS["lint"]
    env.ready(session)
    env.run(session, "ruff", "check", "core", "packages", "tests", "tools", "examples", "benchmarks", "noxfile.py")
    env.run(session, "python", "tools/check_layering.py")
    env.run(session, "mypy", "core/src/phalanx")


@_session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ in strict mode: a broken link or reference fails.

    The snippets of docs/ and README.md run in the integration session (tests/docs), where every
    plugin they use is installed; `nox -s docs -- --dirty` keeps the previous site/ contents.
    """
    env = ENVIRONMENTS["docs"]
    env.ready(session)
    env.run(session, "mkdocs", "build", "--strict", *(session.posargs or ["--clean"]), env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def demo(session: nox.Session) -> None:
    """Install the core with the ddp and fsdp plugins, list strategies, train the demo model under each.

    With no arguments: single_device, ddp (2 processes) and fsdp (2 processes) and one table of their
    losses, wall time and peak memory. `nox -s demo -- --strategy ddp --devices 2` runs one strategy.
    """
    _install_torch(session)
    session.install("./core")
    for name in ("strategy-ddp", "strategy-fsdp"):
        _install_package(session, name)
    session.run("phalanx", "strategies")
    session.run("python", "examples/demo.py", *(session.posargs or ["--compare"]))


@nox.session
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks against raw PyTorch and Lightning (not in the default run; minutes).

    `nox -s bench` runs all, prints every target row and writes docs/img/bench_*.json and .png;
    `nox -s bench -- bench_ddp.py` runs the named scripts only; `nox -s bench -- --quick` runs each
    for a few steps. Lightning is installed here for its comparison rows only; phalanx never
    depends on it.
    """
    _install_torch(session)
    session.install("./core[tensorboard]", "psutil", "matplotlib", "pytorch-lightning>=2.6,<2.7")
    for name in PACKAGES:  # every plugin: `phalanx strategies` is timed with all of them installed
        _install_package(session, name)
    session.install("./tests/plugins/phalanx-testplugin")
    session.run("python", "benchmarks/run_all.py", *session.posargs, env={"DS_ACCELERATOR": "cpu"})


@nox.session(name="test-times", venv_backend="none")
def test_times(session: nox.Session) -> None:
    """Run the default sessions, then write docs/test-times.md: each session's time and the slowest
    tests, and tools/test-durations/ (every test's seconds, for the scheduler) (not default)."""
    SESSION_TIMES.unlink(missing_ok=True)
    shutil.rmtree(JUNIT_DIR, ignore_errors=True)
    session.run(
        sys.executable, "-m", "nox", "--noxfile", str(ROOT / "noxfile.py"), external=True, env={RECORD_DURATIONS: "1"}
    )
    session.run(sys.executable, str(ROOT / "tools" / "test_times.py"), external=True)


#: The oldest torch the compat session checks every kit against (beside TORCH, the newest). The
#: packages' metadata admits older releases; this is the oldest the project runs its kits on, the
#: release torch-xla pins (see the xla session).
COMPAT_TORCH = os.environ.get("PHALANX_COMPAT_TORCH", "torch==2.9.0")
#: Where the reports and compat sessions look for kits: packages/* plus the example vendor package.
KIT_PACKAGES = [f"packages/{name}" for name in PACKAGES] + ["examples/vendor-strategy"]
#: Kits that need what these sessions do not install; they run in their own session.
KIT_ELSEWHERE = {"packages/strategy-xla": "needs torch-xla, which pins its own torch: `nox -s xla`"}


def _has_kit(folder: str) -> bool:
    """Whether the package's tests subclass one of phalanx.testing's kits (a class ``...Conformance``)."""
    kit = re.compile(r"^class \w+\([^)]*Conformance\b", re.MULTILINE)
    return any(kit.search(path.read_text()) for path in (ROOT / folder / "tests").rglob("*.py"))


def _admits(folder: str, torch_spec: str) -> bool:
    """Whether the package's own torch requirement admits the pinned ``torch==X`` of ``torch_spec``."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement

    pinned = torch_spec.split("==", 1)[1]
    project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
    torch_reqs = [Requirement(r) for r in project.get("dependencies", []) if Requirement(r).name == "torch"]
    return all(req.specifier.contains(pinned, prereleases=True) for req in torch_reqs)


def _run_kits(session: nox.Session, torch_spec: str, report_for: dict[str, Path]) -> None:
    """Install every kit package for ``torch_spec`` and run each one's kit, writing its report.

    The kits are selected by their marker (``-m phalanx_conformance``), so whatever kit classes a
    package's tests define run, and nothing else. A package without one is listed, not failed; a
    kit that fails fails the session after every package has run.
    """
    _install_torch(session, torch_spec)
    session.install("./core", *TEST_DEPS)
    folders = [f for f in KIT_PACKAGES if f not in KIT_ELSEWHERE and _has_kit(f) and _admits(f, torch_spec)]
    for folder in folders:
        name = folder.split("/", 1)[1]
        if folder.startswith("packages/"):
            _install_package(session, name)
            session.install(f"./{folder}[test]")  # test extras: torchft's tests need torchft
        else:
            session.install(f"./{folder}")
    failed, without = [], [f for f in KIT_PACKAGES if not _has_kit(f)]
    for folder in folders:
        report = report_for[folder]
        report.unlink(missing_ok=True)
        command = ["python", "-m", "pytest", f"{folder}/tests", "-m", "phalanx_conformance", "-p", "no:cacheprovider"]
        # Exit 1 (a check failed) and 5 (no kit test) are read from the report; anything else aborts.
        session.run(
            *command, "-q", f"--phalanx-report={report}", success_codes=[0, 1, 5], env={"DS_ACCELERATOR": "cpu"}
        )
        data = json.loads(report.read_text()) if report.exists() else {"plugins": []}
        if not data["plugins"]:
            report.unlink(missing_ok=True)
            without.append(folder)
        elif any(entry["outcome"] != "passed" for entry in data["plugins"]):
            failed.append(f"{folder} (see {report})")
    skipped = sorted(set(KIT_PACKAGES) - set(folders) - set(without))
    session.log(f"kits run under {torch_spec}: {', '.join(f for f in folders if f not in without)}")
    session.log(f"no kit class in their tests: {', '.join(without) or 'none'}")
    reasons = [f"{f} ({KIT_ELSEWHERE.get(f, 'its torch range excludes ' + torch_spec)})" for f in skipped]
    session.log(f"not run here: {', '.join(reasons) or 'none'}")
    if failed:
        session.error(f"conformance kits failed under {torch_spec}: {', '.join(failed)}")


def _shipped_report(folder: str) -> Path:
    (module,) = [p for p in (ROOT / folder / "src").iterdir() if p.is_dir() and not p.name.endswith(".egg-info")]
    return module / "phalanx-report.json"


@nox.session
def reports(session: nox.Session) -> None:
    """Run every package's conformance kit under TORCH and write the report it ships (not default).

    Each report lands in the package as ``src/<module>/phalanx-report.json``: the file
    ``phalanx plugins --verified`` reads once installed and docs/plugin-index.md is built from.
    Commit the changed reports; core/tests/test_verified_report.py checks they match the core.
    """
    _run_kits(session, TORCH, {folder: _shipped_report(folder) for folder in KIT_PACKAGES})
    # The core's built-ins: single_device and the other kinds' kits run on the built-in plugins.
    session.install("./core[all]")  # the built-in loggers' backends (tensorboard) for their kit
    builtin = [
        "core/tests/test_conformance_single_device.py",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "core/tests/testing_kits").glob("test_builtin_*.py")),
    ]
    session.run(
        "python",
        "-m",
        "pytest",
        *builtin,
        "-q",
        "-p",
        "no:cacheprovider",
        "--phalanx-report=core/src/phalanx/phalanx-report.json",
    )


@nox.session
@nox.parametrize("torch", [COMPAT_TORCH, TORCH], ids=["oldest", "newest"])
def compat(session: nox.Session, torch: str) -> None:
    """Every package's conformance kit under the oldest supported torch and the newest (not default).

    `nox -s compat` runs both; `nox -s "compat(oldest)"` one. The reports go to
    .nox/compat-reports/<torch>/ (the shipped ones are not touched); a package whose torch range
    excludes the torch is listed, not run. PHALANX_COMPAT_TORCH picks another oldest release.
    """
    out = ROOT / ".nox" / "compat-reports" / torch.replace("==", "-")
    out.mkdir(parents=True, exist_ok=True)
    _run_kits(session, torch, {folder: out / f"{folder.replace('/', '_')}.json" for folder in KIT_PACKAGES})
