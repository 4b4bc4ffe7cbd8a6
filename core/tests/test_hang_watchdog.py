"""The hang watchdog's parts in one process: snapshots of a blocked thread, the report, the side channel.

The 2-rank behaviour (a real hang under ddp and fsdp, SIGTERM during it) is tested in
tests/reliability/test_hangs.py; here the pieces run against a real TCPStore and a real thread
blocked the way a collective blocks (in native code, with the GIL released).
"""

from __future__ import annotations

import datetime
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist

from phalanx import Trainer
from phalanx.environments.preemption import GRACE_ENV, grace_seconds
from phalanx.errors import MisconfigurationError
from phalanx.trainer.hang_report import first_difference, format_report, snapshot
from phalanx.trainer.watchdog import Watchdog

#: Holds wall-clock bounds: under xdist it runs with the machine to itself (phalanx.testing.scheduling).
pytestmark = pytest.mark.timing


def _user_function_that_blocks(event: threading.Event, released: threading.Event) -> None:
    event.set()
    released.wait(30)  # native wait, GIL released: like a rank inside a collective


@pytest.fixture
def blocked_thread() -> Any:
    started, released = threading.Event(), threading.Event()
    thread = threading.Thread(target=_user_function_that_blocks, args=(started, released), daemon=True)
    thread.start()
    started.wait(5)
    yield thread
    released.set()
    thread.join(5)


def test_snapshot_reads_another_threads_stack_with_user_frames_marked(blocked_thread: threading.Thread) -> None:
    snap = snapshot(rank=3, position={"stage": "train", "last_hook": "on_train_batch_end"}, thread=blocked_thread)
    functions = [(frame["function"], frame["kind"]) for frame in snap["stack"]]
    assert ("_user_function_that_blocks", "user") in functions
    assert any(kind == "library" for _, kind in functions)  # threading.py is folded
    assert snap["rank"] == 3 and snap["collective"] is None
    text = format_report([snap], headline="test")
    assert "rank 3" in text and "_user_function_that_blocks" in text
    assert "released.wait(30)" in text  # the source line of the user's frame
    assert "not inside a torch.distributed call" in text


def _snap(rank: int, frames: list[tuple[str, int, str]], op: str | None) -> dict[str, Any]:
    stack = [{"file": f, "line": n, "function": fn, "code": "", "kind": "user"} for f, n, fn in frames]
    collective = {"op": op, "where": "torch/distributed/distributed_c10d.py:1"} if op else None
    return {"rank": rank, "host": "h", "pid": 1, "position": {}, "collective": collective, "stack": stack}


def test_first_difference_names_where_the_ranks_paths_split() -> None:
    common = [("train.py", 10, "main"), ("loop.py", 5, "run")]
    a = _snap(0, [*common, ("loop.py", 7, "run"), ("cb.py", 3, "hook")], "all_gather_into_tensor")
    b = _snap(1, [*common, ("loop.py", 8, "run")], "all_reduce")
    depth, frames = first_difference([a, b])  # type: ignore[misc]
    assert depth == 2
    assert frames[0]["line"] == 7 and frames[1]["line"] == 8  # type: ignore[index]
    assert first_difference([a, a]) is None
    text = format_report([a, b], headline="stuck", missing=[2], footer="bye")
    assert "first differ at frame 2" in text
    assert "rank 0: all_gather_into_tensor, rank 1: all_reduce" in text
    assert "rank 2: no answer" in text and text.rstrip().endswith("bye")


def test_watchdog_reports_a_stall_through_the_store(blocked_thread: threading.Thread, capsys: Any) -> None:
    """A rank whose progress counters stop moving asks for reports; rank 0 prints them from the store."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))
    run = SimpleNamespace(
        strategy=SimpleNamespace(global_rank=0, world_size=1),
        hooks=SimpleNamespace(calls=0, current="on_validation_epoch_end"),
        fit_loop=SimpleNamespace(total_batches_done=5, epoch=0, global_step=5, preemption=SimpleNamespace(preempted=False)),
        stage="validate",
    )
    watchdog = Watchdog(run, report_after=1.0, store=store)  # type: ignore[arg-type]
    watchdog.start()
    try:
        deadline = time.monotonic() + 15
        while not watchdog.reports and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        watchdog.stop()
    assert watchdog.reports, "no report within 15 s of a 1 s stall"
    report = watchdog.reports[0]
    assert "no rank finished a step or hook for" in report
    assert "last hook on_validation_epoch_end" in report and "step 5" in report
    assert "[phalanx] hang report" in capsys.readouterr().err
    assert int(store.add("phalanx-watchdog/request", 0)) == 1  # one request for one stall


@pytest.mark.parametrize("value", [0, -5, "60", True, [60]])
def test_hang_report_after_rejects_what_is_not_a_duration(value: Any) -> None:
    with pytest.raises(MisconfigurationError, match=r"hang_report_after=.*hang_report_after=60"):
        Trainer(hang_report_after=value)


def test_hang_report_after_takes_seconds_a_timedelta_or_none() -> None:
    assert Trainer(hang_report_after=5).config.hang_report_after == 5.0
    assert Trainer(hang_report_after=datetime.timedelta(minutes=2)).config.hang_report_after == 120.0
    assert Trainer(hang_report_after=None).config.hang_report_after is None
    assert Trainer().config.hang_report_after == 50.0


def test_preemption_grace_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GRACE_ENV, raising=False)
    assert grace_seconds() == 15.0
    monkeypatch.setenv(GRACE_ENV, "40")
    assert grace_seconds() == 40.0
    monkeypatch.setenv(GRACE_ENV, "soon")
    with pytest.raises(MisconfigurationError, match="PHALANX_PREEMPTION_GRACE='soon'.*Fix"):
        grace_seconds()


def _blocks_holding_tensor_classes(types: tuple[type, ...], tensor: Any, event: threading.Event, released: threading.Event) -> None:
    event.set()
    released.wait(30)  # like torch's memory tracker's dispatch: its ``types`` argument holds classes


def test_a_frame_holding_tensor_classes_is_described_by_its_tensors_only() -> None:
    """A dispatch mode's ``types`` argument holds tensor classes, whose ``shape`` is a descriptor: once
    this ended the watchdog thread with a TypeError; classes are skipped, the tensor is named."""
    import sys

    import torch

    from phalanx.trainer.hang_report import _describe_tensors

    started, released = threading.Event(), threading.Event()
    args = ((torch.Tensor, torch.nn.Parameter), torch.zeros(2, 3), started, released)
    thread = threading.Thread(target=_blocks_holding_tensor_classes, args=args, daemon=True)
    thread.start()
    try:
        assert started.wait(5)
        frame = sys._current_frames()[thread.ident]  # type: ignore[index]
        while frame.f_code.co_name != "_blocks_holding_tensor_classes":
            frame = frame.f_back
        assert _describe_tensors(frame) == ["tensor: float32[2, 3]"]
    finally:
        released.set()
        thread.join(5)


def test_a_snapshot_that_cannot_be_read_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong while reading a stack, the watchdog's report names it and the thread lives on."""
    import phalanx.trainer.watchdog as watchdog_module

    def broken(**_: Any) -> dict[str, Any]:
        raise TypeError("'getset_descriptor' object is not iterable")

    monkeypatch.setattr(watchdog_module, "snapshot", broken)
    dog = Watchdog.__new__(Watchdog)
    dog._rank = 1
    dog.position = lambda: {}  # type: ignore[method-assign]
    snap = dog._snapshot()
    assert snap["rank"] == 1 and snap["stack"] == []
    text = format_report([snap], headline="test")
    assert "the stack could not be read: TypeError: 'getset_descriptor' object is not iterable" in text
