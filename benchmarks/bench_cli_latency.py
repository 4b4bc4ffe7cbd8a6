"""How long `phalanx strategies` takes, next to a bare interpreter and `import torch`.

Run: python benchmarks/bench_cli_latency.py [--repeat 15]
Prints the median wall time of each command and the ratio to `import torch`: listing must stay
far below the cost of importing torch (target: under 0.15 s).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def _median_seconds(command: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="one run per command: proves the script runs")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1
    py = sys.executable
    rows = {
        "python -c pass": [py, "-c", "pass"],
        "phalanx strategies": [py, "-m", "phalanx.cli", "strategies"],
        "phalanx strategies --json": [py, "-m", "phalanx.cli", "strategies", "--json"],
        "phalanx plugins": [py, "-m", "phalanx.cli", "plugins"],
        "python -c 'import torch'": [py, "-c", "import torch"],
    }
    results = {name: _median_seconds(cmd, args.repeat) for name, cmd in rows.items()}
    torch_time = results["python -c 'import torch'"]
    print(f"{'command':<30} {'median s':>9} {'vs import torch':>16}")
    for name, seconds in results.items():
        print(f"{name:<30} {seconds:>9.3f} {seconds / torch_time:>15.2f}x")


if __name__ == "__main__":
    main()
