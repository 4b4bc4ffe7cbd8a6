"""The collective agreement check: ranks compare what they are about to run before running it.

A collective that two ranks call differently (one all-reduces while the other broadcasts, or
they reduce tensors of different shapes) either hangs until the process-group timeout or, worse,
mixes unrelated data. With ``PHALANX_DISTRIBUTED_DEBUG=1`` every collective issued through a
ParallelStrategy (``all_gather``, ``reduce``, ``broadcast``, ``barrier`` and what is built on them:
``reduce_boolean_decision``, ``self.log(sync_dist=True)``, the built-in callbacks' agreements) is
preceded by an exchange of fingerprints (operation, tensor shape and dtype) on a
separate gloo group, and the first mismatch raises :class:`~phalanx.errors.CollectiveMismatchError`
on every rank at once, naming each rank's call site. The cost is one small all-gather
per collective: an all-gather of a 64-bit fingerprint, the call sites only after a mismatch
(see docs/reliability.md for the measurement); when the variable is unset, one
attribute read.

A rank that is not in a strategy collective at all (stuck in a forward pass, or in torch's own
collectives) does not join the exchange: that hang is the watchdog's to report.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import CollectiveMismatchError

__all__ = ["DEBUG_ENV", "check_agreement", "checking_enabled"]

DEBUG_ENV = "PHALANX_DISTRIBUTED_DEBUG"
_HERE = os.path.dirname(os.path.abspath(__file__))


def checking_enabled() -> bool:
    """Whether ``PHALANX_DISTRIBUTED_DEBUG`` asks for the check (read when the process group is made)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on", "detail")


def _call_site() -> str:
    """The first frame outside phalanx's strategy code and torch: who asked for the collective."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        parts = filename.replace("\\", "/").split("/")
        if not filename.startswith(_HERE) and "torch" not in parts:
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    return "object" if value is not None else ""


def check_agreement(op: str, value: Any, *, group: Any, rank: int, world_size: int) -> None:
    """Exchange this rank's fingerprint of ``op`` on ``group`` and raise if the ranks disagree.

    Args:
        op: The strategy method (``reduce``, ``broadcast(src=0)``...).
        value: Its tensor (shape and dtype are compared) or object (only the operation is).
        group: The gloo group of the check (not the group the collective runs on).
        rank: This rank.
        world_size: The number of ranks.

    Raises:
        CollectiveMismatchError: Another rank is about to run a different collective.
    """
    what = _describe(value)
    # First one all-gather of a 64-bit fingerprint; the call sites travel only after a mismatch.
    digest = int.from_bytes(hashlib.blake2b(f"{op}|{what}".encode(), digest_size=8).digest(), "little", signed=True)
    mine_tensor = torch.tensor([digest], dtype=torch.int64)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(gathered, mine_tensor, group=group)
    if all(int(t.item()) == digest for t in gathered):
        return
    mine = {"rank": rank, "op": op, "what": what, "site": _call_site()}
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, mine, group=group)
    lines = "\n".join(f"  rank {f['rank']}: {f['op']} {f['what']}".rstrip() + f" at {f['site']}" for f in everyone)
    msg = (
        f"the ranks are about to run different collectives ({DEBUG_ENV}=1 checked them before they ran):\n{lines}\n"
        "Fix: make every rank run the same collectives in the same order, with tensors of the same shape "
        "(a collective inside `if trainer.is_global_zero:` or another rank-dependent branch is the usual cause)."
    )
    raise CollectiveMismatchError(msg)
