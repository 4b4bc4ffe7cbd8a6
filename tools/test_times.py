"""Where the test suite's time goes: each nox session's wall time and the slowest tests.

Every default nox session records its wall time in ``.nox/session-times.json`` and each pytest
run writes JUnit XML (per-test times) to ``.nox/junit/<session>.xml`` (see noxfile.py). This
tool turns the last run's records into docs/test-times.md::

    python tools/test_times.py              # render docs/test-times.md from the last run's records
    python tools/test_times.py --print      # print the page instead of writing it

``nox -s test-times`` runs the default sessions first, then this tool, so the page always shows
one whole run. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SESSION_TIMES = ROOT / ".nox" / "session-times.json"
JUNIT_DIR = ROOT / ".nox" / "junit"
PAGE = ROOT / "docs" / "test-times.md"
#: How many of the slowest tests the page lists.
SLOWEST = 30


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def _tests(session: str) -> tuple[int, float, list[tuple[float, str]]]:
    """(test count, summed test time, per-test times) of one session's JUnit file."""
    path = JUNIT_DIR / f"{session}.xml"
    if not path.exists():
        return 0, 0.0, []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append((float(case.get("time", 0.0)), name))
    return len(cases), sum(t for t, _ in cases), cases


def render(note: str = "") -> str:
    """The page: a table of sessions (wall time, tests, test time), then the slowest tests.

    ``note`` is printed under the heading: what else the machine was doing, for instance.
    """
    if not SESSION_TIMES.exists():
        msg = f"no session times at {SESSION_TIMES.relative_to(ROOT)}: run `nox` (or `nox -s test-times`) first"
        raise SystemExit(msg)
    times: dict[str, float] = json.loads(SESSION_TIMES.read_text())
    cores = os.cpu_count()
    lines = [
        "# Test suite times",
        "",
        f"One full `nox` run (the README's test command) on {cores} CPU cores, recorded "
        f"{datetime.date.today().isoformat()}; `nox -s test-times` runs the suite again and rewrites this page.",
        "Wall time includes each session's installs; test time is the sum of pytest's per-test times",
        "(larger than the wall time where two xdist workers ran tests side by side).",
        *([f"{note}"] if note else []),
        "",
        "| session | wall time | tests | test time |",
        "|---|---:|---:|---:|",
    ]
    slow: list[tuple[float, str, str]] = []
    for session, seconds in times.items():
        count, total, cases = _tests(session)
        lines.append(f"| `{session}` | {_minutes(seconds)} | {count or ''} | {_minutes(total) if count else ''} |")
        slow.extend((t, session, name) for t, name in cases)
    lines.append(f"| **all** | **{_minutes(sum(times.values()))}** | | |")
    lines += ["", f"## The {SLOWEST} slowest tests", "", "| seconds | session | test |", "|---:|---|---|"]
    for t, session, name in sorted(slow, reverse=True)[:SLOWEST]:
        lines.append(f"| {t:.1f} | `{session}` | `{name}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the page instead of writing docs/test-times.md")
    parser.add_argument("--note", default="", help="a sentence under the heading (e.g. how loaded the machine was)")
    args = parser.parse_args(argv)
    page = render(args.note)
    if args.print:
        sys.stdout.write(page)
    else:
        PAGE.write_text(page)
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
