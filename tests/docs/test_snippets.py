"""Every Python snippet in README.md and docs/ runs, as a script in a fresh process.

A script, not ``exec`` in this process: ``ddp`` re-runs the script once per extra rank, and a
snippet that registers names must not leak them into other tests. Each runs in its own temporary
directory (so ``lightning_logs/`` and checkpoints land there) with a timeout, in its own process
group, which is killed if anything is left. How a snippet is marked: see ``snippets.py``.
``pytest tests/docs -m "not docs_long"`` runs the quick ones only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from snippets import ROOT, Snippet, collect, script_for

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
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PHALANX_DOCS_SNIPPET": snippet.test_id}
    timeout = LONG_TIMEOUT if snippet.long else QUICK_TIMEOUT
    process = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{snippet.test_id} did not finish within {timeout}s (killed)\n{output}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # anything the snippet left behind
        except ProcessLookupError:
            pass
    assert process.returncode == 0, f"{snippet.test_id} exited with {process.returncode}:\n{output}"


def test_every_page_is_collected() -> None:
    pages = {s.page for s in SNIPPETS}
    assert ROOT / "README.md" in pages and ROOT / "docs" / "getting-started.md" in pages
