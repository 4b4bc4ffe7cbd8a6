"""The scripts of ``scripts/`` unmodified under real Lightning, with the checks phalanx must pass.

This proves the scripts are genuine Lightning programs and that the expectations of
``test_lightning_scripts.py`` are Lightning's behaviour, not phalanx's. It runs in the
``lightning`` nox session (Lightning installed beside phalanx-core); elsewhere it is skipped, and
there, with ``PHALANX_REQUIRE_LIGHTNING=1`` (set by that session), a Lightning that does not
import fails instead.

Lightning 2.6.6 refuses its ``fsdp`` strategy on CPU ("The strategy `fsdp` requires a GPU
accelerator"), so the FSDP case runs under phalanx only.

Lightning never destroys its ranks' gloo process group, and torch 2.13's gloo sometimes aborts at
interpreter exit then (about one 2-rank run in eight: exit -6, "terminate called without an active
exception"). A run that ends that way after writing its results is judged by them: ``run_case``
accepts that one crash (``gloo_exit_abort=True``) and ``check`` must find every expected result.
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

from lightning_cases import CASES, GLOO_EXIT_ABORT, SCRIPTS, Case, check, run_case

pytestmark = pytest.mark.timeout(300)
#: Cases Lightning cannot run on CPU (see the module docstring).
NOT_ON_CPU = {"autoencoder-fsdp-2"}


#: Stands in for a Lightning run that ends in the gloo abort at exit: it writes its results (unless
#: told not to), prints the message (unless told not to) and raises SIGABRT, without a core file.
_ABORTING = f"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
mode, out = sys.argv[1], sys.argv[sys.argv.index("--out") + 1]
if mode != "no-results":
    open(out, "w").write('{{"done": true}}')
if mode != "no-message":
    print({GLOO_EXIT_ABORT!r}, file=sys.stderr, flush=True)
os.abort()
"""


@pytest.mark.parametrize("mode", ["results-written", "no-results", "no-message"])
def test_only_the_gloo_abort_after_the_results_are_written_is_accepted(mode: str, tmp_path: Path) -> None:
    """The harness's one exception (``run_case(gloo_exit_abort=True)``) is that crash and no other:
    SIGABRT with gloo's message after the results file was written; never for phalanx's runs."""
    script = tmp_path / "aborts.py"
    script.write_text(_ABORTING)
    case = Case(script.name, (mode,))
    (tmp_path / "upstream").mkdir()
    if mode == "results-written":
        assert run_case(script, case, tmp_path / "upstream", gloo_exit_abort=True) == {"done": True}
    else:
        with pytest.raises(AssertionError, match="exited with -6"):
            run_case(script, case, tmp_path / "upstream", gloo_exit_abort=True)
    (tmp_path / "phalanx").mkdir()
    with pytest.raises(AssertionError, match="exited with -6"):
        run_case(script, case, tmp_path / "phalanx")


@pytest.mark.parametrize(
    "case", [c for n, c in CASES.items() if n not in NOT_ON_CPU], ids=[n for n in CASES if n not in NOT_ON_CPU]
)
def test_lightning_script_runs_under_lightning(case: Case, tmp_path: Path) -> None:
    script = tmp_path / case.script
    shutil.copyfile(SCRIPTS / case.script, script)
    result = run_case(script, case, tmp_path, gloo_exit_abort=True)
    check(case, script, result, tmp_path)
