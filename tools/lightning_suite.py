"""Lightning's own public-API tests, renamed, on phalanx: the figure, and a gate for CI.

The Lightning-suite harness (a folder holding Lightning 2.6.6's ``tests/tests_pytorch`` and the
scripts that select its public-API tests, rename them and run them on real Lightning and on
phalanx; its ``run.sh`` prints the full comparison) takes several minutes per tree. CI needs only
the phalanx side: which tests pass under Lightning is fixed for a pinned Lightning release, so a
full run's list of Lightning-passing tests is kept in ``tests/lightning/suite-lightning-passed.txt``
and the gate runs just those, renamed, on phalanx::

    python tools/lightning_suite.py record RESULTS.json   # after a full run.sh: keep its Lightning-passing tests
    python tools/lightning_suite.py gate [--min 95]        # run them on phalanx; exit 1 below the target

The harness is found through ``PHALANX_LIGHTNING_SUITE`` or beside the checkout
(``../shared/lightning-suite``). ``gate`` runs in an environment with Lightning (its tests decide
skips with Lightning's own helpers), phalanx with its plugins, pytest-xdist and pytest-timeout: the
``lightning`` nox session.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSED_LIST = ROOT / "tests" / "lightning" / "suite-lightning-passed.txt"
#: The share of Lightning-passing tests that must pass on phalanx (the issue's target).
TARGET = 95.0


def harness() -> Path | None:
    """The harness folder: ``PHALANX_LIGHTNING_SUITE``, else ``../shared/lightning-suite`` beside the checkout."""
    given = os.environ.get("PHALANX_LIGHTNING_SUITE")
    for candidate in ([Path(given)] if given else []) + [ROOT.parent / "shared" / "lightning-suite"]:
        if (candidate / "build_trees.py").exists():
            return candidate
    return None


def record(results: Path) -> int:
    """Write PASSED_LIST: the renamed node ids of the tests that passed on Lightning in ``results``."""
    where = harness()
    if where is None:
        print("Lightning's test suite (the harness) was not found: set PHALANX_LIGHTNING_SUITE to its folder")
        return 2
    sys.path.insert(0, str(where))
    from common import rename  # the harness's rename rule: a test phalanx never collected has no phx id

    tests = json.loads(results.read_text())["tests"]
    passed = sorted(t["nodeid_phx"] or rename(t["nodeid"]) for t in tests if t["base"]["outcome"] == "passed")
    header = (
        "# Lightning's public-API tests (renamed to phalanx) that pass on Lightning 2.6.6, from a full run of\n"
        "# the Lightning-suite harness (run.sh); `python tools/lightning_suite.py gate` runs them on phalanx.\n"
    )
    PASSED_LIST.write_text(header + "\n".join(passed) + "\n")
    print(f"wrote {len(passed)} tests to {PASSED_LIST.relative_to(ROOT)}")
    return 0


def _nodeid(tests: Path, classname: str, name: str) -> str:
    """pytest's node id from a JUnit ``classname`` (dotted module path, then any classes) and test name."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if (tests / module).exists():
            return "::".join([module, *parts[cut:], name])
    return f"{classname}::{name}"


def _outcomes(junit: Path, tests: Path) -> dict[str, str]:
    """Node id -> passed / failed / error / skipped, from pytest's JUnit XML."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        nodeid = _nodeid(tests, case.get("classname", ""), case.get("name", ""))
        kinds = {child.tag for child in case}
        found[nodeid] = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
    return found


def spread(nodeids: list[str], cases_per_test: int) -> list[str]:
    """At most ``cases_per_test`` cases of each parametrized test, spread evenly over its cases (its
    first and last among them); every unparametrized test; 0 keeps everything. Order is kept."""
    if cases_per_test <= 0:
        return list(nodeids)
    cases: dict[str, list[str]] = {}
    for nodeid in nodeids:
        cases.setdefault(nodeid.split("[", 1)[0], []).append(nodeid)
    kept: set[str] = set()
    for group in cases.values():
        if len(group) <= cases_per_test:
            kept.update(group)
        elif cases_per_test == 1:
            kept.add(group[0])
        else:
            last = len(group) - 1
            kept.update(group[round(i * last / (cases_per_test - 1))] for i in range(cases_per_test))
    return [nodeid for nodeid in nodeids if nodeid in kept]


def gate(minimum: float, workers: int, *, if_found: bool = False, cases_per_test: int = 0) -> int:
    """Run the recorded tests on phalanx; print the figure and the failures; 1 below ``minimum`` percent.

    ``cases_per_test`` > 0 runs at most that many cases of each parametrized test (:func:`spread`):
    Lightning's spike-detection test alone has 24 two-process cases, most of the suite's time.
    Without the harness: exit 2, or 0 with ``if_found`` (the message says the gate did not run).
    """
    where = harness()
    if where is None:
        print("Lightning's test suite (the harness) was not found: set PHALANX_LIGHTNING_SUITE to its folder; "
              "the gate did not run")  # fmt: skip
        return 0 if if_found else 2
    recorded = [line for line in PASSED_LIST.read_text().splitlines() if line and not line.startswith("#")]
    wanted = spread(recorded, cases_per_test)
    if len(wanted) < len(recorded):
        print(f"running {len(wanted)} of the {len(recorded)} recorded tests: at most {cases_per_test} cases per test")
    work = Path(tempfile.mkdtemp(prefix="lightning-suite-"))
    env = {**os.environ, "PYTHONPATH": str(where), "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run(
        [sys.executable, str(where / "build_trees.py"), str(where / "lightning-src"), str(work)], check=True, env=env
    )
    tests = work / "phx" / "tests"
    junit = work / "junit.xml"
    # Collect the files first: one that does not import fails its own tests only (a node id in it would
    # stop pytest, and a collection error stops xdist).
    args = work / "nodeids.txt"
    args.write_text("\n".join(sorted({nodeid.split("::", 1)[0] for nodeid in wanted})) + "\n")
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    listed = subprocess.run(
        [*pytest, "--collect-only", "-q", f"@{args}"], cwd=tests, env=env, capture_output=True, text=True
    )
    collected = [line for line in listed.stdout.splitlines() if line in set(wanted)]
    args.write_text("\n".join(collected) + "\n")
    command = [*pytest, "-q", "--timeout", "120", f"--junitxml={junit}", *(["-n", str(workers)] if workers else [])]
    if collected:
        subprocess.run([*command, f"@{args}"], cwd=tests, env=env, check=False)
    got = _outcomes(junit, tests) if junit.exists() else {}
    base = {nodeid.split("[", 1)[0] for nodeid in got}
    passed = [n for n in wanted if got.get(n) == "passed"]
    failed = [n for n in wanted if got.get(n) != "passed"]
    share = 100.0 * len(passed) / len(wanted)
    for nodeid in failed:
        state = got.get(nodeid) or ("not run" if nodeid.split("[", 1)[0] not in base else "missing")
        print(f"  {state:8s} {nodeid}")
    print(
        f"Lightning's public-API tests on phalanx: {len(passed)} / {len(wanted)} = {share:.1f} % (target {minimum:.0f} %)"
    )
    return 0 if share >= minimum else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="keep a full run's Lightning-passing tests")
    rec.add_argument("results", type=Path, help="last-results.json of a full run.sh")
    run = sub.add_parser("gate", help="run the kept tests on phalanx; exit 1 below the target")
    run.add_argument("--min", type=float, default=TARGET, help=f"the target in percent (default {TARGET:.0f})")
    run.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (0: none)")
    run.add_argument("--if-found", action="store_true", help="exit 0 (saying so) when the harness is not found")
    run.add_argument(
        "--cases-per-test", type=int, default=0, help="run at most K cases of each parametrized test (0: all)"
    )
    args = parser.parse_args(argv)
    if args.command == "record":
        return record(args.results)
    return gate(args.min, args.workers, if_found=args.if_found, cases_per_test=args.cases_per_test)


if __name__ == "__main__":
    raise SystemExit(main())
