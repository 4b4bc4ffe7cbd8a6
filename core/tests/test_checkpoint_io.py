"""Checkpoint IO: atomic writes, safe loading, clear errors, background saves."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx.checkpoint_io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from phalanx.errors import CheckpointError, MisconfigurationError


class ExplodesWhenPickled:
    """Makes torch.save fail after it has started writing the file."""

    def __reduce__(self) -> tuple[object, ...]:
        msg = "simulated crash in the middle of torch.save"
        raise RuntimeError(msg)


class Custom:
    """A plain class: not allowed by weights_only=True."""

    def __init__(self, value: int) -> None:
        self.value = value


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_save_then_load_round_trips_and_loads_to_cpu(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    checkpoint: dict[str, Any] = {"state_dict": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "names": ["a", "b"]}
    target = tmp_path / "nested" / "dir" / "last.ckpt"
    io.save_checkpoint(checkpoint, target)
    loaded = io.load_checkpoint(target)
    assert torch.equal(loaded["state_dict"]["w"], checkpoint["state_dict"]["w"])
    assert loaded["epoch"] == 3 and loaded["names"] == ["a", "b"]
    assert loaded["state_dict"]["w"].device.type == "cpu"
    assert _leftovers(target.parent) == []


def test_saved_file_gets_normal_permissions(tmp_path: Path) -> None:
    target = tmp_path / "perm.ckpt"
    TorchCheckpointIO().save_checkpoint({"x": 1}, target)
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_a_crash_mid_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(1000)}, target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError, match="simulated crash"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(1000), "boom": ExplodesWhenPickled()}, target)
    assert target.read_bytes() == before
    assert io.load_checkpoint(target)["step"] == 1
    assert _leftovers(tmp_path) == []


def test_overwrite_replaces_the_file(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, target)
    io.save_checkpoint({"step": 2}, target)
    assert io.load_checkpoint(target)["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_weights_only_refuses_custom_objects_and_explains_the_opt_out(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "custom.ckpt"
    io.save_checkpoint({"obj": Custom(7)}, target)
    with pytest.raises(CheckpointError, match="weights_only=False") as info:
        io.load_checkpoint(target)
    assert "Custom" in str(info.value)
    assert str(target) in str(info.value)
    assert io.load_checkpoint(target, weights_only=False)["obj"].value == 7


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "nope.ckpt"
    with pytest.raises(CheckpointError, match="does not exist") as info:
        TorchCheckpointIO().load_checkpoint(target)
    assert str(target) in str(info.value)
    with pytest.raises(CheckpointError, match="is a directory"):
        TorchCheckpointIO().load_checkpoint(tmp_path)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint" * 20, "truncated"])
@pytest.mark.parametrize("weights_only", [True, False])
def test_corrupt_files_are_reported_as_invalid(tmp_path: Path, content: bytes | str, weights_only: bool) -> None:
    target = tmp_path / "bad.ckpt"
    if content == "truncated":
        TorchCheckpointIO().save_checkpoint({"w": torch.ones(4096)}, target)
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    else:
        target.write_bytes(content)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="is not a valid checkpoint") as info:
        TorchCheckpointIO().load_checkpoint(target, weights_only=weights_only)
    assert str(target) in str(info.value)


def test_storage_options_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationError, match="storage_options=None"):
        TorchCheckpointIO().save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})


def test_remove_handles_files_directories_and_missing_paths(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "a.ckpt"
    io.save_checkpoint({}, target)
    io.remove_checkpoint(target)
    assert not target.exists()
    io.remove_checkpoint(target)  # missing: no error
    sharded = tmp_path / "sharded.ckpt"
    (sharded / "shard").mkdir(parents=True)
    (sharded / "shard" / "0.pt").write_bytes(b"x")
    io.remove_checkpoint(sharded)
    assert not sharded.exists()


class SlowIO(TorchCheckpointIO):
    """Holds each save until released, to prove saves run off the caller's thread."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[str] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):  # type: ignore[no-untyped-def]
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(10)
        super().save_checkpoint(checkpoint, path, storage_options)


def test_async_saves_in_the_background_from_a_snapshot(tmp_path: Path) -> None:
    inner = SlowIO()
    io = AsyncCheckpointIO(inner)
    weights = torch.ones(3)
    target = tmp_path / "async.ckpt"
    io.save_checkpoint({"w": weights}, target)  # returns while the save is blocked
    weights.add_(100)  # training keeps mutating the live tensor
    assert not target.exists()
    inner.release.set()
    io.teardown()
    assert inner.threads and inner.threads[0] != threading.current_thread().name
    assert torch.equal(TorchCheckpointIO().load_checkpoint(target)["w"], torch.ones(3))


def test_async_keeps_order_of_saves_and_removes_and_load_waits(tmp_path: Path) -> None:
    io = AsyncCheckpointIO()
    first, second = tmp_path / "1.ckpt", tmp_path / "2.ckpt"
    io.save_checkpoint({"n": 1}, first)
    io.save_checkpoint({"n": 2}, second)
    io.remove_checkpoint(first)
    assert io.load_checkpoint(second)["n"] == 2
    assert not first.exists()
    io.teardown()
    io.save_checkpoint({"n": 3}, first)  # usable again after teardown
    io.teardown()
    assert TorchCheckpointIO().load_checkpoint(first)["n"] == 3


def test_async_reraises_a_background_failure_on_teardown(tmp_path: Path) -> None:
    io = AsyncCheckpointIO()
    target = tmp_path / "a.ckpt"
    io.save_checkpoint({"boom": ExplodesWhenPickled()}, target)
    with pytest.raises(RuntimeError, match="simulated crash"):
        io.teardown()
    assert not target.exists() and _leftovers(tmp_path) == []
    io.teardown()  # the error is reported once


def test_async_reraises_a_background_failure_on_the_next_save(tmp_path: Path) -> None:
    io = AsyncCheckpointIO()
    io.save_checkpoint({"boom": ExplodesWhenPickled()}, tmp_path / "a.ckpt")
    for future in list(io._pending):  # let the save fail without consuming the error
        future.result()
    with pytest.raises(RuntimeError, match="simulated crash"):
        io.save_checkpoint({"ok": 1}, tmp_path / "b.ckpt")
    io.teardown()


def test_checkpoint_io_is_abstract() -> None:
    with pytest.raises(TypeError):
        CheckpointIO()  # type: ignore[abstract]
    assert os.path.basename(repr(AsyncCheckpointIO())).startswith("AsyncCheckpointIO(")


def test_portable_writer_keeps_weights_as_fp32_and_only_portable_state(tmp_path: Path) -> None:
    from phalanx.checkpoint_io.portable import write_portable_checkpoint
    from phalanx.version import __version__

    weights = {"w": torch.randn(2, 2, dtype=torch.bfloat16), "count": torch.tensor(3), "note": "kept"}
    extra = {"epoch": 1, "global_step": 7, "optimizer_states": [{}], "world_size": 4}
    target = tmp_path / "nested" / "portable.pt"
    write_portable_checkpoint(weights, str(target), source="/runs/last.ckpt", extra=extra)
    portable = torch.load(target, weights_only=True)
    assert portable["state_dict"]["w"].dtype == torch.float32
    assert torch.equal(portable["state_dict"]["w"], weights["w"].float())
    assert portable["state_dict"]["count"].dtype == torch.int64 and portable["state_dict"]["note"] == "kept"
    assert portable["phalanx_version"] == __version__ and portable["converted_from"] == "last.ckpt"
    assert (portable["epoch"], portable["global_step"], portable["world_size"]) == (1, 7, 4)
    assert "optimizer_states" not in portable
