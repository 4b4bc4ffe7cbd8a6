"""phalanx.trainer.flight_recorder: turning torch's recorder on, and comparing the ranks' collectives.

The recorder itself, on two real gloo ranks, is exercised by tests/reliability/test_hangs.py (the
desync that returned); here the comparison runs on entries as ``read`` makes them.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from phalanx.trainer import flight_recorder


def _entry(
    seq: int, op: str = "gloo:all_gather", line: int = 10, function: str = "training_step", **extra: Any
) -> dict[str, Any]:
    site = {"file": "train.py", "line": line, "function": function, "kind": "user"}
    entry = {"group": "default_pg", "seq": seq, "p2p": False, "op": op, "sizes": [[8]], "site": site,
             "via": None, "hook": function, "created": seq * 1000}  # fmt: skip
    entry.update(extra)
    return entry


def _snapshots(*ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"rank": rank, "collectives": entries} for rank, entries in enumerate(ranks)]


def test_ranks_that_issued_the_same_collectives_agree() -> None:
    same = [_entry(seq) for seq in range(1, 6)]
    assert flight_recorder.first_divergence(_snapshots(same, [dict(e) for e in same])) is None
    lines = flight_recorder.format_divergence(_snapshots(same, same))
    assert lines == ["  the ranks' recorded collectives (torch's flight recorder) agree, as far back as they go"]


def test_an_extra_collective_on_one_rank_is_named_with_what_the_other_issued_there() -> None:
    """Rank 0's callback issued #4 (same op and sizes as rank 1's #4, from another line)."""
    rank0 = [_entry(1), _entry(2), _entry(3), _entry(4, line=42, function="on_validation_end"), _entry(5)]
    rank1 = [_entry(1), _entry(2), _entry(3), _entry(4)]
    divergence = flight_recorder.first_divergence(_snapshots(rank0, rank1))
    assert divergence is not None and divergence["seq"] == 4 and divergence["group"] == "default_pg"
    lines = "\n".join(flight_recorder.format_divergence(_snapshots(rank0, rank1)))
    assert "first differ at collective #4 of group 'default_pg'" in lines
    assert "rank 0: gloo:all_gather [[8]] from train.py:42 in on_validation_end\n" in lines + "\n"
    assert "rank 1: gloo:all_gather [[8]] from train.py:10 in training_step" in lines


def test_a_collective_only_one_rank_issued_and_different_operations_count() -> None:
    rank0 = [_entry(1), _entry(2, op="gloo:all_reduce")]
    rank1 = [_entry(1), _entry(2)]
    assert flight_recorder.first_divergence(_snapshots(rank0, rank1))["seq"] == 2  # type: ignore[index]
    ahead = flight_recorder.first_divergence(_snapshots([_entry(1), _entry(2)], [_entry(1)]))
    assert ahead is not None and ahead["entries"][1] is None
    assert "(none yet: this rank has not issued it)" in "\n".join(
        flight_recorder.format_divergence(_snapshots([_entry(1), _entry(2)], [_entry(1)]))
    )


def test_positions_older_than_a_ranks_window_are_not_differences() -> None:
    """Each rank sends its newest entries: rank 1's window starts later, so #1-#2 are not compared."""
    rank0 = [_entry(seq) for seq in range(1, 6)]
    rank1 = [_entry(seq) for seq in range(3, 6)]
    assert flight_recorder.first_divergence(_snapshots(rank0, rank1)) is None


def test_of_differences_in_two_groups_the_earlier_is_named() -> None:
    later = _entry(7, line=50, created=9000)
    earlier = _entry(3, line=60, group="mesh_dp", created=2000)
    rank0 = [later, earlier]
    rank1 = [_entry(7, created=9000), _entry(3, group="mesh_dp", created=2000)]
    divergence = flight_recorder.first_divergence(_snapshots(rank0, rank1))
    assert divergence is not None and (divergence["group"], divergence["seq"]) == ("mesh_dp", 3)


def test_no_recorded_collectives_add_no_lines_and_one_ranks_are_not_compared() -> None:
    assert flight_recorder.format_divergence([{"rank": 0}, {"rank": 1, "collectives": []}]) == []
    alone = [{"rank": 0, "collectives": [_entry(1)], "recorded_to": "/runs/flight_recorder"}, {"rank": 1}]
    lines = flight_recorder.format_divergence(alone)
    assert len(lines) == 1 and lines[0].startswith("  recorded collectives of every rank: /runs/flight_recorder"), lines


def test_enable_sets_the_buffer_only_for_a_distributed_stage_with_the_hang_report_and_keeps_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(flight_recorder.ENV, "recorded")  # monkeypatch now knows the original, to restore it
    monkeypatch.delenv(flight_recorder.ENV)
    assert flight_recorder.enable(world_size=1, hang_report=True) is False
    assert flight_recorder.enable(world_size=2, hang_report=False) is False
    assert flight_recorder.ENV not in os.environ
    assert flight_recorder.enable(world_size=2, hang_report=True) is True
    assert os.environ[flight_recorder.ENV] == str(flight_recorder.ENTRIES)
    monkeypatch.setenv(flight_recorder.ENV, "0")  # the user's own setting wins: off
    assert flight_recorder.enable(world_size=2, hang_report=True) is False
    monkeypatch.undo()  # before the leak check that follows each test
