"""The rendezvous store of phalanx's process groups: one per process, one key prefix per group.

A Trainer may run several entry points in one process (``fit`` then ``validate``), each creating
and destroying the default process group. Re-creating it on a fresh ``tcp://`` rendezvous races:
a fast rank can reach the old group's store (still served by a slow rank 0 that has not torn down
yet) and join a group that is going away; and under torchrun, whose agent store outlives every
group, a re-created default group finds the previous group's keys and hangs. So the store is
created once per process and kept, and every group gets its own key prefix (``phalanx/<n>``):
ranks agree on ``n`` because they run the same sequence of entry points.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import torch.distributed as dist

__all__ = ["DEFAULT_STORE_TIMEOUT", "STARTUP_TIMEOUT", "next_group_store", "wait_for_all_ranks"]

#: How long a rank waits at rendezvous for the others (torch's default process-group timeout).
DEFAULT_STORE_TIMEOUT = timedelta(minutes=30)
#: The least time ranks wait for each other to start (imports, data set-up) before the process
#: group exists, whatever the strategy's ``timeout``: a short collective timeout, set to catch a hang
#: fast, must not fail a slow start on a loaded machine.
STARTUP_TIMEOUT = timedelta(minutes=5)
_lock = threading.Lock()
_stores: dict[tuple[str, int, bool], dist.TCPStore] = {}
_generations: dict[tuple[str, int, bool], int] = {}


def _uses_agent_store() -> bool:
    """Under torchrun the agent hosts the store on MASTER_PORT; every worker is a client."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def wait_for_all_ranks(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
    """Announce ``rank`` in ``store`` and wait until all ``world_size`` ranks have, within ``timeout``."""
    store.set(f"arrived/{rank}", "1")
    store.wait([f"arrived/{other}" for other in range(world_size)], timeout)


def next_group_store(host: str, port: int, *, is_rank_zero: bool, timeout: timedelta | None) -> dist.Store:
    """Return this process's store for ``host:port``, prefixed for the next process group.

    Rank 0 serves the store (unless torchrun's agent does); the others connect and retry until it
    is up, within ``timeout``.
    """
    is_master = is_rank_zero and not _uses_agent_store()
    key = (host, int(port), is_master)
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = dist.TCPStore(
                host,
                int(port),
                is_master=is_master,
                timeout=timeout or DEFAULT_STORE_TIMEOUT,
                wait_for_workers=False,
            )
            _stores[key] = store
        generation = _generations.get(key, 0) + 1
        _generations[key] = generation
    # torchrun's agent store also outlives a restart of the workers (--max-restarts): the new
    # workers count generations from 1 again, so the attempt number is part of the prefix, or they
    # would read the dead attempt's addresses.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"phalanx/{attempt}/{generation}", store)
