"""Run every benchmark script, then draw the plots; exit 1 when any target was missed.

    python benchmarks/run_all.py                  # everything (what `nox -s bench` runs)
    python benchmarks/run_all.py --quick          # smoke: each script for a few steps (integration)
    python benchmarks/run_all.py bench_ddp.py     # only the named scripts

A script that misses a target exits 1 and the others still run, so one slow row does not hide
the rest; a script that crashes (any other status) is reported as broken. In ``--quick`` mode no
result is recorded and no plot is redrawn: the point is only that every script still runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
#: Scripts measured more than once, with the arguments of each run.
VARIANTS: dict[str, list[list[str]]] = {
    "bench_deepspeed_memory.py": [["--precision", "32-true"], ["--precision", "bf16-mixed"]],
}
#: Scripts left out of ``--quick``, with why: the smoke run must stay about a minute of CI.
QUICK_SKIP = {
    "bench_model_parallel_memory.py": "five 4-process launches even for the smallest model (~2.5 min on 2 cores); "
    "packages/strategy-model-parallel's own tests cover those meshes",
    "bench_torchft.py": "four multi-process jobs with a lighthouse and a killed, restarted group (~60 s even when "
    "quick); packages/strategy-torchft's own tests run the same paths",
}


def main(argv: list[str]) -> int:
    """Run the scripts named in ``argv`` (all by default); returns 1 on a miss, 2 on a crash."""
    quick = "--quick" in argv
    names = [a for a in argv if a.endswith(".py")] or sorted(p.name for p in HERE.glob("bench_*.py"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    missed, broken, spent = [], [], {}
    for name in names:
        if quick and name in QUICK_SKIP:
            print(f"\n=== {name}: not in the quick run ({QUICK_SKIP[name]})")
            continue
        variants = VARIANTS.get(name, [[]])
        for extra in variants[:1] if quick else variants:  # quick: one variant proves the script runs
            command = [sys.executable, str(HERE / name), *extra, *(["--quick"] if quick else [])]
            print(f"\n=== {name} {' '.join(extra)}", flush=True)
            start = time.perf_counter()
            code = subprocess.run(command, env=env, check=False).returncode
            spent[f"{name} {' '.join(extra)}".strip()] = time.perf_counter() - start
            if code == 1:
                missed.append(name)
            elif code != 0:
                broken.append(f"{name} (exit {code})")
    if not quick:
        subprocess.run([sys.executable, str(HERE / "plot_results.py")], env=env, check=False)
    print("\ntime per script: " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()))
    if broken:
        print("broken: " + ", ".join(broken))
        return 2
    if missed:
        print("targets missed in: " + ", ".join(missed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
