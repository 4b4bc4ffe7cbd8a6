"""How long a test job takes to start: a new interpreter against a fork of the warm parent.

Run: python benchmarks/bench_warm_start.py [--repeat 10]
Each job runs a script that imports torch and torch.distributed and exits. Prints the median wall
time of each start (from ``Job(...)`` to its exit seen) and the ratio cold / warm; the warm start
exists to make that ratio large (target: above 5), since the suite starts a few hundred such jobs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from phalanx.testing.processes import Job
from phalanx.testing.warm import warm_parent


def _median_seconds(script: Path, folder: Path, *, warm: bool, repeat: int) -> float:
    times = []
    for index in range(repeat):
        start = time.perf_counter()
        job = Job([str(script)], folder, warm=warm, name=f"{'warm' if warm else 'cold'}{index}")
        code = job.wait(120)
        times.append(time.perf_counter() - start)
        assert code == 0 and job.warm is warm, job.output()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="one run per kind: proves the script runs")
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "imports.py"
        script.write_text("import torch, torch.distributed\n")
        Job([str(script)], folder, warm=True, name="start-parent").wait(120)  # the parent's own start-up
        cold = _median_seconds(script, folder, warm=False, repeat=repeat)
        warm = _median_seconds(script, folder, warm=True, repeat=repeat)
        warm_parent().close()
    print(f"{'start':<28}{'median s':>10}")
    print(f"{'new interpreter (cold)':<28}{cold:>10.3f}")
    print(f"{'fork of the warm parent':<28}{warm:>10.3f}")
    print(f"cold / warm: {cold / warm:.1f}x")


if __name__ == "__main__":
    main()
