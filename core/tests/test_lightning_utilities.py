"""Lightning's utilities under the rename rule: seeding, worker seeding, isolate_rng, rank-zero helpers.

grad_norm, the other utility modules and the top-level names: test_lightning_names.py.

Numbers are checked against references computed here (fresh generators, torch.linalg) or, for the
DataLoader-worker seeds, against values Lightning 2.6.6's ``pl_worker_init_function`` produced for
the same inputs, since matching Lightning's draws is the feature.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from trainer_helpers import run_python

from phalanx.utilities import rank_zero
from phalanx.utilities.rank_zero import (
    LightningDeprecationWarning,
    WarningCache,
    rank_from_env,
    rank_prefixed_message,
    rank_zero_debug,
    rank_zero_deprecation,
    rank_zero_info,
    rank_zero_only,
    rank_zero_warn,
)
from phalanx.utilities.seed import (
    SEED_ENV,
    SEED_WORKERS_ENV,
    add_worker_init_fn,
    isolate_rng,
    reset_seed,
    seed_everything,
    worker_init_function,
)

THIS_FILE = str(Path(__file__).resolve())


@pytest.fixture
def clean_seed_env() -> Iterator[None]:
    """No seed variables during the test; the previous values and RNG states come back afterwards."""
    saved_env = {key: os.environ.pop(key, None) for key in (SEED_ENV, SEED_WORKERS_ENV)}
    saved_rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    for key, value in saved_env.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value
    random.setstate(saved_rng[0])
    np.random.set_state(saved_rng[1])
    torch.set_rng_state(saved_rng[2])


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Iterator[int]:
    """Set ``rank_zero_only.rank`` to the parametrized value for the test, restoring it afterwards."""
    before = rank_zero_only.rank
    rank_zero_only.rank = request.param
    yield request.param
    rank_zero_only.rank = before


def _draws() -> tuple[list[float], float, float]:
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def _reference_draws(value: int) -> tuple[list[float], float, float]:
    """What generators freshly seeded with ``value`` draw first: the reference for seed_everything."""
    generator = torch.Generator().manual_seed(value)
    return (
        torch.rand(3, generator=generator).tolist(),
        random.Random(value).random(),
        float(np.random.RandomState(value).rand()),
    )


# ----------------------------------------------------------------------------------------------- seeding


@pytest.mark.usefixtures("clean_seed_env")
def test_seed_everything_seeds_python_numpy_and_torch_and_records_the_seed() -> None:
    assert seed_everything(42, verbose=False) == 42
    assert _draws() == _reference_draws(42)
    assert os.environ[SEED_ENV] == "42"
    assert os.environ[SEED_WORKERS_ENV] == "0"
    seed_everything(7, workers=True, verbose=False)
    assert os.environ[SEED_WORKERS_ENV] == "1"
    # Lightning 2.6.6 seeded with 42 draws exactly these (torch.rand(2), random.random(), np.random.rand()).
    seed_everything(42, verbose=False)
    assert torch.rand(2).tolist() == [0.8822692632675171, 0.9150039553642273]
    assert (random.random(), float(np.random.rand())) == (0.6394267984578837, 0.3745401188473625)


@pytest.mark.usefixtures("clean_seed_env")
def test_seed_everything_accepts_what_int_accepts_and_returns_an_int() -> None:
    assert seed_everything(np.int64(5), verbose=False) == 5  # type: ignore[arg-type]
    assert seed_everything("6", verbose=False) == 6  # type: ignore[arg-type]
    assert type(seed_everything(7.0, verbose=False)) is int  # type: ignore[arg-type]
    assert _draws() == _reference_draws(7)


@pytest.mark.usefixtures("clean_seed_env")
def test_seed_none_reads_the_environment_variable() -> None:
    os.environ[SEED_ENV] = "123"
    assert seed_everything(verbose=False) == 123
    assert _draws() == _reference_draws(123)


@pytest.mark.usefixtures("clean_seed_env")
def test_seed_none_without_environment_falls_back_to_zero_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="No seed found, seed set to 0") as record:
        assert seed_everything() == 0
    assert record[0].filename == THIS_FILE  # attributed to the caller, not to phalanx
    assert _draws() == _reference_draws(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        os.environ.pop(SEED_ENV)
        assert seed_everything(verbose=False) == 0  # verbose=False: silent


@pytest.mark.usefixtures("clean_seed_env")
@pytest.mark.parametrize("bad", [-1, 2**32, "abc", None])
def test_invalid_seeds_raise_naming_the_value_and_the_bounds(bad: object) -> None:
    if bad is None:
        os.environ[SEED_ENV] = "not-a-number"
        with pytest.raises(ValueError, match=r"PHALANX_GLOBAL_SEED='not-a-number'.*\[0, 4294967295\]"):
            seed_everything()
        return
    with pytest.raises(ValueError, match=rf"seed={bad!r}.*\[0, 4294967295\]"):
        seed_everything(bad)  # type: ignore[arg-type]
    assert SEED_ENV not in os.environ  # nothing recorded for a rejected seed


@pytest.mark.usefixtures("clean_seed_env")
def test_bounds_are_inclusive() -> None:
    assert seed_everything(0, verbose=False) == 0
    assert seed_everything(2**32 - 1, verbose=False) == 2**32 - 1
    assert _draws()[1:] == _reference_draws(2**32 - 1)[1:]


@pytest.mark.usefixtures("clean_seed_env")
def test_verbose_logs_the_seed_prefixed_with_the_rank_of_a_launched_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in rank_zero.RANK_ENV_VARS:
        monkeypatch.delenv(key, raising=False)
    with caplog.at_level(logging.INFO, logger="phalanx"):
        seed_everything(11)
        monkeypatch.setenv("RANK", "3")
        seed_everything(12)
        seed_everything(13, verbose=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "phalanx.utilities.seed"]
    assert messages == ["Seed set to 11", "[rank: 3] Seed set to 12"]


@pytest.mark.usefixtures("clean_seed_env")
def test_reset_seed_reapplies_the_recorded_seed_and_is_a_no_op_without_one() -> None:
    torch.manual_seed(1)
    expected = torch.rand(2).tolist()
    torch.manual_seed(1)
    reset_seed()  # nothing recorded: the stream is left where it was
    assert torch.rand(2).tolist() == expected

    seed_everything(31, workers=True, verbose=False)
    first = _draws()
    os.environ.pop(SEED_WORKERS_ENV)  # reset_seed reads workers from the environment, default off
    reset_seed()
    assert _draws() == first == _reference_draws(31)
    assert os.environ[SEED_WORKERS_ENV] == "0"


@pytest.mark.usefixtures("clean_seed_env")
def test_a_process_started_after_seed_everything_reseeds_identically_with_reset_seed() -> None:
    """What a launched rank does: it inherits the environment and the strategy calls reset_seed()."""
    seed_everything(2024, workers=True, verbose=False)
    parent = _draws()
    code = (
        "import random, numpy as np, torch, os\n"
        "from phalanx.utilities.seed import reset_seed\n"
        "torch.manual_seed(999); random.seed(999); np.random.seed(999)\n"
        "reset_seed()\n"
        "print(repr((torch.rand(3).tolist(), random.random(), float(np.random.rand()), os.environ['PHALANX_SEED_WORKERS'])))"
    )
    child = eval(run_python(code).stdout)  # the child printed a literal tuple
    assert child == (*parent, "1")


# --------------------------------------------------------------------------------------- worker seeding


@pytest.mark.usefixtures("clean_seed_env")
@pytest.mark.parametrize(
    ("base", "worker_id", "global_rank", "golden"),
    [
        (12345, 1, 2, ([0.5969811677932739, 0.7626155614852905], 0.7779762345293275, 0.7808993456757323)),
        (2**62 + 99, 0, 0, ([0.6379560828208923, 0.8636213541030884], 0.5696408451864016, 0.12784719668011213)),
    ],
)
def test_worker_init_function_draws_what_lightning_draws(
    base: int, worker_id: int, global_rank: int, golden: tuple[list[float], float, float]
) -> None:
    torch.manual_seed(base + worker_id)  # what torch's worker loop does before calling worker_init_fn
    worker_init_function(worker_id, rank=global_rank)
    assert (torch.rand(2).tolist(), random.random(), float(np.random.rand())) == golden


class _RandomPerWorker(Dataset[tuple[float, float, float, int]]):
    """Each item: one draw from each generator, in whichever worker loads it, plus that worker's id."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[float, float, float, int]:
        info = torch.utils.data.get_worker_info()
        return float(torch.rand(1)), random.random(), float(np.random.rand()), -1 if info is None else info.id


def _first_draw_per_worker(global_rank: int | None, *, workers: bool) -> dict[int, tuple[float, float, float]]:
    seed_everything(77, workers=workers, verbose=False)
    loader = DataLoader(_RandomPerWorker(), batch_size=None, num_workers=2, shuffle=False)
    if global_rank is not None:
        add_worker_init_fn(loader, rank=global_rank)
    firsts: dict[int, tuple[float, float, float]] = {}
    for torch_draw, python_draw, numpy_draw, worker in loader:
        firsts.setdefault(int(worker), (float(torch_draw), float(python_draw), float(numpy_draw)))
    return firsts


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("clean_seed_env")
def test_dataloader_workers_get_distinct_reproducible_seeds_per_rank() -> None:
    rank0 = _first_draw_per_worker(0, workers=True)
    assert sorted(rank0) == [0, 1]
    assert all(a != b for a, b in zip(rank0[0], rank0[1], strict=True))  # every generator differs per worker
    assert _first_draw_per_worker(0, workers=True) == rank0  # and is reproducible
    rank1 = _first_draw_per_worker(1, workers=True)
    assert all(rank0[w][i] != rank1[w][i] for w in (0, 1) for i in range(3))  # differs across ranks
    # Without workers=True, worker w of every rank draws the same numbers (the problem it solves).
    assert _first_draw_per_worker(0, workers=False) == _first_draw_per_worker(1, workers=False)


@pytest.mark.usefixtures("clean_seed_env")
def test_add_worker_init_fn_respects_the_flag_and_the_users_function() -> None:
    loader = DataLoader(_RandomPerWorker(), num_workers=1)
    add_worker_init_fn(loader, rank=3)
    assert loader.worker_init_fn is None  # seed_everything never ran

    seed_everything(1, workers=False, verbose=False)
    add_worker_init_fn(loader, rank=3)
    assert loader.worker_init_fn is None

    seed_everything(1, workers=True, verbose=False)
    add_worker_init_fn(loader, rank=3)
    fn = pickle.loads(pickle.dumps(loader.worker_init_fn))  # spawned workers receive it pickled
    assert fn.func is worker_init_function
    assert fn.keywords == {"rank": 3}

    def own(worker_id: int) -> None:
        del worker_id

    mine = DataLoader(_RandomPerWorker(), num_workers=1, worker_init_fn=own)
    add_worker_init_fn(mine, rank=0)
    assert mine.worker_init_fn is own
    add_worker_init_fn([1, 2, 3], rank=0)  # not a DataLoader: left alone, no error


@pytest.mark.usefixtures("clean_seed_env")
@pytest.mark.parametrize("rank", [5], indirect=True)
def test_worker_init_function_defaults_to_rank_zero_only_rank(rank: int) -> None:
    torch.manual_seed(10)
    worker_init_function(0)
    default = _draws()
    torch.manual_seed(10)
    worker_init_function(0, rank=rank)
    assert _draws() == default


# ------------------------------------------------------------------------------------------ isolate_rng


@pytest.mark.usefixtures("clean_seed_env")
def test_isolate_rng_restores_every_generator_even_after_an_error() -> None:
    seed_everything(3, verbose=False)
    with isolate_rng():
        inside = _draws()
    assert _draws() == inside
    seed_everything(3, verbose=False)
    with pytest.raises(RuntimeError, match="boom"), isolate_rng(include_cuda=False):
        _draws()
        raise RuntimeError("boom")
    assert _draws() == inside


# ------------------------------------------------------------------------------------------- rank zero


def test_rank_zero_only_rank_comes_from_the_environment_in_lightnings_order() -> None:
    code = "import sys, phalanx.utilities.rank_zero as r; print(r.rank_zero_only.rank, 'torch' in sys.modules)"
    cases = [
        ({}, "0"),
        ({"RANK": "3", "LOCAL_RANK": "1", "SLURM_PROCID": "5"}, "3"),
        ({"LOCAL_RANK": "1", "SLURM_PROCID": "5"}, "1"),
        ({"SLURM_PROCID": "5", "JSM_NAMESPACE_RANK": "2"}, "5"),
        ({"JSM_NAMESPACE_RANK": "2"}, "2"),
    ]
    for env, expected in cases:
        assert run_python(code, env=env).stdout.split() == [expected, "False"], env


def test_rank_from_env_distinguishes_unset_from_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in rank_zero.RANK_ENV_VARS:
        monkeypatch.delenv(key, raising=False)
    assert rank_from_env() is None
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert rank_from_env() == 0
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x' is not an integer rank"):
        rank_from_env()


@pytest.mark.parametrize("rank", [0, 1], indirect=True)
def test_rank_zero_only_runs_on_rank_zero_and_returns_the_default_elsewhere(rank: int) -> None:
    calls: list[int] = []

    @rank_zero_only
    def record(value: int) -> int:
        calls.append(value)
        return value

    def plain(value: int) -> str:
        return str(value)

    with_default = rank_zero_only(plain, "skipped")
    assert record(4) == (4 if rank == 0 else None)
    assert calls == ([4] if rank == 0 else [])
    assert with_default(4) == ("4" if rank == 0 else "skipped")
    assert record.__name__ == "record"  # functools.wraps


@pytest.mark.parametrize("rank", [0, 2], indirect=True)
def test_rank_zero_warnings_point_at_the_caller_and_stay_silent_elsewhere(rank: int) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_zero_warn("careful")
        rank_zero_deprecation("old")
        cache = WarningCache()
        cache.warn("once")
        cache.warn("once")
        cache.deprecation("dep once")
        cache.deprecation("dep once")
    if rank != 0:
        assert caught == []
        return
    assert [(str(w.message), w.category, w.filename) for w in caught] == [
        ("careful", UserWarning, THIS_FILE),
        ("old", LightningDeprecationWarning, THIS_FILE),  # a DeprecationWarning, under Lightning's category
        ("once", UserWarning, THIS_FILE),
        ("dep once", LightningDeprecationWarning, THIS_FILE),
    ]
    assert issubclass(LightningDeprecationWarning, DeprecationWarning)


@pytest.mark.parametrize("rank", [0, 1], indirect=True)
def test_rank_zero_info_and_debug_log_on_rank_zero_from_the_callers_line(
    rank: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="phalanx"):
        rank_zero_info("hello %s", "info")
        rank_zero_debug("hello debug")
        WarningCache().info("cached info")
    records = [(r.levelno, r.getMessage(), r.pathname) for r in caplog.records if r.name.startswith("phalanx.")]
    expected = [
        (logging.INFO, "hello info", THIS_FILE),
        (logging.DEBUG, "hello debug", THIS_FILE),
        (logging.INFO, "cached info", THIS_FILE),
    ]
    assert records == (expected if rank == 0 else [])


def test_rank_zero_info_is_shown_to_the_user_on_rank_zero_only() -> None:
    code = "from phalanx.utilities import rank_zero_info; rank_zero_info('visible')"
    assert run_python(code).stderr.strip() == "visible"
    assert run_python(code, env={"RANK": "1"}).stderr.strip() == ""


def test_rank_prefixed_message() -> None:
    assert rank_prefixed_message("hi", 2) == "[rank: 2] hi"
    assert rank_prefixed_message("hi", None) == "hi"
