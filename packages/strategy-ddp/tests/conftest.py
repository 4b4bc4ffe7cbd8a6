"""Fixtures of the ddp tests: scripts run as real jobs, and a guard that nothing is left behind.

Every test must leave no process (found by the marker every job's descendants inherit), and no
changed environment variable (MASTER_PORT & co. in this process) behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from phalanx.testing.processes import kill_marked, wait_for_exit

#: Set by others: pytest's bookkeeping, and torch when it first imports inductor.
_NOT_OURS = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


@pytest.fixture(autouse=True)
def _leaves_nothing_behind() -> Iterator[None]:
    before = dict(os.environ)
    yield
    leftovers = wait_for_exit()
    if leftovers:
        kill_marked()
    changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
    changed -= _NOT_OURS
    assert not leftovers, f"processes left behind: {leftovers}"
    assert not changed, f"environment variables changed: {sorted(changed)}"
