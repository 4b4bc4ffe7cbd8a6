"""Developer and CI sessions. `nox` runs the default set (every package's tests, integration, lint).

Sessions use pip in virtualenvs. torch is pinned to one CPU build for tests (TORCH in
tools/nox_environments.py, which makes every environment the sessions run in); package metadata
keeps a wide range, so users install whatever torch fits their machine.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "tools"))

from nox_environments import (  # noqa: E402  (tools/ is put on the path just above)
    ENVIRONMENTS,
    LOCAL,
    PACKAGES,
    TEST_DEPS,
    TORCH,
    entry_points,
    install_package,
    install_torch,
    prepare,
    shared_env,
)

#: The variable that blocks plugins by entry-point name (phalanx reads it at discovery).
DISABLE = "PHALANX_DISABLE_PLUGINS"

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True
#: Packages whose tests run in an environment of their own (made in the background), not the shared
#: one; their sessions come after the others', when the environment is ready.
OWN_ENVIRONMENT = {"launcher-ray": "ray"}
nox.options.sessions = [
    "environments",
    "tests-core",
    *[f"tests-{p}" for p in PACKAGES if p not in OWN_ENVIRONMENT],
    *[f"tests-{p}" for p in PACKAGES if p in OWN_ENVIRONMENT],
    "integration",
    "xla",
    "lightning",
    "lint",
    "docs",
]


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


#: pytest-xdist, WORKERS tests at a time (a 2-rank job keeps about one core busy); a test marked
#: ``timing`` runs with the machine to itself, and a module, or the tests sharing a job-running
#: session fixture, stay on one worker (phalanx.testing.scheduling).
XDIST = ["--dist", "loadgroup", "-p", "phalanx.testing.scheduling"]
WORKERS = 2
#: Sessions whose tests mostly wait (torchft's quorums and heals keep about 1.2 cores busy with two
#: workers): a third test at a time fills the idle core.
MORE_WORKERS = {"tests-strategy-torchft": 3}
#: Sessions with tests marked ``waits`` (a hang waited out asleep): one worker more than WORKERS, and
#: at most WORKERS tests at once that are not so marked (``--phalanx-cpu-slots``), so a third test
#: runs while one of them waits and two that work never share the machine with a third.
CPU_SLOTS = {"integration"}
#: Per session, each test's seconds in the last ``nox -s test-times`` run (written there through
#: RECORD_DURATIONS): the scheduler starts the longest units of work first.
DURATIONS_DIR = ROOT / "tools" / "test-durations"
RECORD_DURATIONS = "PHALANX_RECORD_DURATIONS"


def _pytest_command(
    session: nox.Session, name: str, *paths: str, python: str = "python", workers: int = 0
) -> list[str]:
    """The pytest command of session ``name`` on ``paths``, on ``workers`` xdist workers (0: none),
    recording per-test times (JUNIT_DIR) and the slowest tests (--durations: where trimming starts)."""
    JUNIT_DIR.mkdir(parents=True, exist_ok=True)
    junit = f"--junitxml={JUNIT_DIR / (name + '.xml')}"
    durations = f"--phalanx-durations={DURATIONS_DIR / (name + '.json')}"
    xdist = ["-n", str(workers), *XDIST, durations] if workers else []
    if workers and name in CPU_SLOTS:
        xdist = ["-n", str(workers + 1), *XDIST, durations, "--phalanx-cpu-slots", str(workers)]
    if workers and os.environ.get(RECORD_DURATIONS) == "1":
        xdist.append("--phalanx-record-durations")
    return [python, "-m", "pytest", *paths, "-ra", "--durations=25", junit, *xdist, *session.posargs]


def _pytest(
    session: nox.Session,
    *paths: str,
    env: dict[str, str] | None = None,
    python: str = "python",
    workers: bool = False,
) -> None:
    """Run pytest on ``paths`` (on xdist workers if ``workers``): with a guest beside it (BESIDE)
    started first, on WORKERS workers, else on MORE_WORKERS' count or WORKERS."""
    guests = [guest for guest, host in BESIDE.items() if host == session.name and _start_guest(session, guest)]
    count = WORKERS if guests else MORE_WORKERS.get(session.name, WORKERS)
    command = _pytest_command(session, session.name, *paths, python=python, workers=count if workers else 0)
    session.run(*command, env={**(env or {}), **_lock_env()}, external=python != "python")


#: Sessions whose tests run beside another session's tests in the default run, guest -> host: a
#: guest keeps about one core of two busy alone (measured: tests-launcher-ray 1.01, xla 1.12), so
#: beside a host it fills the idle core instead of taking a turn. When the host begins, the guest's
#: pytest starts in the background (once its environment, made in the background, is ready) on
#: BESIDE_WORKERS workers; the guest's own session then waits for it and shows its output. Every
#: pytest run shares one machine lock (SHARED_LOCK), so a timed test of either still has the machine
#: to itself, which is why the hosts are sessions without timed tests: beside tests-strategy-torchft
#: (about 100 s of timed tests first) the Ray tests waited them out, and the two took 276 s against
#: an estimated 263 s one after the other. Run on its own (`nox -s tests-launcher-ray`), a guest runs
#: as any session does.
BESIDE = {"tests-launcher-ray": "tests-strategy-fsdp", "xla": "integration"}
BESIDE_WORKERS = {"tests-launcher-ray": 1, "xla": 1}
#: guest -> its pytest running in the background, the file with its output, when it began.
_guests: dict[str, tuple[subprocess.Popen[bytes], Path, float]] = {}
#: guest -> the environment it runs in, its test paths and its variables.
GUEST_RUNS = {
    "tests-launcher-ray": ("ray", ["packages/launcher-ray/tests"], {}),
    # a skip for want of torch-xla fails there (packages/strategy-xla/tests/xla_required.py)
    "xla": ("xla", ["packages/strategy-xla/tests"], {"PJRT_DEVICE": "CPU", "PHALANX_REQUIRE_TORCH_XLA": "1"}),
}
#: The machine lock's folder of the default run, and the variable that names it to
#: phalanx.testing.scheduling (its SHARED_LOCK; nox's own venv has no phalanx to import it from).
_LOCK_FOLDER = ROOT / ".nox" / "machine-lock"
SHARED_LOCK = "PHALANX_MACHINE_LOCK"


def _lock_env() -> dict[str, str]:
    """In the default run (environments made in the background), the variable that makes every
    pytest run share one machine lock, so that a guest and its host respect each other's timed tests."""
    if not any(environment.in_background for environment in ENVIRONMENTS.values()):
        return {}
    _LOCK_FOLDER.mkdir(parents=True, exist_ok=True)
    return {SHARED_LOCK: str(_LOCK_FOLDER)}


def _start_guest(session: nox.Session, guest: str) -> bool:
    """Start ``guest``'s pytest in the background if its environment was made in the background."""
    environment, paths, env = GUEST_RUNS[guest]
    if not ENVIRONMENTS[environment].in_background:  # not the default run: the guest runs in its turn
        return False
    python = ENVIRONMENTS[environment].ready(session)
    command = _pytest_command(session, guest, *paths, python=python, workers=BESIDE_WORKERS[guest])
    output = ROOT / ".nox" / f"{guest}.beside.log"
    session.log(f"{guest}: {' '.join(command)} (beside {session.name}, output in {output})")
    with output.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env={**os.environ, **env, **_lock_env()})  # fmt: skip
    atexit.register(process.kill)  # nox stopped early (Ctrl-C, a crash): the guest goes with it
    _guests[guest] = (process, output, time.time())
    return True


def _run_guest(session: nox.Session, *, workers: bool) -> None:
    """A guest's session: wait for its pytest begun beside its host and show its output, or run it
    now (on xdist workers if ``workers``) where it was not begun."""
    if session.name not in _guests:
        environment, paths, env = GUEST_RUNS[session.name]
        prepare(session)
        python = ENVIRONMENTS[environment].ready(session)
        _pytest(session, *paths, env=env, python=python, workers=workers)
        return
    process, output, started = _guests[session.name]
    session.log(f"waiting for {session.name}'s tests, begun beside {BESIDE[session.name]}")
    code = process.wait()
    print(output.read_text(errors="replace"), flush=True)
    ran = output.stat().st_mtime - started  # pytest's last line is written as it ends
    session.log(f"{session.name}'s tests ran {ran:.0f} s beside {BESIDE[session.name]}")
    if code != 0:
        session.error(f"{session.name}'s tests failed (exit {code}; output above, also in {output})")


@_session(venv_backend="none")
def environments(session: nox.Session) -> None:
    """Start making the xla, ray, lightning, lint and docs environments in the background (first in the default run).

    They are ready, or nearly, by the time their sessions come: the minutes of installing
    torch-xla's torch, Lightning and the linters overlap the tests instead of adding to them, at
    the lowest CPU priority, so they take only the time the tests leave idle. The lint and docs
    checks follow there too; their sessions show the results.
    """
    prepare(session, torch=False)
    started = ["xla"]  # torch-xla brings its own torch: start it before the shared torch is there
    ENVIRONMENTS["xla"].start(ENVIRONMENTS["xla"].commands())
    prepare(session)
    for name, environment in ENVIRONMENTS.items():
        if name not in started:
            environment.start(environment.commands())
    for environment in ENVIRONMENTS.values():
        session.log(f"making {environment.path.name} in the background (log: {environment.log})")
    # The lint, docs and Lightning-gate checks need nothing the tests make: they run once their
    # environments are made, also at a low priority, and their sessions report them.
    ENVIRONMENTS["lint"].start_checks(_lint_commands())
    ENVIRONMENTS["docs"].start_checks(_docs_command(["--clean"]), env=DOCS_ENV)
    # Lightning's tests on phalanx (a minute of both cores) take the time the sessions in between
    # leave idle; the lightning session runs its own scripts under Lightning, then shows these.
    ENVIRONMENTS["lightning"].start_checks(_lightning_checks(), nice=GATE_NICE)


@_session(name="tests-core", venv_backend="none")
def tests_core(session: nox.Session) -> None:
    """Core unit tests: registries, discovery, contracts, Trainer on one device, with every optional
    backend installed (logger backends, jsonargparse, matplotlib, rich) so each is tested for real;
    no plugin package is installed."""
    _pytest(session, "core/tests", python=shared_env(session, plugins=False), workers=True)


def _package_session(name: str) -> None:
    @_session(name=f"tests-{name}", venv_backend="none")
    def run(session: nox.Session) -> None:
        python = shared_env(session, plugins=True)
        others = [ep for key in LOCAL if key not in ("core", name) for ep in entry_points(key)]
        _pytest(session, f"packages/{name}/tests", python=python, env={DISABLE: ",".join(others)}, workers=True)

    run.__doc__ = f"Tests of packages/{name}, every other plugin blocked (as if installed with the core only)."


for _name in PACKAGES:
    if _name not in OWN_ENVIRONMENT:
        _package_session(_name)


@_session(name="tests-launcher-ray", venv_backend="none")
def tests_launcher_ray(session: nox.Session) -> None:
    """packages/launcher-ray on a real local Ray cluster, in a venv of its own made in the background
    (Ray Train's install is large: it stays off the shared environment's critical path): the core,
    the package with ray[train], and the strategies its runs train under (ddp, fsdp, local_sgd). In
    the default run its tests run beside tests-strategy-fsdp's (BESIDE)."""
    _run_guest(session, workers=True)


@_session(venv_backend="none")
def integration(session: nox.Session) -> None:
    """Everything installed together, plus the test plugin and the example vendor package (its
    own distribution, tested as its vendor would): discovery and end-to-end runs."""
    python = shared_env(session, plugins=True)
    # tests/remote: a real S3 API server (moto's server mode) on loopback, driven through s3fs
    _pytest(
        session, "tests", "examples/vendor-strategy/tests", env={"PHALANX_REQUIRE_S3": "1"}, python=python, workers=True
    )
    # The benchmarks' smoke run (`nox -s bench -- --quick`, every script for a few steps, about 5
    # minutes) is not part of this session: `nox -s bench -- --quick` runs it.


@_session(venv_backend="none")
def xla(session: nox.Session) -> None:
    """packages/strategy-xla on real torch-xla (XLA:CPU) in its own venv: torch-xla pins its torch.
    In the default run its tests run beside integration's (BESIDE)."""
    _run_guest(session, workers=False)


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

    In the default run steps 2 and 3 run in the background once the lightning environment is made
    (at nice GATE_NICE: they take the time the sessions in between leave idle), and this session
    shows their output after step 1.
    """
    prepare(session)
    env = ENVIRONMENTS["lightning"]
    env.ready(session)
    _pytest(
        session,
        "tests/lightning/test_under_lightning.py",
        env={"PHALANX_REQUIRE_LIGHTNING": "1"},
        python=env.python,
        workers=True,
    )
    if env.checks_started:  # steps 2 and 3 ran in the background (see `environments`)
        env.show_checks(session)
        return
    for command in _lightning_checks():
        session.run(*command, external=True)


def _lightning_checks() -> list[list[str]]:
    """Steps 2 and 3 of the lightning session: the surface, Lightning's tests on phalanx (the gate)."""
    python = ENVIRONMENTS["lightning"].python
    return [
        [python, "tools/lightning_surface.py"],
        [python, "tools/lightning_suite.py", "gate", "--if-found", "--min", str(LIGHTNING_SUITE_MIN),
         "--cases-per-test", str(LIGHTNING_SUITE_CASES)],
    ]  # fmt: skip


#: The priority (nice value) of the gate's run in the background of the default run: not the lowest,
#: where a fully busy machine (a loaded one) could stall a Lightning test past its 120 s timeout,
#: but low enough to take about a tenth of a core from a busy session's tests.
GATE_NICE = 10


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


def _lint_commands() -> list[list[str]]:
    env = ENVIRONMENTS["lint"]
    return [
        [str(env.path / "bin" / "ruff"), "check", "core", "packages", "tests", "tools", "examples", "benchmarks",
         "noxfile.py"],
        [env.python, "tools/check_layering.py"],
        [str(env.path / "bin" / "mypy"), "core/src/phalanx"],
    ]  # fmt: skip


def _docs_command(args: list[str]) -> list[list[str]]:
    return [[str(ENVIRONMENTS["docs"].path / "bin" / "mkdocs"), "build", "--strict", *args]]


DOCS_ENV = {"NO_MKDOCS_2_WARNING": "1"}


@_session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff, mypy on the core, and the layering rule (core imports no plugin; _plugin.py no torch).

    In the default run they ran in the background (see ``environments``): this shows their output."""
    env = ENVIRONMENTS["lint"]
    if env.checks_started:
        env.show_checks(session)
        return
    prepare(session)
    env.ready(session)
    for command in _lint_commands():
        session.run(*command, external=True)


@_session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ in strict mode: a broken link or reference fails.

    The snippets of docs/ and README.md run in the integration session (tests/docs), where every
    plugin they use is installed; `nox -s docs -- --dirty` keeps the previous site/ contents. In
    the default run the build ran in the background (see ``environments``): this shows its output.
    """
    env = ENVIRONMENTS["docs"]
    if env.checks_started and not session.posargs:
        env.show_checks(session)
        return
    env.ready(session)
    for command in _docs_command(session.posargs or ["--clean"]):
        session.run(*command, external=True, env=DOCS_ENV)


@nox.session
def demo(session: nox.Session) -> None:
    """Install the core with the ddp and fsdp plugins, list strategies, train the demo model under each.

    With no arguments: single_device, ddp (2 processes) and fsdp (2 processes) and one table of their
    losses, wall time and peak memory. `nox -s demo -- --strategy ddp --devices 2` runs one strategy.
    """
    install_torch(session)
    session.install("./core")
    for name in ("strategy-ddp", "strategy-fsdp"):
        install_package(session, name)
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
    install_torch(session)
    session.install("./core[tensorboard]", "psutil", "matplotlib", "pytorch-lightning>=2.6,<2.7")
    for name in PACKAGES:  # every plugin: `phalanx strategies` is timed with all of them installed
        install_package(session, name)
    session.install("./tests/plugins/phalanx-testplugin")
    session.run("python", "benchmarks/run_all.py", *session.posargs, env={"DS_ACCELERATOR": "cpu"})


@nox.session(name="test-times", venv_backend="none")
def test_times(session: nox.Session) -> None:
    """Run the default sessions, then write docs/test-times.md: each session's time and the slowest
    tests, tools/test-durations/ (every test's seconds, for the scheduler) and tools/constraints/
    (each environment's versions, pip constraints for the next runs) (not default)."""
    SESSION_TIMES.unlink(missing_ok=True)
    shutil.rmtree(JUNIT_DIR, ignore_errors=True)
    session.run(
        sys.executable, "-m", "nox", "--noxfile", str(ROOT / "noxfile.py"), external=True, env={RECORD_DURATIONS: "1"}
    )
    session.run(sys.executable, str(ROOT / "tools" / "test_times.py"), external=True)
    session.run(sys.executable, str(ROOT / "tools" / "freeze_environments.py"), external=True)


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
    install_torch(session, torch_spec)
    session.install("./core", *TEST_DEPS)
    folders = [f for f in KIT_PACKAGES if f not in KIT_ELSEWHERE and _has_kit(f) and _admits(f, torch_spec)]
    for folder in folders:
        name = folder.split("/", 1)[1]
        if folder.startswith("packages/"):
            install_package(session, name)
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
