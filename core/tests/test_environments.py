"""Cluster environments: what each reads from the environment, detection, and its error messages."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from phalanx.environments import ClusterEnvironment, LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment
from phalanx.errors import MisconfigurationError

_ALL_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "GROUP_RANK", "RANK",
    "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_JOB_NAME", "SLURM_NODELIST",
    "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "PHALANX_CLUSTER_ENVIRONMENT",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _ALL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _torchrun_vars(monkeypatch: pytest.MonkeyPatch, **overrides: str) -> None:
    values = {"RANK": "3", "GROUP_RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4",
              "TORCHELASTIC_RUN_ID": "abc", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}  # fmt: skip
    for key, value in {**values, **overrides}.items():
        monkeypatch.setenv(key, value)


def _slurm_vars(monkeypatch: pytest.MonkeyPatch, **overrides: str) -> None:
    values = {"SLURM_NTASKS": "8", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "gpu[007-008]",
              "SLURM_JOB_ID": "1234567", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
              "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2"}  # fmt: skip
    for key, value in {**values, **overrides}.items():
        monkeypatch.setenv(key, value)


def test_local_defaults_pick_loopback_and_a_free_port() -> None:
    env = LocalEnvironment()
    assert isinstance(env, ClusterEnvironment)
    assert env.main_address == "127.0.0.1"
    port = env.main_port
    assert env.main_port == port  # chosen once
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # and really free
    assert (env.local_rank(), env.node_rank(), env.global_rank(), env.world_size()) == (0, 0, 0, 1)
    assert not env.creates_processes_externally
    assert LocalEnvironment.detect()


def test_local_reads_the_launcher_variables(_clean: pytest.MonkeyPatch) -> None:
    for key, value in {"MASTER_ADDR": "node0", "MASTER_PORT": "1234", "LOCAL_RANK": "2", "NODE_RANK": "1"}.items():
        _clean.setenv(key, value)
    env = LocalEnvironment()
    assert (env.main_address, env.main_port, env.local_rank(), env.node_rank()) == ("node0", 1234, 2, 1)
    assert env.creates_processes_externally  # a re-run child
    env.set_global_rank(5)
    env.set_world_size(6)
    assert (env.global_rank(), env.world_size()) == (5, 6)


def test_local_node_rank_falls_back_to_group_rank(_clean: pytest.MonkeyPatch) -> None:
    _clean.setenv("GROUP_RANK", "3")
    assert LocalEnvironment().node_rank() == 3


def test_local_bad_integer_names_the_variable(_clean: pytest.MonkeyPatch) -> None:
    _clean.setenv("MASTER_PORT", "http")
    with pytest.raises(MisconfigurationError, match=r"MASTER_PORT='http' is not an integer.*Fix: set MASTER_PORT"):
        _ = LocalEnvironment().main_port


def test_torchelastic_detection_needs_every_torchrun_variable(_clean: pytest.MonkeyPatch) -> None:
    assert not TorchElasticEnvironment.detect()
    _torchrun_vars(_clean)
    assert TorchElasticEnvironment.detect()
    _clean.delenv("TORCHELASTIC_RUN_ID")
    assert not TorchElasticEnvironment.detect()


def test_torchelastic_reads_ranks_and_ignores_setters(_clean: pytest.MonkeyPatch) -> None:
    _torchrun_vars(_clean)
    env = TorchElasticEnvironment()
    env.set_global_rank(0)
    env.set_world_size(1)
    assert (env.global_rank(), env.world_size(), env.local_rank(), env.node_rank()) == (3, 4, 1, 1)
    assert (env.main_address, env.main_port) == ("10.0.0.1", 29400)
    assert env.creates_processes_externally
    env.validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(MisconfigurationError, match=r"devices=4, num_nodes=2.*WORLD_SIZE=4.*Fix: pass devices=2"):
        env.validate_settings(num_devices=4, num_nodes=2)


def test_slurm_detection_excludes_interactive_shells(_clean: pytest.MonkeyPatch) -> None:
    assert not SLURMEnvironment.detect()
    _slurm_vars(_clean)
    assert SLURMEnvironment.detect()
    _clean.setenv("SLURM_JOB_NAME", "bash")  # srun --pty bash: the user is at a shell, not in a task
    assert not SLURMEnvironment.detect()


def test_slurm_ranks_address_and_port(_clean: pytest.MonkeyPatch) -> None:
    _slurm_vars(_clean)
    env = SLURMEnvironment()
    assert (env.global_rank(), env.world_size(), env.local_rank(), env.node_rank()) == (5, 8, 1, 1)
    assert env.main_address == "gpu007"
    assert env.main_port == 15000 + 4567
    _clean.setenv("MASTER_ADDR", "login1")
    _clean.setenv("MASTER_PORT", "2222")
    assert (env.main_address, env.main_port) == ("login1", 2222)


@pytest.mark.parametrize(
    ("nodelist", "root"),
    [
        ("host0", "host0"),
        ("host0 host1", "host0"),
        ("host0,host1", "host0"),
        ("host[5-9]", "host5"),
        ("host[5]", "host5"),
        ("node[007-009,012],gpu1", "node007"),
        ("r[1-2]n[3,5]", "r1n3"),
        ("a-b[001-003]-ib", "a-b001-ib"),
    ],
)
def test_slurm_first_host_of_a_nodelist(nodelist: str, root: str) -> None:
    assert SLURMEnvironment.resolve_root_node_address(nodelist) == root


def test_slurm_validate_settings_names_both_numbers(_clean: pytest.MonkeyPatch) -> None:
    _slurm_vars(_clean)
    env = SLURMEnvironment()
    env.validate_settings(num_devices=4, num_nodes=2)
    with pytest.raises(MisconfigurationError, match=r"devices=2\).*--ntasks-per-node=4.*Fix: pass devices=4"):
        env.validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(MisconfigurationError, match=r"num_nodes=1\).*--nodes=2"):
        env.validate_settings(num_devices=4, num_nodes=1)
    _clean.delenv("SLURM_NTASKS_PER_NODE")
    _clean.delenv("SLURM_NNODES")
    with pytest.raises(MisconfigurationError, match=r"SLURM_NTASKS=8.*--nodes=1 --ntasks-per-node=4"):
        env.validate_settings(num_devices=4, num_nodes=1)


def test_detection_through_the_plugin_hook(_clean: pytest.MonkeyPatch) -> None:
    from phalanx.discovery import detect_cluster_environment

    assert type(detect_cluster_environment()) is LocalEnvironment
    _torchrun_vars(_clean)
    assert type(detect_cluster_environment()) is TorchElasticEnvironment
    for key in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        _clean.delenv(key)
    _slurm_vars(_clean)
    assert type(detect_cluster_environment()) is SLURMEnvironment


def test_environments_do_not_import_torch() -> None:
    code = "import sys, phalanx.environments; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
