"""A 2-process job driven by SubprocessScriptLauncher alone (no torch), for the launcher tests.

Usage: python launcher_job.py MODE [OUT_DIR]   (or: python -m launcher_job MODE [OUT_DIR])
MODE: "ok" (each rank writes the variables it got), "raise0" / "raise1" (that rank raises),
"sleep" (every rank prints READY and sleeps, for signal tests).
"""

from __future__ import annotations

import json
import os
import sys
import time

from phalanx.environments.local import LocalEnvironment
from phalanx.launchers.subprocess_script import SubprocessScriptLauncher

_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK")


def work(mode: str, out: str) -> str:
    rank = int(os.environ["LOCAL_RANK"])
    print(f"READY {rank} {os.getpid()}", flush=True)
    if mode == "ok":
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
            json.dump({"env": {k: os.environ.get(k) for k in _VARS}, "argv": sys.argv, "pid": os.getpid(), "ppid": os.getppid()}, fh)
        if rank == 1:
            time.sleep(1.0)  # finishes after rank 0: the parent must wait for it
            with open(os.path.join(out, "rank1.done"), "w") as fh:
                fh.write("done")
    elif mode == f"raise{rank}":
        time.sleep(0.5)
        print(f"RAISING {time.time()}", flush=True)
        msg = f"boom from rank {rank}"
        raise ValueError(msg)
    else:
        time.sleep(120)
    return mode


if __name__ == "__main__":
    mode = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "."
    launcher = SubprocessScriptLauncher(LocalEnvironment(), num_processes=2, num_nodes=1)
    result = launcher.launch(work, mode, out)
    print(f"RESULT {result}", flush=True)
