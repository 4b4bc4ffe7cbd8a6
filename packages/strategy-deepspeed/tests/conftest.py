"""Every test must leave no process, process group or environment variable behind.

Helpers for running the training script live in ``ds_helpers.py`` (a unique module name, so the
suites of several packages can be collected together).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

#: Set by pytest itself, and by torch (its compile cache, on an optimizer's first step).
_OWNED_BY_OTHERS = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    """Fail a test that leaves child processes, a process group or changed env vars behind."""
    import psutil

    before_env = dict(os.environ)
    yield
    children = psutil.Process().children(recursive=True)
    for child in children:
        child.kill()
    assert not children, f"test left processes behind: {[c.pid for c in children]}"
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        assert not (dist.is_available() and dist.is_initialized()), "test left a process group initialised"
    changed = {k for k in set(before_env) | set(os.environ) if before_env.get(k) != os.environ.get(k)} - _OWNED_BY_OTHERS
    assert not changed, f"test changed environment variables: {sorted(changed)}"
