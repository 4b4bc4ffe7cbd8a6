"""Is `phalanx strategies` fast enough? Times it and `import phalanx` as fresh processes.

Run: python benchmarks/bench_cli.py [--repeat 10] [--target 0.15]

Listing runs every installed plugin's registration hooks and judges every requirement from
installed metadata, in a new interpreter each time, so its cost is start-up cost: imports and
metadata reads. Each command is run ``--repeat`` times; the median wall time and the median CPU
time (user + system of the child, which a loaded machine inflates far less than wall time) are
printed together with the installed plugins, so a figure is never quoted without what it measured.
Exits 1 when the median wall time of `phalanx strategies` reaches the target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

__all__ = ["main"]


def _run_once(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command`` (CPU counted from the child's rusage)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        msg = f"{' '.join(command)!r} exited with {process.returncode}; run it by hand to see why"
        raise SystemExit(msg)
    return wall, usage.ru_utime + usage.ru_stime


def _medians(command: list[str], repeat: int) -> tuple[float, float]:
    _run_once(command)  # warm the page cache so the first sample is not an outlier
    samples = [_run_once(command) for _ in range(repeat)]
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def _installed_plugins() -> list[str]:
    code = "import json, phalanx.cli as c; from phalanx.plugins import plugin_records as r; print(json.dumps([(p.name, p.distribution, p.version, p.status) for p in r()]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [f"{name} ({dist} {version}, {status})" for name, dist, version, status in json.loads(out)]


def main() -> int:
    """Print the medians; return 1 when `phalanx strategies` misses the target."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="runs per command (default 10)")
    parser.add_argument("--target", type=float, default=0.15, help="seconds `phalanx strategies` must stay under")
    args = parser.parse_args()
    py = sys.executable
    commands = {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import phalanx'": [py, "-c", "import phalanx"],
        "phalanx strategies": [py, "-m", "phalanx.cli", "strategies"],
    }
    print("plugins: " + "; ".join(_installed_plugins()))
    print(f"{'command':<28} {'wall s':>8} {'cpu s':>8}   (medians of {args.repeat} runs)")
    results = {}
    for name, command in commands.items():
        results[name] = _medians(command, args.repeat)
        print(f"{name:<28} {results[name][0]:>8.3f} {results[name][1]:>8.3f}")
    wall = results["phalanx strategies"][0]
    if wall >= args.target:
        print(f"FAIL: phalanx strategies took {wall:.3f} s, target < {args.target} s")
        return 1
    print(f"ok: phalanx strategies {wall:.3f} s < {args.target} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
