"""SingleDeviceStrategy driven by hand, exactly as the Trainer drives it, against plain PyTorch."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from phalanx.accelerators import CPUAccelerator, CUDAAccelerator
from phalanx.checkpoint_io import AsyncCheckpointIO, TorchCheckpointIO
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.precision import DoublePrecision, MixedPrecision, Precision
from phalanx.strategies.single_device import SingleDeviceStrategy
from phalanx.strategies.strategy import Strategy

CLIP = 0.05


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)) for _ in range(5)]


class MinimalTrainer:
    """The two things a strategy asks of a Trainer: are we fitting, and the pre-step slot."""

    def __init__(self, strategy: Strategy, *, training: bool = True) -> None:
        self.strategy = strategy
        self.training = training
        self.pre_step_calls = 0
        # The pre-step slot is the stage Run's ``before_optimizer_step``, handed to the precision.
        strategy.precision_plugin.connect_before_optimizer_step(self.before_optimizer_step)

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.pre_step_calls += 1
        self.strategy.precision_plugin.clip_gradients(optimizer, CLIP, "norm")


class TinyModule(nn.Module):
    """Module-like: steps, configure_optimizers and a trainer attribute, as phalanx's Module has."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        self.trainer: Any = None
        self.step_dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self(x)
        self.step_dtypes.append(out.dtype)
        return nn.functional.mse_loss(out.float(), y.float())

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.training_step(batch, batch_idx)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.training_step(batch, batch_idx)

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}


def _fit(strategy: SingleDeviceStrategy, module: TinyModule | None = None) -> tuple[TinyModule, list[float]]:
    module = module or TinyModule()
    trainer = MinimalTrainer(strategy)
    module.trainer = trainer
    strategy.connect(module)
    strategy.setup_environment()
    strategy.setup(trainer)
    [optimizer] = strategy.optimizers
    losses = []
    for batch_idx, batch in enumerate(_data()):
        batch = strategy.batch_to_device(batch)

        def closure(batch: Any = batch, batch_idx: int = batch_idx) -> torch.Tensor:
            optimizer.zero_grad()
            loss = strategy.training_step(batch, batch_idx)
            return strategy.backward(loss, optimizer)

        losses.append(strategy.optimizer_step(optimizer, closure).item())
    assert trainer.pre_step_calls == len(_data())
    return module, losses


def _fit_by_hand(dtype: torch.dtype = torch.float32, autocast: Any = nullcontext) -> tuple[nn.Module, list[float]]:
    module = TinyModule().to(dtype)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in _data():
        x, y = x.to(dtype), y.to(dtype)

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            optimizer.zero_grad()
            with autocast():
                loss = nn.functional.mse_loss(module(x).float(), y.float())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), CLIP)
            return loss

        losses.append(optimizer.step(closure).item())
    return module, losses


def _assert_same_weights(left: nn.Module, right: nn.Module) -> None:
    for (name, a), b in zip(left.state_dict().items(), right.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("precision", "dtype"), [(Precision(), torch.float32), (DoublePrecision(), torch.float64)])
def test_training_matches_plain_pytorch_bit_for_bit(precision: Precision, dtype: torch.dtype) -> None:
    strategy = SingleDeviceStrategy("cpu", precision_plugin=precision)
    module, losses = _fit(strategy)
    reference, reference_losses = _fit_by_hand(dtype)
    _assert_same_weights(module, reference)
    assert losses == reference_losses
    assert isinstance(strategy.accelerator, CPUAccelerator)  # inferred from the device
    assert strategy.lr_scheduler_configs[0].interval == "epoch"
    assert module.step_dtypes == [dtype] * len(_data())


def test_bf16_mixed_runs_steps_under_autocast() -> None:
    strategy = SingleDeviceStrategy("cpu", precision_plugin=MixedPrecision("bf16-mixed"))
    module, losses = _fit(strategy)
    assert set(module.step_dtypes) == {torch.bfloat16}
    assert next(module.parameters()).dtype == torch.float32
    reference, reference_losses = _fit_by_hand(autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    _assert_same_weights(module, reference)
    assert losses == reference_losses


class CountingWrapper(nn.Module):
    """A custom wrapper (like DDP): its forward must run for every step."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.module(*args, **kwargs)


class WrappingStrategy(SingleDeviceStrategy):
    """Wraps the model after setup, the way a parallel strategy does."""

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        self.model = CountingWrapper(self.module)  # type: ignore[arg-type]


def test_steps_run_through_the_wrapper_and_forward_is_restored() -> None:
    strategy = WrappingStrategy("cpu")
    module, losses = _fit(strategy)
    wrapper = strategy.model
    assert isinstance(wrapper, CountingWrapper) and wrapper.calls == len(_data())
    reference, reference_losses = _fit_by_hand()
    _assert_same_weights(module, reference)
    assert losses == reference_losses
    assert "forward" not in module.__dict__
    batch = _data()[0]
    assert torch.equal(strategy.predict_step(batch, 0), module(batch[0]))
    strategy.validation_step(batch, 0)
    strategy.test_step(batch, 0)
    assert wrapper.calls == len(_data()) + 3
    assert strategy.module is module and strategy.lightning_module is module


def test_forward_is_restored_when_the_step_raises() -> None:
    strategy = WrappingStrategy("cpu")
    module = TinyModule()
    strategy.connect(module)
    strategy.setup(MinimalTrainer(strategy))
    with pytest.raises(ValueError, match="not enough values"):
        strategy.training_step((torch.ones(1, 4),), 0)
    assert "forward" not in module.__dict__
    assert module(torch.ones(1, 4)).shape == (1, 2)


def test_evaluation_setup_creates_no_optimizers() -> None:
    strategy = SingleDeviceStrategy()
    strategy.connect(TinyModule())
    strategy.setup(MinimalTrainer(strategy, training=False))
    assert strategy.optimizers == [] and strategy.lr_scheduler_configs == []


class HookedModule(TinyModule):
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return {"x": batch[0], "y": batch[1], "idx": dataloader_idx}

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        batch["after"] = True
        return batch


def test_batch_to_device_calls_module_hooks_and_casts_for_the_precision() -> None:
    strategy = SingleDeviceStrategy(precision_plugin=DoublePrecision())
    strategy.connect(HookedModule())
    batch = strategy.batch_to_device((torch.ones(2), torch.tensor([1])), dataloader_idx=2)
    assert batch["idx"] == 2 and batch["after"] is True
    assert batch["x"].dtype == torch.float64 and batch["y"].dtype == torch.int64
    plain = SingleDeviceStrategy().batch_to_device([torch.ones(1)], device=torch.device("meta"))
    assert plain[0].device.type == "meta"


def test_collectives_are_identities() -> None:
    strategy = SingleDeviceStrategy()
    tensor = torch.arange(3.0)
    assert strategy.reduce(tensor) is tensor
    assert strategy.reduce(tensor, reduce_op="sum") is tensor
    assert strategy.all_gather(tensor) is tensor
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    strategy.barrier("name")
    assert strategy.reduce_boolean_decision(True) is True
    assert strategy.reduce_boolean_decision(False, all=False) is False
    assert (strategy.global_rank, strategy.local_rank, strategy.node_rank, strategy.world_size) == (0, 0, 0, 1)
    assert strategy.is_global_zero and strategy.launcher is None


def test_defaults_and_properties() -> None:
    strategy = SingleDeviceStrategy(torch.device("cpu"))
    assert isinstance(strategy.checkpoint_io, TorchCheckpointIO)
    assert type(strategy.precision_plugin) is Precision
    assert strategy.strategy_name == "single_device"
    assert not strategy.handles_gradient_accumulation and not strategy.restore_checkpoint_after_setup
    assert strategy.restore_optimizer and strategy.lightning_restore_optimizer
    assert strategy.process_dataloader([1, 2]) == [1, 2]
    with strategy.block_backward_sync(), strategy.model_sharded_context():
        pass
    with pytest.raises(TypeError):
        Strategy()  # type: ignore[abstract]
    with pytest.raises(MisconfigurationError, match="'gpu0'"):
        SingleDeviceStrategy("gpu0")
    with pytest.raises(MisconfigurationError, match="connect"):
        SingleDeviceStrategy().training_step()


def test_accelerator_must_match_the_device() -> None:
    strategy = SingleDeviceStrategy("cpu", accelerator=CUDAAccelerator())
    with pytest.raises(MisconfigurationError, match="only drives 'cuda'"):
        strategy.setup_environment()


def test_tensor_init_context_sets_dtype_and_empty_init_skips_initialisation() -> None:
    strategy = SingleDeviceStrategy(precision_plugin=DoublePrecision())
    with strategy.tensor_init_context():
        assert nn.Linear(2, 2).weight.dtype == torch.float64
    torch.manual_seed(0)
    with strategy.tensor_init_context(empty_init=True):
        layer = nn.Linear(64, 64)
    after_empty = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(after_empty, torch.rand(1))  # nn.init drew no random numbers
    assert layer.weight.shape == (64, 64)
    assert torch.get_default_dtype() == torch.float32


def test_checkpoint_round_trip_through_the_strategy(tmp_path: Path) -> None:
    strategy = SingleDeviceStrategy()
    module, _ = _fit(strategy)
    [optimizer] = strategy.optimizers
    checkpoint = {"state_dict": strategy.module_state_dict(), "optimizer_states": [strategy.optimizer_state(optimizer)]}
    path = tmp_path / "ckpt" / "last.ckpt"
    strategy.save_checkpoint(checkpoint, path)
    loaded = strategy.load_checkpoint(path)

    fresh = SingleDeviceStrategy()
    fresh.connect(TinyModule())
    fresh.setup(MinimalTrainer(fresh))
    fresh.load_model_state_dict(loaded)
    fresh.load_optimizer_state_dict(loaded)
    _assert_same_weights(fresh.module, module)  # type: ignore[arg-type]
    buffers = fresh.optimizers[0].state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(buffers, optimizer.state_dict()["state"][0]["momentum_buffer"])
    assert strategy.lightning_module_state_dict().keys() == module.state_dict().keys()

    with pytest.raises(CheckpointError, match="'state_dict'"):
        fresh.load_model_state_dict({"epoch": 1})
    with pytest.raises(CheckpointError, match="holds 2 optimizer state"):
        fresh.load_optimizer_state_dict({"optimizer_states": [{}, {}]})
    with pytest.raises(CheckpointError, match="'optimizer_states'"):
        fresh.load_optimizer_state_dict({"state_dict": {}})
    strategy.remove_checkpoint(path)
    assert not path.exists()


def test_teardown_surfaces_a_failed_background_save(tmp_path: Path) -> None:
    class Unpicklable:
        def __reduce__(self) -> Any:
            msg = "cannot pickle"
            raise RuntimeError(msg)

    strategy = SingleDeviceStrategy(checkpoint_io=AsyncCheckpointIO())
    strategy.connect(TinyModule())
    strategy.save_checkpoint({"bad": Unpicklable()}, tmp_path / "x.ckpt")
    with pytest.raises(RuntimeError, match="cannot pickle"):
        strategy.teardown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_16_mixed_trains_on_the_gpu_and_teardown_returns_to_cpu() -> None:
    strategy = SingleDeviceStrategy("cuda:0", precision_plugin=MixedPrecision("16-mixed"))
    module, losses = _fit(strategy)
    assert isinstance(strategy.accelerator, CUDAAccelerator)
    assert next(module.parameters()).device == torch.device("cuda", 0)
    assert set(module.step_dtypes) == {torch.float16}
    assert all(torch.isfinite(torch.tensor(losses)))
    assert strategy.precision_plugin.state_dict()["scale"] > 0
    strategy.teardown()
    assert next(module.parameters()).device.type == "cpu"


class _KeepsModuleOnTeardown(SingleDeviceStrategy):
    """A strategy that leaves the Module where it is at teardown (as sharded strategies do)."""

    @property
    def offload_module_on_teardown(self) -> bool:
        return False


def test_teardown_on_cpu_leaves_the_module_in_place() -> None:
    assert SingleDeviceStrategy().offload_module_on_teardown is True
    for strategy in (SingleDeviceStrategy(), _KeepsModuleOnTeardown()):
        module, _ = _fit(strategy)
        weights = [p.detach().clone() for p in module.parameters()]
        strategy.teardown()
        assert all(p.device.type == "cpu" for p in module.parameters())
        assert all(torch.equal(a, b) for a, b in zip(weights, module.parameters()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("offload", [True, False])
def test_teardown_moves_the_module_to_cpu_only_when_asked(offload: bool) -> None:
    """On a real accelerator: teardown returns the Module to CPU unless the strategy opts out."""
    strategy = SingleDeviceStrategy("cuda:0") if offload else _KeepsModuleOnTeardown("cuda:0")
    module, _ = _fit(strategy)
    assert next(module.parameters()).device.type == "cuda"
    strategy.teardown()
    assert next(module.parameters()).device.type == ("cpu" if offload else "cuda")
