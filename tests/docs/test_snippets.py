"""Every Python snippet in README.md and docs/ runs, as a script in a fresh process.

A script, not ``exec`` in this process: ``ddp`` re-runs the script once per extra rank, and a
snippet that registers names must not leak them into other tests. Each runs in its own temporary
directory (so ``lightning_logs/`` and checkpoints land there) with a timeout, in its own process
group, which is killed if anything is left. How a snippet is marked: see ``snippets.py``.
``pytest tests/docs -m "not docs_long"`` runs the quick ones only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from snippets import ROOT, Snippet, collect, script_for

from phalanx.testing.processes import run_command

SNIPPETS = collect()
QUICK_TIMEOUT, LONG_TIMEOUT = 120, 300


def _param(snippet: Snippet) -> object:
    marks = [pytest.mark.docs_long] if snippet.long else []
    if snippet.skip:
        marks.append(pytest.mark.skip(reason=f"marked in the page: {snippet.skip}"))
    return pytest.param(snippet, id=snippet.test_id, marks=marks)


@pytest.mark.parametrize("snippet", [_param(s) for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    page = [s for s in SNIPPETS if s.page == snippet.page]
    script = tmp_path / "snippet.py"
    script.write_text(script_for(snippet, page), encoding="utf-8")
    timeout = LONG_TIMEOUT if snippet.long else QUICK_TIMEOUT
    # The snippet's processes (a launcher's ranks) are killed with it on timeout; what it leaves
    # behind after exiting is killed too (a page's example need not clean up like a test).
    done = run_command([str(script)], cwd=tmp_path, env={"PHALANX_DOCS_SNIPPET": snippet.test_id}, timeout=timeout)
    assert done.returncode == 0, f"{snippet.test_id} exited with {done.returncode}:\n{done.output()}"


def test_every_page_is_collected() -> None:
    pages = {s.page for s in SNIPPETS}
    assert ROOT / "README.md" in pages and ROOT / "docs" / "getting-started.md" in pages
