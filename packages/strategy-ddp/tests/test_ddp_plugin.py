"""The ddp plugin's names, "auto" choice and DDPStrategy's configuration, checked in-process.

Nothing here starts a process group or a worker: these are the cheap checks of what happens before
a launch (names, launchers, argument validation, sampler injection).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
)

from phalanx import Trainer
from phalanx.checkpoint_io import TorchCheckpointIO
from phalanx.environments import LocalEnvironment, TorchElasticEnvironment
from phalanx.errors import MisconfigurationError
from phalanx.launchers import MultiProcessingLauncher, SubprocessScriptLauncher
from phalanx.registry import StrategyRegistry
from phalanx.strategies import DDPStrategy, ParallelStrategy
from phalanx.strategies._backend import validate_backend_for_device
from phalanx.strategies._distributed import resolve_reduce_op
from phalanx.trainer.data import prepare_loader
from phalanx_strategy_ddp import _plugin

_CPU2 = [torch.device("cpu")] * 2
_LAUNCH_WORDS = {"ddp": "re-runs your script", "ddp_spawn": "spawn", "ddp_fork": "forks", "ddp_notebook": "Jupyter"}
_START = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}


@pytest.fixture(autouse=True)
def _no_launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "NODE_RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "RANK",
        "TORCHELASTIC_RUN_ID",
    ):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("base", list(_START))
@pytest.mark.parametrize("suffix", ["", "_find_unused_parameters_true", "_find_unused_parameters_false"])
def test_registered_names(base: str, suffix: str) -> None:
    entry = StrategyRegistry.entry(base + suffix)
    assert entry.target_path == "phalanx_strategy_ddp.strategy:DDPStrategy"
    assert entry.requires == ("torch>=2.1",)
    assert entry.source.distribution == "phalanx-strategy-ddp"
    assert _LAUNCH_WORDS[base] in entry.description
    expected: dict[str, object] = {"start_method": _START[base]}
    if suffix:
        expected["find_unused_parameters"] = suffix.endswith("true")
    assert entry.init_params == expected
    strategy = StrategyRegistry.get(base + suffix)
    assert isinstance(strategy, DDPStrategy)
    assert strategy.start_method == _START[base]
    assert strategy.ddp_kwargs == {k: v for k, v in expected.items() if k != "start_method"}


def test_import_from_phalanx_strategies() -> None:
    from phalanx_strategy_ddp.strategy import DDPStrategy as Direct

    assert DDPStrategy is Direct
    assert issubclass(DDPStrategy, ParallelStrategy)


def test_registry_example_with_custom_checkpoint_io() -> None:
    custom = TorchCheckpointIO()
    StrategyRegistry.register(
        "ddp_custom_checkpoint_io", DDPStrategy, description="DDP with custom IO", checkpoint_io=custom
    )
    try:
        assert StrategyRegistry.get("ddp_custom_checkpoint_io").checkpoint_io is custom
    finally:
        StrategyRegistry.remove("ddp_custom_checkpoint_io")


@pytest.mark.parametrize(
    ("accelerator", "devices", "nodes", "interactive", "expected"),
    [
        ("cpu", 2, 1, False, "ddp"),
        ("cuda", 1, 2, False, "ddp"),
        ("cuda", 4, 1, True, "ddp_notebook"),
        ("cpu", 1, 1, False, None),
        ("xla", 8, 1, False, None),  # left to the xla plugin
    ],
)
def test_auto_choice(accelerator: str, devices: int, nodes: int, interactive: bool, expected: str | None) -> None:
    assert _plugin.phalanx_select_strategy(accelerator, devices, nodes, interactive) == expected


def test_plugin_module_imports_no_torch() -> None:
    code = "import sys, phalanx_strategy_ddp._plugin, phalanx_strategy_ddp; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_unknown_backend_names_the_choices_and_the_closest() -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"'glo' is not a torch.distributed backend; valid choices: .*gloo.*nccl.*Did you mean 'gloo'",
    ):
        DDPStrategy(process_group_backend="glo")
    assert DDPStrategy(process_group_backend="GLOO").process_group_backend == "gloo"
    assert DDPStrategy(process_group_backend="cpu:gloo,cuda:nccl").process_group_backend == "cpu:gloo,cuda:nccl"


def test_default_backend_follows_the_device() -> None:
    assert DDPStrategy(parallel_devices=_CPU2).process_group_backend == "gloo"
    assert DDPStrategy(parallel_devices=[torch.device("cuda", 0)]).process_group_backend == "nccl"


def test_nccl_on_cpu_is_refused_before_rendezvous() -> None:
    with pytest.raises(MisconfigurationError, match=r"needs CUDA devices.*process_group_backend='gloo'"):
        validate_backend_for_device("nccl", torch.device("cpu"))
    strategy = DDPStrategy(parallel_devices=_CPU2, process_group_backend="nccl")
    with pytest.raises(MisconfigurationError):  # nccl is missing from CPU builds, or refused for CPU
        strategy.setup_environment()
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"start_method": "thread"}, r"start_method='thread'.*popen, spawn, fork, forkserver"),
        ({"timeout": 30}, r"timeout=30.*timedelta"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(MisconfigurationError, match=pattern):
        DDPStrategy(**kwargs)  # type: ignore[arg-type]


def test_root_device_without_devices_explains_the_fix() -> None:
    with pytest.raises(MisconfigurationError, match=r"no parallel_devices.*devices=N"):
        _ = DDPStrategy().root_device


def test_launcher_follows_the_start_method() -> None:
    popen = DDPStrategy(parallel_devices=_CPU2, cluster_environment=LocalEnvironment())
    assert isinstance(popen.launcher, SubprocessScriptLauncher) and popen.launcher.num_processes == 2
    for method, interactive in (("spawn", False), ("fork", True)):
        launcher = DDPStrategy(
            parallel_devices=_CPU2, cluster_environment=LocalEnvironment(), start_method=method
        ).launcher
        assert isinstance(launcher, MultiProcessingLauncher)
        assert launcher.is_interactive_compatible is interactive
    strategy = DDPStrategy(parallel_devices=_CPU2, cluster_environment=LocalEnvironment())
    first = strategy.launcher
    strategy.num_nodes = 2  # reconfiguring rebuilds the launcher for the new shape
    assert strategy.launcher is not first and strategy.launcher.num_nodes == 2


def test_under_torchrun_nothing_is_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    torchrun = {"RANK": "1", "GROUP_RANK": "0", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}
    for key, value in {**torchrun, "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(key, value)
    strategy = DDPStrategy(parallel_devices=_CPU2, start_method="spawn")
    assert isinstance(strategy.cluster_environment, TorchElasticEnvironment)  # detected
    assert isinstance(strategy.launcher, SubprocessScriptLauncher)  # runs the stage, starts nothing
    assert (strategy.global_rank, strategy.world_size, strategy.local_rank) == (1, 2, 1)
    # 2 devices x 2 nodes != the 2 processes torchrun started: refused when the Trainer configures it
    with pytest.raises(MisconfigurationError, match=r"asks for 4 processes, but torchrun started WORLD_SIZE=2"):
        Trainer(strategy=DDPStrategy(start_method="spawn"), accelerator="cpu", devices=2, num_nodes=2, logger=False)


def test_strategy_pickles_for_spawn() -> None:
    strategy = DDPStrategy(parallel_devices=_CPU2, cluster_environment=LocalEnvironment(), start_method="spawn")
    _ = strategy.launcher
    copy = pickle.loads(pickle.dumps(strategy))
    assert copy.start_method == "spawn" and copy.num_processes == 2


def test_collectives_are_identities_before_the_process_group() -> None:
    strategy = DDPStrategy(parallel_devices=_CPU2, cluster_environment=LocalEnvironment())
    tensor = torch.tensor([1.0, 2.0])
    assert strategy.reduce(tensor) is tensor
    assert strategy.all_gather(tensor) is tensor
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    assert strategy.reduce_boolean_decision(True)
    assert not strategy.reduce_boolean_decision(False)
    # barrier and block_backward_sync are checked where they act: inside real 2-rank runs
    # (test_ddp_features.py::test_collectives).


def test_reduce_op_parsing() -> None:
    assert resolve_reduce_op("mean") == (dist.ReduceOp.SUM, True)
    assert resolve_reduce_op("AVG") == (dist.ReduceOp.SUM, True)
    assert resolve_reduce_op("max") == (dist.ReduceOp.MAX, False)
    assert resolve_reduce_op(dist.ReduceOp.MIN) == (dist.ReduceOp.MIN, False)
    with pytest.raises(MisconfigurationError, match=r"reduce_op='median'.*mean, avg, sum"):
        resolve_reduce_op("median")


def _rank(strategy: DDPStrategy, rank: int) -> DDPStrategy:
    strategy.cluster_environment.set_global_rank(rank)
    return strategy


def test_inject_distributed_sampler_keeps_the_loader_settings() -> None:
    dataset = TensorDataset(torch.arange(10.0))

    def collate(batch: list[tuple[torch.Tensor]]) -> torch.Tensor:
        return torch.stack([item[0] for item in batch])

    strategy = _rank(DDPStrategy(parallel_devices=_CPU2, cluster_environment=LocalEnvironment()), 1)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 1}
    loader = DataLoader(dataset, batch_size=2, shuffle=True, drop_last=True, collate_fn=collate)
    sharded = prepare_loader(loader, strategy, use_distributed_sampler=True, shuffle=None)
    sampler = sharded.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed) == (2, 1, True, 0)
    assert (sharded.batch_size, sharded.drop_last, sharded.collate_fn) == (2, True, collate)
    expected: list[int] = list(DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=0))
    assert torch.cat(list(sharded)).tolist() == [float(i) for i in expected[:4]]
    assert not prepare_loader(DataLoader(dataset), strategy, use_distributed_sampler=True, shuffle=None).sampler.shuffle
    assert prepare_loader(sharded, strategy, use_distributed_sampler=True, shuffle=None) is sharded  # already sharded


def test_inject_distributed_sampler_custom_batch_sampler_and_iterables() -> None:
    dataset = TensorDataset(torch.arange(8.0))

    class MyBatchSampler(BatchSampler):
        pass

    strategy = DDPStrategy(parallel_devices=_CPU2, cluster_environment=LocalEnvironment())
    custom = DataLoader(
        dataset, batch_sampler=MyBatchSampler(SequentialSampler(dataset), batch_size=2, drop_last=False)
    )
    sharded = prepare_loader(custom, strategy, use_distributed_sampler=True, shuffle=False)
    assert type(sharded.batch_sampler) is MyBatchSampler
    assert isinstance(sharded.batch_sampler.sampler, DistributedSampler)
    assert len(list(sharded)) == 2

    class Stream(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from range(4)

    stream = DataLoader(Stream())
    assert prepare_loader(stream, strategy, use_distributed_sampler=True, shuffle=None) is stream


def test_timeout_is_kept_for_the_process_group() -> None:
    assert DDPStrategy(timeout=timedelta(seconds=5)).timeout == timedelta(seconds=5)
