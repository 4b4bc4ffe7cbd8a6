"""Lightning 2.x scripts run on phalanx after the rename rule and nothing else.

Each script under ``scripts/`` is written against ``lightning.pytorch``. Here its source goes
through :func:`rename.to_phalanx`, is written to the test's folder and runs in a subprocess with
this interpreter (the script launches its own ranks on gloo); the numbers it writes must match a
plain-PyTorch replay (``lightning_cases.py``). ``test_under_lightning.py`` runs the same scripts
unmodified under Lightning with the same checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning_cases import CASES, SCRIPTS, Case, check, run_case
from rename import to_phalanx

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_lightning_script_runs_renamed(case: Case, tmp_path: Path) -> None:
    renamed = tmp_path / case.script
    renamed.write_text(to_phalanx((SCRIPTS / case.script).read_text(encoding="utf-8")), encoding="utf-8")
    result = run_case(renamed, case, tmp_path)
    check(case, renamed, result, tmp_path)
