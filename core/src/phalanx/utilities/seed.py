"""Seed every random number generator a training run uses, in this process and in the ones it starts.

:func:`seed_everything` seeds Python's :mod:`random`, NumPy's global generator and torch (which
seeds every CUDA device too), and records the seed in two environment variables so that every
process started afterwards can seed itself the same way with :func:`reset_seed`:

``PHALANX_GLOBAL_SEED``
    The seed. Ranks started by a launcher (spawned, forked, or the script re-run per rank, as
    torchrun does) inherit it; the strategy calls :func:`reset_seed` in each of them, so every
    rank starts from the same state without the user's script calling ``seed_everything`` in a
    place each rank reaches. ``seed_everything(None)`` also reads it.
``PHALANX_SEED_WORKERS``
    ``"1"`` when ``seed_everything(..., workers=True)`` was called, else ``"0"``. The Trainer then
    gives each DataLoader that has no ``worker_init_fn`` :func:`worker_init_function` (through
    :func:`add_worker_init_fn`), which seeds every worker of every rank differently but
    reproducibly.

Lightning names these ``PL_GLOBAL_SEED`` and ``PL_SEED_WORKERS``; phalanx neither reads nor sets
those. Everything else (arguments, bounds, the returned seed, the seeds each DataLoader worker
gets) is Lightning's behaviour, so a run seeded the same way draws the same numbers.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch

from phalanx.utilities.rank_zero import rank_from_env, rank_prefixed_message, rank_zero_only, rank_zero_warn

__all__ = [
    "SEED_ENV",
    "SEED_WORKERS_ENV",
    "add_worker_init_fn",
    "isolate_rng",
    "reset_seed",
    "seed_everything",
    "worker_init_function",
]

SEED_ENV = "PHALANX_GLOBAL_SEED"
SEED_WORKERS_ENV = "PHALANX_SEED_WORKERS"
#: NumPy's legacy global generator takes seeds in [0, 2**32 - 1]; the same bounds apply to all three.
MIN_SEED, MAX_SEED = 0, 2**32 - 1

_MASK64 = (1 << 64) - 1
log = logging.getLogger(__name__)


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed Python's ``random``, NumPy and torch (all devices) with ``seed`` and return it.

    Args:
        seed: An integer in ``[0, 2**32 - 1]`` (anything ``int()`` accepts). ``None`` reads
            ``PHALANX_GLOBAL_SEED``, and falls back to 0 with a warning when that is unset too.
        workers: Also make the Trainer seed each DataLoader worker differently and reproducibly
            (see :func:`worker_init_function`); a DataLoader with its own ``worker_init_fn`` keeps it.
        verbose: Log ``Seed set to N`` (prefixed with the rank in a launched process) and warn
            when falling back to 0.

    Raises:
        ValueError: The seed (argument or environment variable) is not an integer or is out of bounds.
    """
    if seed is None:
        from_env = os.environ.get(SEED_ENV)
        if from_env is None:
            seed = 0
            if verbose:
                rank_zero_warn(f"No seed found, seed set to {seed}", stacklevel=5)
        else:
            try:
                seed = int(from_env)
            except ValueError:
                msg = f"{SEED_ENV}={from_env!r} is not an integer seed; set it to an integer in [{MIN_SEED}, {MAX_SEED}] or unset it"
                raise ValueError(msg) from None
    elif not isinstance(seed, int):
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            msg = f"seed={seed!r} is not an integer; pass an integer in [{MIN_SEED}, {MAX_SEED}] or None"
            raise ValueError(msg) from None
    if not MIN_SEED <= seed <= MAX_SEED:
        msg = f"seed={seed} is out of bounds: NumPy accepts seeds in [{MIN_SEED}, {MAX_SEED}]; pass one in that range"
        raise ValueError(msg)

    if verbose:
        log.info(rank_prefixed_message(f"Seed set to {seed}", rank_from_env()))
    os.environ[SEED_ENV] = str(seed)
    os.environ[SEED_WORKERS_ENV] = str(int(workers))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device as well, lazily
    return seed


def reset_seed() -> None:
    """Seed this process again with what :func:`seed_everything` recorded in the environment.

    A strategy calls it in each launched rank (after the process group is set up, before the
    Module is built) so every rank starts from the seed the user chose in the main process. Does
    nothing when ``seed_everything`` was never called.
    """
    seed = os.environ.get(SEED_ENV)
    if seed is None:
        return
    workers = os.environ.get(SEED_WORKERS_ENV, "0")
    seed_everything(int(seed), workers=bool(int(workers)), verbose=False)


def worker_init_function(worker_id: int, rank: int | None = None) -> None:
    """Seed ``random``, NumPy and torch in one DataLoader worker, distinctly per worker and rank.

    torch seeds worker ``i`` from ``base + i``, with ``base`` drawn from the process's generator.
    Every rank was seeded alike, so every rank draws the same ``base``, and worker ``i`` of each
    rank would produce the same "random" augmentations. This derives a separate, well-mixed seed
    per generator from ``(base, worker_id, rank)``, exactly as Lightning's
    ``pl_worker_init_function`` does, so the draws also match a Lightning run seeded the same way.

    Args:
        worker_id: The worker's index, as the DataLoader passes it.
        rank: The global rank; defaults to ``rank_zero_only.rank``.
    """
    global_rank = rank if rank is not None else rank_zero_only.rank
    base_seed = torch.initial_seed() - worker_id  # torch seeded this worker with base + worker_id
    log.debug(f"Seeding process {global_rank} worker {worker_id} from base seed {base_seed}")
    torch_seed, python_high, python_low, _ = _mixed_seeds(base_seed, worker_id, global_rank, count=4)
    torch.manual_seed(torch_seed)
    random.seed((python_high << 32) | python_low)
    np.random.seed(np.random.SeedSequence([base_seed, worker_id, global_rank]).generate_state(4))


def add_worker_init_fn(dataloader: object, *, rank: int) -> None:
    """Give ``dataloader`` :func:`worker_init_function` for ``rank`` if ``seed_everything(workers=True)`` ran.

    The Trainer calls it on every DataLoader it prepares. It leaves alone a DataLoader whose
    ``worker_init_fn`` is already set and objects that are not DataLoader-like (no such attribute).
    The function is a :func:`functools.partial` of a module-level function, so it pickles into
    spawned workers.
    """
    if not hasattr(dataloader, "worker_init_fn"):
        return
    if int(os.environ.get(SEED_WORKERS_ENV, "0")) and dataloader.worker_init_fn is None:
        dataloader.worker_init_fn = partial(worker_init_function, rank=rank)


@contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Restore torch's, NumPy's and Python's global random state on exit to what it was on entry.

    Use it around code that must not shift the training run's random stream (a sanity check, a
    sample generation in a callback).

    Args:
        include_cuda: Also save and restore every CUDA device's generator. Pass False in a forked
            process, where initialising CUDA is not allowed.
    """
    states = _collect_rng_states(include_cuda=include_cuda)
    try:
        yield
    finally:
        _set_rng_states(states)


def _collect_rng_states(*, include_cuda: bool) -> dict[str, Any]:
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if include_cuda and torch.cuda.is_available():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if "torch.cuda" in states:
        torch.cuda.set_rng_state_all(states["torch.cuda"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def _mixed_seeds(base_seed: int, worker_id: int, rank: int, *, count: int) -> list[int]:
    """``count`` 64-bit seeds from ``(base_seed, worker_id, rank)``.

    The three are packed into one integer, scrambled with MurmurHash3's 64-bit finaliser (so that
    small, similar inputs give unrelated outputs) and expanded with Knuth's MMIX linear
    congruential generator. This is the derivation Lightning uses, kept bit for bit so seeds agree.
    """
    state = (base_seed << 32) | (worker_id << 16) | rank  # wider than 64 bits: the first shift mixes the top in
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        state ^= state >> 33
        state = (state * multiplier) & _MASK64
    state ^= state >> 33
    seeds = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1) & _MASK64
        seeds.append(state)
    return seeds
