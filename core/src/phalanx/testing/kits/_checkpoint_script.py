"""The script the checkpoint IO kit kills in the middle of a save, and the checkpoints it writes.

It runs in a fresh process: it saves a first checkpoint (and flushes it with ``teardown``), then
starts a second save to the same path and dies in the middle of it, in one of two ways:

- ``"serialising"``: the second checkpoint holds an object whose pickling announces itself in a
  file and then blocks; the test sees the file and sends SIGKILL to the process group (kill -9).
- ``"writing"``: ``RLIMIT_FSIZE`` is set below the second checkpoint's size and ``SIGXFSZ`` left
  at its default action, so the kernel kills the process at the write that crosses the limit: no
  handler, no ``finally``, exactly like kill -9, but at a byte the test chooses. This one also
  catches an IO that serialises into memory first and then overwrites the file in place.

An atomic IO leaves the first checkpoint loadable at the path in both cases.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

__all__ = ["KILL_POINTS", "first_checkpoint", "render_kill_script"]

KILL_POINTS = ("serialising", "writing")
#: Bytes a process may write once ``"writing"`` arms the limit; the second checkpoint is far larger.
FSIZE_LIMIT = 64 * 1024


def first_checkpoint() -> dict[str, Any]:
    """The checkpoint that must survive (small, deterministic; the test rebuilds it to compare)."""
    import torch

    generator = torch.Generator().manual_seed(11)
    return {"state_dict": {"weight": torch.randn(8, 4, generator=generator)}, "global_step": 1, "epoch": 0}


_TEMPLATE = """
import os, resource, signal, sys, time
sys.path[:0] = {paths!r}
import torch
from phalanx.registry import CheckpointIORegistry
from phalanx.testing.kits._checkpoint_script import FSIZE_LIMIT, first_checkpoint
from phalanx.testing.kits._common import build, import_spec

SPEC, PARAMS, OUT, MODE = {spec!r}, {params!r}, {out!r}, {mode!r}
PATH = os.path.join(OUT, "ckpt", "last.ckpt")


class Stall:
    def __reduce__(self):
        with open(os.path.join(OUT, "serialising"), "w") as handle:
            handle.write("now")
        time.sleep(120)
        return (int, (0,))


def make():
    value = SPEC if ":" not in SPEC else import_spec(SPEC)
    return build(value, CheckpointIORegistry, PARAMS, what="checkpoint_io")


io = make()
io.save_checkpoint(first_checkpoint(), PATH)
io.teardown()
second = {{"state_dict": {{"weight": torch.zeros(8, 4), "ballast": torch.randn(1024, 1024)}}, "global_step": 2}}
io = make()
if MODE == "writing":
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
else:
    second["stall"] = Stall()
io.save_checkpoint(second, PATH)
io.teardown()
print("the second save completed: it was never interrupted")
"""


def render_kill_script(
    path: Path, *, spec: str, params: dict[str, Any], out: Path, mode: str, paths: list[str]
) -> Path:
    """Write the script for ``mode`` (one of :data:`KILL_POINTS`) to ``path``."""
    path.write_text(
        textwrap.dedent(_TEMPLATE.format(paths=paths, spec=spec, params=dict(params), out=str(out), mode=mode))
    )
    return path
