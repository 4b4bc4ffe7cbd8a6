"""The scripts of ``scripts/`` unmodified under real Lightning, with the checks phalanx must pass.

This proves the scripts are genuine Lightning programs and that the expectations of
``test_lightning_scripts.py`` are Lightning's behaviour, not phalanx's. It runs in the
``lightning`` nox session (Lightning installed beside phalanx-core); elsewhere it is skipped, and
there, with ``PHALANX_REQUIRE_LIGHTNING=1`` (set by that session), a Lightning that does not
import fails instead.

Lightning 2.6.6 refuses its ``fsdp`` strategy on CPU ("The strategy `fsdp` requires a GPU
accelerator"), so the FSDP case runs under phalanx only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

if os.environ.get("PHALANX_REQUIRE_LIGHTNING") == "1":
    import lightning.pytorch  # noqa: F401  (the lightning session: Lightning must import)
else:
    # lightning.pytorch, not lightning: tests/lightning itself would import as a namespace package
    pytest.importorskip("lightning.pytorch", reason="needs Lightning installed (the lightning nox session)")

from lightning_cases import CASES, SCRIPTS, Case, check, run_case

pytestmark = pytest.mark.timeout(300)
#: Cases Lightning cannot run on CPU (see the module docstring).
NOT_ON_CPU = {"autoencoder-fsdp-2"}


@pytest.mark.parametrize(
    "case", [c for n, c in CASES.items() if n not in NOT_ON_CPU], ids=[n for n in CASES if n not in NOT_ON_CPU]
)
def test_lightning_script_runs_under_lightning(case: Case, tmp_path: Path) -> None:
    script = tmp_path / case.script
    shutil.copyfile(SCRIPTS / case.script, script)
    result = run_case(script, case, tmp_path)
    check(case, script, result, tmp_path)
