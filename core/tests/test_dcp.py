"""The core's sharded checkpoint format (``phalanx.checkpoint_io.dcp``): save, read, check, convert.

Single-process tests use DCP's no-process-group mode on a plain model; the two-rank tests run
``dcp_scripts/dcp_two_ranks.py`` on real gloo ranks with an FSDP2-sharded model, synchronously
and through ``AsyncCheckpointIO``, and compare what is read back with the weights saved.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import phalanx
from phalanx.checkpoint_io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO, dcp
from phalanx.errors import CheckpointError
from phalanx.testing.processes import run_commands

SCRIPT = Path(__file__).parent / "dcp_scripts" / "dcp_two_ranks.py"


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _save(path: Path | str, model: nn.Module, optimizer: torch.optim.Optimizer, io: CheckpointIO) -> None:
    with warnings.catch_warnings():  # DCP: "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(
            {"epoch": 3, "state_dict": "replaced", "accumulated_grads": 1},
            path,
            model=model,
            optimizers=[optimizer],
            checkpoint_io=io,
            is_global_zero=True,
            barrier=lambda: None,
            world_size=1,
            strategy="test",
        )
        dcp.finish_saves(io)


@pytest.mark.parametrize("io", [TorchCheckpointIO(), AsyncCheckpointIO()], ids=["sync", "async"])
def test_save_then_read_restores_weights_and_optimizer(tmp_path: Path, io: CheckpointIO) -> None:
    model, optimizer = _model()
    path = tmp_path / "a.ckpt"
    _save(path, model, optimizer, io)
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]  # staging published, nothing left
    assert dcp.is_dcp_checkpoint(path)
    meta = dcp.read_meta(path)
    assert meta["epoch"] == 3 and "accumulated_grads" not in meta and "state_dict" not in meta
    assert meta["dcp"]["strategy"] == "test" and meta["dcp"]["num_optimizers"] == 1
    assert dcp.saved_shapes(path) == {"0.weight": (3, 4), "0.bias": (3,), "1.weight": (2, 3), "1.bias": (2,)}

    torch.manual_seed(1)
    fresh = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        checkpoint = dcp.read(path, model=fresh, optimizers=[fresh_optimizer], checkpoint_io=io)
    assert dcp.read_from_shards(checkpoint)
    dcp.apply_model_state(fresh, checkpoint["state_dict"])
    dcp.apply_optimizer_states(fresh, [fresh_optimizer], checkpoint["optimizer_states"])
    for key, value in model.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value, atol=0, rtol=0)
    expected = optimizer.state_dict()
    assert fresh_optimizer.state_dict()["param_groups"][0]["lr"] == 0.1
    for index, state in expected["state"].items():
        torch.testing.assert_close(fresh_optimizer.state_dict()["state"][index]["exp_avg"], state["exp_avg"])
    io.teardown()


def test_convert_writes_the_full_weights_as_a_portable_file(tmp_path: Path) -> None:
    model, optimizer = _model()
    _save(tmp_path / "a.ckpt", model, optimizer, TorchCheckpointIO())
    assert dcp.convert_to_portable(str(tmp_path / "a.ckpt"), str(tmp_path / "p.pt")) is True
    portable = torch.load(tmp_path / "p.pt", weights_only=True)
    assert portable["converted_from"] == "a.ckpt"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(portable["state_dict"][key], value, atol=0, rtol=0)


def test_other_paths_are_not_recognised(tmp_path: Path) -> None:
    model, optimizer = _model()
    _save(tmp_path / "a.ckpt", model, optimizer, TorchCheckpointIO())
    (tmp_path / "a.ckpt" / "meta.pt").unlink()
    torch.save({"state_dict": {}}, tmp_path / "plain.pt")
    for path in (tmp_path / "a.ckpt", tmp_path / "plain.pt", tmp_path, tmp_path / "missing"):
        assert not dcp.is_dcp_checkpoint(path)
        assert dcp.convert_to_portable(str(path), str(tmp_path / "x.pt")) is None
    assert not (tmp_path / "x.pt").exists()
    with pytest.raises(CheckpointError, match=r"holds DCP shards but no meta.pt.*earlier checkpoint"):
        dcp.read_meta(tmp_path / "a.ckpt")


def test_checkpoints_of_the_older_per_strategy_layout_still_read(tmp_path: Path) -> None:
    model, optimizer = _model()
    path = tmp_path / "old.ckpt"
    _save(path, model, optimizer, TorchCheckpointIO())
    meta = torch.load(path / "meta.pt", weights_only=True)
    del meta["dcp"]
    meta["model_parallel"] = {"format": "phalanx-model-parallel-dcp", "version": 1, "num_optimizers": 1}
    (path / "meta.pt").unlink()
    torch.save(meta, path / "trainer_state.pt")
    assert dcp.is_dcp_checkpoint(path)
    assert dcp.read_meta(path)["dcp"]["strategy"] == "model_parallel"


def test_a_checkpoint_of_another_model_is_refused_naming_the_difference(tmp_path: Path) -> None:
    model, optimizer = _model()
    _save(tmp_path / "a.ckpt", model, optimizer, TorchCheckpointIO())
    other = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 2))
    with pytest.raises(CheckpointError) as error:
        dcp.read(tmp_path / "a.ckpt", model=other, optimizers=[], checkpoint_io=TorchCheckpointIO())
    text = str(error.value)
    assert "does not fit the model Sequential" in text and "0.weight: checkpoint (3, 4) vs model (5, 4)" in text
    assert "Fix:" in text
    bigger = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=r"missing keys \['2.weight', '2.bias'\]"):
        dcp.check_model_matches(bigger, dcp.saved_shapes(tmp_path / "a.ckpt"), source="a", strict=True)
    dcp.check_model_matches(bigger, dcp.saved_shapes(tmp_path / "a.ckpt"), source="a", strict=False)


def test_another_number_of_optimizers_is_refused(tmp_path: Path) -> None:
    model, optimizer = _model()
    _save(tmp_path / "a.ckpt", model, optimizer, TorchCheckpointIO())
    two = [torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)]
    with pytest.raises(CheckpointError, match="holds 1 optimizer state.*created 2"):
        dcp.read(tmp_path / "a.ckpt", model=model, optimizers=two, checkpoint_io=TorchCheckpointIO())


# ---------------------------------------------------------------------- two gloo ranks
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_two_ranks(out: Path, mode: str) -> None:
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
    envs = [{**env, "RANK": str(rank), "PYTHONWARNINGS": "ignore"} for rank in range(2)]
    results = run_commands([[str(SCRIPT), str(out), mode]] * 2, cwd=out, envs=envs, timeout=120)
    for rank, result in enumerate(results):
        assert result.returncode == 0, f"rank {rank} exited with {result.returncode}:\n{result.output()[-4000:]}"
        result.check_leftovers()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_ranks_read_back_exactly_what_they_saved(tmp_path: Path, mode: str) -> None:
    _run_two_ranks(tmp_path, mode)
    saved: dict[str, Any] = torch.load(tmp_path / f"{mode}_saved.pt", weights_only=True)
    read_back = torch.load(tmp_path / f"{mode}_read.pt", weights_only=True)
    for key, value in saved.items():
        torch.testing.assert_close(read_back[key], value, atol=0, rtol=0)
    # and one process without a process group assembles the same full weights from both shards
    state_dict, meta = dcp.load_full_model_state(tmp_path / f"{mode}.ckpt")
    assert meta["dcp"]["world_size"] == 2 and meta["global_step"] == 1
    for key, value in saved.items():
        torch.testing.assert_close(state_dict[key], value, atol=0, rtol=0)


# ---------------------------------------------------------------------- the core answers for its format
class _Tiny(phalanx.Module):
    def __init__(self, hidden: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, 2))


def test_convert_and_load_from_checkpoint_need_no_strategy_plugin(tmp_path: Path) -> None:
    """With fsdp and model_parallel blocked, the core alone converts and loads its sharded format."""
    torch.manual_seed(0)
    model = _Tiny(hidden=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(
            {"hyper_parameters": {"hidden": 5}, "global_step": 7},
            tmp_path / "m.ckpt",
            model=model,
            optimizers=[],
            checkpoint_io=TorchCheckpointIO(),
            is_global_zero=True,
            barrier=lambda: None,
            world_size=1,
            strategy="test",
        )
    env = {**os.environ, "PHALANX_DISABLE_PLUGINS": "fsdp,model_parallel"}
    code = "import sys; from phalanx.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "checkpoint", "convert", str(tmp_path / "m.ckpt"), str(tmp_path / "p.pt")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    portable = torch.load(tmp_path / "p.pt", weights_only=True)
    assert portable["global_step"] == 7
    for key, value in model.state_dict().items():
        torch.testing.assert_close(portable["state_dict"][key], value, atol=0, rtol=0)
    loaded = _Tiny.load_from_checkpoint(tmp_path / "m.ckpt")
    assert loaded.hparams["hidden"] == 5
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, atol=0, rtol=0)


@pytest.mark.parametrize("io", [TorchCheckpointIO(), AsyncCheckpointIO()], ids=["sync", "async"])
def test_a_url_is_written_and_read_through_fsspec(tmp_path: Path, io: CheckpointIO) -> None:
    """``memory://`` stands for an object store: DCP's fsspec writer and reader, the commit marker."""
    import fsspec

    model, optimizer = _model()
    url = f"memory://dcp-test/{tmp_path.name}/a.ckpt"
    try:
        _save(url, model, optimizer, io)
        assert dcp.is_dcp_checkpoint(url)
        assert dcp.read_meta(url)["epoch"] == 3
        weights, _ = dcp.load_full_model_state(url)
        for key, value in model.state_dict().items():
            torch.testing.assert_close(weights[key], value, atol=0, rtol=0)
        assert dcp.convert_to_portable(url, str(tmp_path / "p.pt")) is True
        assert torch.load(tmp_path / "p.pt", weights_only=True)["state_dict"].keys() == model.state_dict().keys()
    finally:
        io.teardown()
        memory = fsspec.filesystem("memory")
        if memory.exists(f"/dcp-test/{tmp_path.name}"):
            memory.rm(f"/dcp-test/{tmp_path.name}", recursive=True)
