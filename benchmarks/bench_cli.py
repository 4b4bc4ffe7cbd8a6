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

from _bench import Row, finish, spread

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


def _installed_plugins() -> list[str]:
    code = "import json, phalanx.cli as c; from phalanx.discovery import plugin_records as r; print(json.dumps([(p.name, p.distribution, p.version, p.status) for p in r()]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [f"{name} ({dist} {version}, {status})" for name, dist, version, status in json.loads(out)]


def main() -> int:
    """Print the medians and the target rows; return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="runs per command (default 10)")
    parser.add_argument("--target", type=float, default=0.15, help="seconds `phalanx strategies` must stay under")
    parser.add_argument("--quick", action="store_true", help="2 runs per command: proves the script runs")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 2
    py = sys.executable
    # `import phalanx` must not pull torch in: the CLI and plugin discovery run without it
    no_torch = "import sys, phalanx; assert 'torch' not in sys.modules, 'import phalanx imported torch'"
    commands = {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import phalanx'": [py, "-c", no_torch],
        "phalanx strategies": [py, "-m", "phalanx.cli", "strategies"],
    }
    print("plugins: " + "; ".join(_installed_plugins()))
    print(f"{'command':<28} {'wall s':>8} {'cpu s':>8}   (medians of {args.repeat} runs, interleaved)")
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for command in commands.values():
        _run_once(command)  # warm the page cache so the first sample is not an outlier
    for _ in range(args.repeat):  # interleaved: load from other programs hits every command alike
        for name, command in commands.items():
            samples[name].append(_run_once(command))
    results = {n: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v)) for n, v in samples.items()}
    for name, (wall, cpu) in results.items():
        print(f"{name:<28} {wall:>8.3f} {cpu:>8.3f}")
    listing = spread([s[0] for s in samples["phalanx strategies"]])
    imports = [(a[0] - b[0]) * 1e3 for a, b in zip(samples["python -c 'import phalanx'"], samples["python -c pass"])]
    imp = spread(imports)
    rows = [
        Row("`phalanx strategies`, every plugin installed (wall)", listing.median, args.target, "s", strict=True,
            low=listing.low, high=listing.high),
        Row("`import phalanx` without torch, over a bare interpreter (wall)", imp.median, 30.0, "ms", strict=True,
            low=imp.low, high=imp.high),
    ]
    return finish("cli", rows, {"samples": samples}, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
