"""Write tools/constraints/<environment>.txt from the environments of the last nox run.

Each file lists the versions ``pip freeze`` finds in one environment (.nox/shared-env, and the
xla, ray, lightning, lint and docs environments), leaving out this repository's own distributions
and torch (tools/nox_environments.py pins torch itself; PHALANX_TORCH can change it). The default
run passes each file to its environment's main install as pip constraints (see CONSTRAINTS there):

    python tools/freeze_environments.py     # after a full `nox` run (`nox -s test-times` runs it)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nox_environments import CONSTRAINTS, ENVIRONMENTS, LOCAL, ROOT, SHARED_ENV, project

#: Distributions no constraints file names: this repository's own, and torch (pinned by the sessions).
LEFT_OUT = {project(path)["name"].lower().replace("_", "-") for path in LOCAL.values()} | {"torch"}


def _name(line: str) -> str:
    return re.split(r"[=<>!~ @\[;]", line, maxsplit=1)[0].strip().lower().replace("_", "-")


def freeze(python: Path) -> list[str]:
    """The ``name==version`` lines of the environment of ``python``, without LEFT_OUT and direct URLs."""
    out = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    lines = [line.strip() for line in out.splitlines()]
    return sorted(
        (line for line in lines if "==" in line and " @ " not in line and _name(line) not in LEFT_OUT),
        key=str.lower,
    )


def main() -> int:
    environments = {"shared": SHARED_ENV, **{name: env.path for name, env in ENVIRONMENTS.items()}}
    CONSTRAINTS.mkdir(exist_ok=True)
    for name, folder in environments.items():
        python = folder / "bin" / "python"
        if not python.exists():
            print(f"{name}: no environment at {folder.relative_to(ROOT)} (run `nox` first); its file is kept")
            continue
        lines = freeze(python)
        header = f"# The {name} environment's versions in the last full run (python tools/freeze_environments.py).\n"
        (CONSTRAINTS / f"{name}.txt").write_text(header + "\n".join(lines) + "\n")
        print(f"{name}: {len(lines)} versions -> {(CONSTRAINTS / f'{name}.txt').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
