"""Lightning's module paths under the rename rule: each resolves to phalanx's own object, and behaves.

``lightning.pytorch.X.Y`` -> ``phalanx.X.Y``: the thin re-export modules hand back phalanx's
classes (identity, not copies), the classes phalanx implements for these paths do what
Lightning's do, ``import phalanx.plugins`` stays torch-free, and what phalanx raises for a
misconfiguration is Lightning's ``MisconfigurationException``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from trainer_helpers import quiet, run_python

import phalanx
from phalanx.trainer.trainer import Trainer
from phalanx.utilities.combined_loader import CombinedLoader
from phalanx.utilities.exceptions import MisconfigurationException, SIGTERMException

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------------------- identity

#: (Lightning's path renamed, name there, where phalanx keeps the object).
SAME_OBJECT = [
    ("phalanx.core", "Module", "phalanx:Module"),
    ("phalanx.core", "DataModule", "phalanx:DataModule"),
    ("phalanx.core.module", "Module", "phalanx:Module"),
    ("phalanx.core.datamodule", "DataModule", "phalanx:DataModule"),
    ("phalanx.core.mixins", "HyperparametersMixin", "phalanx.hparams:HyperparametersMixin"),
    ("phalanx.core.mixins.hparams_mixin", "HyperparametersMixin", "phalanx.hparams:HyperparametersMixin"),
    ("phalanx.core.optimizer", "LightningOptimizer", "phalanx.trainer.step:StepOptimizer"),
    ("phalanx.trainer", "Trainer", "phalanx:Trainer"),
    ("phalanx.trainer", "seed_everything", "phalanx:seed_everything"),
    ("phalanx.trainer.states", "TrainerFn", "phalanx.trainer_view:TrainerFn"),
    ("phalanx.trainer.states", "RunningStage", "phalanx.trainer_view:RunningStage"),
    ("phalanx.trainer.states", "TrainerState", "phalanx.trainer_view:TrainerState"),
    ("phalanx.plugins", "MixedPrecision", "phalanx.precision:MixedPrecision"),
    ("phalanx.plugins", "Precision", "phalanx.precision:Precision"),
    ("phalanx.plugins", "TorchCheckpointIO", "phalanx.checkpoint_io:TorchCheckpointIO"),
    ("phalanx.plugins", "AsyncCheckpointIO", "phalanx.checkpoint_io:AsyncCheckpointIO"),
    ("phalanx.plugins.precision", "HalfPrecision", "phalanx.precision:HalfPrecision"),
    ("phalanx.plugins.precision.amp", "MixedPrecision", "phalanx.precision:MixedPrecision"),
    ("phalanx.plugins.precision.double", "DoublePrecision", "phalanx.precision:DoublePrecision"),
    ("phalanx.plugins.io", "CheckpointIO", "phalanx.checkpoint_io:CheckpointIO"),
    ("phalanx.plugins.io.async_plugin", "AsyncCheckpointIO", "phalanx.checkpoint_io:AsyncCheckpointIO"),
    ("phalanx.plugins.io.torch_plugin", "TorchCheckpointIO", "phalanx.checkpoint_io:TorchCheckpointIO"),
    ("phalanx.plugins.environments", "SLURMEnvironment", "phalanx.environments:SLURMEnvironment"),
    ("phalanx.plugins.environments", "TorchElasticEnvironment", "phalanx.environments:TorchElasticEnvironment"),
    ("phalanx.plugins.environments", "LightningEnvironment", "phalanx.environments:LocalEnvironment"),
    ("phalanx.plugins.environments", "ClusterEnvironment", "phalanx.environments:ClusterEnvironment"),
    ("phalanx.callbacks.progress", "TQDMProgressBar", "phalanx.callbacks:TQDMProgressBar"),
    ("phalanx.callbacks.progress", "RichProgressBar", "phalanx.callbacks:RichProgressBar"),
    ("phalanx.callbacks.progress.progress_bar", "ProgressBar", "phalanx.callbacks:ProgressBar"),
    ("phalanx.callbacks.progress.tqdm_progress", "TQDMProgressBar", "phalanx.callbacks:TQDMProgressBar"),
    ("phalanx.callbacks.progress.rich_progress", "RichProgressBar", "phalanx.callbacks:RichProgressBar"),
    ("phalanx.callbacks.spike", "SpikeDetection", "phalanx.callbacks:SpikeDetection"),
    ("phalanx.utilities", "CombinedLoader", "phalanx.utilities.combined_loader:CombinedLoader"),
    ("phalanx.utilities.model_summary", "ModelSummary", "phalanx.callbacks.model_summary:Summary"),
    ("phalanx.utilities.parsing", "AttributeDict", "phalanx.hparams:AttributeDict"),
    ("phalanx.profilers.base", "PassThroughProfiler", "phalanx.profilers:PassThroughProfiler"),
]
#: Lightning's strategy module paths whose class a plugin package provides: (path, name, distribution).
FROM_PLUGINS = [
    ("phalanx.strategies.ddp", "DDPStrategy", "phalanx-strategy-ddp"),
    ("phalanx.strategies.fsdp", "FSDPStrategy", "phalanx-strategy-fsdp"),
    ("phalanx.strategies.model_parallel", "ModelParallelStrategy", "phalanx-strategy-model-parallel"),
]


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("path", "name", "home"), SAME_OBJECT, ids=[f"{p}.{n}" for p, n, _ in SAME_OBJECT])
def test_lightning_path_gives_phalanx_object(path: str, name: str, home: str) -> None:
    assert getattr(importlib.import_module(path), name) is _resolve(home)


@pytest.mark.parametrize(("path", "name", "distribution"), FROM_PLUGINS, ids=[f"{p}.{n}" for p, n, _ in FROM_PLUGINS])
def test_lightning_strategy_path_gives_the_plugin_class_or_says_what_to_install(
    path: str, name: str, distribution: str
) -> None:
    """With the plugin installed the path gives its class; without it, the import error names the package."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
    except PackageNotFoundError:
        with pytest.raises(ImportError, match=distribution):
            getattr(importlib.import_module(path), name)
    else:
        from phalanx import strategies

        try:
            found = getattr(importlib.import_module(path), name)
        except ImportError as error:  # installed but blocked: the error names the switch that blocks it
            assert "PHALANX_DISABLE_PLUGINS" in str(error), error
        else:
            assert found is getattr(strategies, name)


def test_hook_mixins_are_what_module_is_made_of() -> None:
    from phalanx.core.hooks import CheckpointHooks, DataHooks, ModelHooks

    assert issubclass(phalanx.Module, ModelHooks)
    assert issubclass(phalanx.Module, DataHooks)
    assert issubclass(phalanx.Module, CheckpointHooks)
    assert {"on_fit_start", "on_before_backward", "configure_model"} <= set(vars(ModelHooks))
    assert {"prepare_data", "setup", "train_dataloader"} <= set(vars(DataHooks))
    assert hasattr(DataHooks, "transfer_batch_to_device")
    assert set(vars(CheckpointHooks)) >= {"on_save_checkpoint", "on_load_checkpoint"}


def test_plugin_class_names_say_which_package_to_install() -> None:
    pytest.importorskip("phalanx_strategy_ddp")
    if importlib.util.find_spec("phalanx_strategy_xla") is not None:
        pytest.skip("phalanx-strategy-xla is installed here")
    for module, name in [
        ("phalanx.plugins", "XLAPrecision"),
        ("phalanx.plugins.io", "XLACheckpointIO"),
        ("phalanx.accelerators", "XLAAccelerator"),
        ("phalanx.strategies.xla", "XLAStrategy"),
    ]:
        with pytest.raises(ImportError, match="phalanx-strategy-xla"):
            getattr(importlib.import_module(module), name)


# ------------------------------------------------------------------------------------ torch-free paths


def test_plugins_namespace_and_light_paths_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import phalanx.plugins, phalanx.plugins.environments, phalanx.plugins.precision, phalanx.plugins.io\n"
        "import phalanx.core, phalanx.trainer.states, phalanx.utilities.enums, phalanx.utilities.warnings\n"
        "from phalanx.plugins.environments import SLURMEnvironment, LightningEnvironment\n"
        "from phalanx.trainer.states import TrainerFn, TrainerStatus\n"
        "import phalanx as pl\n"
        "pl.plugins.environments, pl.core, pl.trainer.states, pl.utilities.enums\n"
        "heavy = sorted(m for m in ('torch', 'pluggy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    run_python(code)


def test_subpackages_are_attributes_of_the_package() -> None:
    import phalanx.callbacks
    import phalanx.plugins.precision

    assert phalanx.callbacks.EarlyStopping is _resolve("phalanx.callbacks.early_stopping:EarlyStopping")
    assert phalanx.plugins.precision.HalfPrecision is _resolve("phalanx.precision:HalfPrecision")
    assert phalanx.loops.__name__ == "phalanx.loops"
    with pytest.raises(AttributeError, match="no_such_subpackage"):
        phalanx.no_such_subpackage  # type: ignore[attr-defined]  # noqa: B018


# ------------------------------------------------------------------------------------------ exceptions


def test_misconfiguration_raises_lightnings_exception_type() -> None:
    with pytest.raises(MisconfigurationException):
        Trainer(max_epochs="three", **quiet())  # type: ignore[arg-type]
    with pytest.raises(MisconfigurationException, match="accelerator"):
        Trainer(accelerator="no_such_accelerator", **quiet())
    with pytest.raises(MisconfigurationException, match="strategy"):
        Trainer(strategy=3, **quiet())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_size_cycle"):  # Lightning raises ValueError here too
        CombinedLoader([], mode="no_such_mode")  # type: ignore[arg-type]


def test_sigterm_exception_is_a_system_exit() -> None:
    assert issubclass(SIGTERMException, SystemExit)
    assert not issubclass(SIGTERMException, Exception)  # `except Exception` in user code does not swallow it


# -------------------------------------------------------------------------------------- trainer state


class _Tiny(phalanx.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.seen_states: list[tuple[Any, Any, Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        state = self.trainer.state
        self.seen_states.append((state.fn, state.stage, state.status))
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_state_holds_lightnings_enums() -> None:
    from phalanx.trainer.states import RunningStage, TrainerFn, TrainerStatus

    trainer = Trainer(max_epochs=1, accelerator="cpu", **quiet())
    assert trainer.state.status is TrainerStatus.INITIALIZING and not trainer.state.stopped
    model = _Tiny()
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
    assert model.seen_states[0] == (TrainerFn.FITTING, RunningStage.TRAINING, TrainerStatus.RUNNING)
    assert model.seen_states[0] == ("fit", "TRAIN", "running")  # str enums, compared without case
    assert trainer.state.status is TrainerStatus.FINISHED
    assert trainer.state.finished and trainer.state.stopped
    assert RunningStage.SANITY_CHECKING.dataloader_prefix == "val" and RunningStage.SANITY_CHECKING.evaluating
    assert TrainerFn.from_str("FITTING") is TrainerFn.FITTING
    assert TrainerFn.from_str("validate", source="value") is TrainerFn.VALIDATING
    assert {TrainerFn.FITTING: 1}["fit"] == 1


# -------------------------------------------------------------------------------------- CombinedLoader


def _combined(mode: str, **limits: Any) -> tuple[int, list[tuple[Any, int, int]]]:
    loaders = {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}
    combined = CombinedLoader(loaders, mode)  # type: ignore[arg-type]
    if limits:
        combined.limits = limits["limits"]
    iter(combined)
    length = len(combined)
    plain = [
        (
            {k: v.tolist() if v is not None else None for k, v in batch.items()}
            if isinstance(batch, dict)
            else batch.tolist(),
            batch_idx,
            dataloader_idx,
        )
        for batch, batch_idx, dataloader_idx in combined
    ]
    return length, plain


def test_combined_loader_modes() -> None:
    a0, a1 = [0, 1, 2, 3], [4, 5]
    b0, b1, b2 = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]
    assert _combined("min_size") == (2, [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0)])
    assert _combined("max_size_cycle") == (
        3,
        [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0), ({"a": a0, "b": b2}, 2, 0)],
    )
    assert _combined("max_size") == (
        3,
        [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0), ({"a": None, "b": b2}, 2, 0)],
    )
    assert _combined("sequential") == (5, [(a0, 0, 0), (a1, 1, 0), (b0, 0, 1), (b1, 1, 1), (b2, 2, 1)])
    assert _combined("sequential", limits=1) == (2, [(a0, 0, 0), (b0, 0, 1)])
    assert _combined("max_size", limits=[1, 2])[0] == 2


def test_combined_loader_needs_iter_before_len_and_keeps_structure() -> None:
    combined = CombinedLoader([DataLoader(range(3)), [DataLoader(range(2))]], "max_size_cycle")
    with pytest.raises(RuntimeError, match="iter"):
        len(combined)
    assert [batch for batch, _, _ in combined] == [[torch.tensor([0]), [torch.tensor([0])]]] + [
        [torch.tensor([i]), [torch.tensor([i % 2])]] for i in (1, 2)
    ]
    assert len(combined.flattened) == 2
    with pytest.raises(ValueError, match="one for each"):
        combined.flattened = [DataLoader(range(3))]


class _TwoLoaders(phalanx.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.train_batches: list[tuple[int, dict[str, int | None]]] = []
        self.val_calls: list[tuple[int, int]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.train_batches.append((batch_idx, {k: None if v is None else len(v[0]) for k, v in batch.items()}))
        return self.layer(batch["a"][0]).sum()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.val_calls.append((batch_idx, dataloader_idx))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_combines_training_loaders_and_runs_sequential_evaluation() -> None:
    a = DataLoader(TensorDataset(torch.randn(6, 2)), batch_size=2)
    b = DataLoader(TensorDataset(torch.randn(3, 2)), batch_size=2)
    model = _TwoLoaders()
    trainer = Trainer(max_epochs=1, accelerator="cpu", num_sanity_val_steps=0, **quiet())
    trainer.fit(model, train_dataloaders={"a": a, "b": b}, val_dataloaders={"x": a, "y": b})
    # max_size_cycle: three batches (a has 3), b restarts after its 2
    assert model.train_batches == [(0, {"a": 2, "b": 2}), (1, {"a": 2, "b": 1}), (2, {"a": 2, "b": 2})]
    assert model.val_calls == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]

    model = _TwoLoaders()
    trainer = Trainer(max_epochs=1, accelerator="cpu", num_sanity_val_steps=0, **quiet())
    trainer.fit(
        model,
        train_dataloaders=CombinedLoader({"a": a, "b": b}, "max_size"),
        val_dataloaders=CombinedLoader([a, b], "sequential"),
    )
    assert model.train_batches[-1] == (2, {"a": 2, "b": None})
    assert model.val_calls == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]


# ---------------------------------------------------------------------------------------- layer sync


def test_torch_sync_batchnorm_round_trip_keeps_weights_and_statistics() -> None:
    from phalanx.plugins import TorchSyncBatchNorm

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.BatchNorm1d(4)))
    model(torch.randn(8, 3))  # running statistics move away from their defaults
    before = {k: v.clone() for k, v in model.state_dict().items()}
    synced = TorchSyncBatchNorm().apply(model)
    assert isinstance(synced[1], nn.SyncBatchNorm) and isinstance(synced[2][0], nn.SyncBatchNorm)
    reverted = TorchSyncBatchNorm().revert(synced)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in reverted.modules())
    assert reverted.state_dict().keys() == before.keys()
    for key, value in reverted.state_dict().items():
        torch.testing.assert_close(value, before[key])
    reverted.eval()
    x = torch.randn(5, 3)
    reference = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.BatchNorm1d(4)))
    reference.load_state_dict(before)
    torch.testing.assert_close(reverted(x), reference.eval()(x))


def test_layer_sync_plugin_reaches_the_strategy() -> None:
    pytest.importorskip("phalanx_strategy_ddp")
    from phalanx.plugins import LayerSync, TorchSyncBatchNorm

    class Marking(LayerSync):
        def apply(self, model: nn.Module) -> nn.Module:
            model.marked = True  # type: ignore[assignment]
            return model

        def revert(self, model: nn.Module) -> nn.Module:
            return model

    sync = Marking()
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=1, plugins=[sync], **quiet())
    assert trainer.strategy.layer_sync is sync and trainer.strategy.sync_batchnorm
    assert trainer.strategy.convert_sync_batchnorm(nn.Linear(1, 1)).marked
    with pytest.raises(MisconfigurationException, match="GPU"):  # torch's SyncBatchNorm needs GPUs
        Trainer(strategy="ddp", accelerator="cpu", devices=1, plugins=[TorchSyncBatchNorm()], **quiet())


# ---------------------------------------------------------------------------------- demos and saving


def test_boring_model_trains_like_a_plain_loop() -> None:
    from phalanx.demos.boring_classes import BoringModel, RandomDataset

    torch.manual_seed(0)
    model = BoringModel()
    data = RandomDataset(32, 64)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(max_epochs=1, accelerator="cpu", limit_val_batches=0, num_sanity_val_steps=0, **quiet())
    trainer.fit(model, train_dataloaders=DataLoader(data))

    reference = nn.Linear(32, 2)
    reference.load_state_dict({k.removeprefix("layer."): v for k, v in initial.items()})
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)  # StepLR steps after the epoch only
    for x in DataLoader(data):
        optimizer.zero_grad()
        out = reference(x)
        torch.nn.functional.mse_loss(out, torch.ones_like(out)).backward()
        optimizer.step()
    torch.testing.assert_close(model.layer.weight, reference.weight)
    torch.testing.assert_close(model.layer.bias, reference.bias)


def test_hparams_files_round_trip(tmp_path: Path) -> None:
    from phalanx.core.saving import (
        load_hparams_from_tags_csv,
        load_hparams_from_yaml,
        save_hparams_to_tags_csv,
        save_hparams_to_yaml,
        update_hparams,
    )

    hparams = {"lr": 0.1, "layers": [1, 2], "name": "x", "nested": {"a": 1}}
    save_hparams_to_yaml(tmp_path / "h.yaml", {**hparams, "fn": lambda x: x}, use_omegaconf=False)
    assert load_hparams_from_yaml(tmp_path / "h.yaml", use_omegaconf=False) == hparams  # the lambda is skipped
    save_hparams_to_tags_csv(tmp_path / "h.csv", hparams)
    assert load_hparams_from_tags_csv(tmp_path / "h.csv") == hparams
    with pytest.warns(UserWarning, match="Missing"):
        assert load_hparams_from_yaml(tmp_path / "missing.yaml") == {}
    update_hparams(hparams, {"nested": {"b": 2}, "lr": 0.2})
    assert hparams["nested"] == {"a": 1, "b": 2} and hparams["lr"] == 0.2


def test_small_utilities_behave_as_lightnings() -> None:
    from phalanx.loggers.logger import DummyLogger, merge_dicts
    from phalanx.utilities import find_shared_parameters, set_shared_parameters
    from phalanx.utilities.data import extract_batch_size
    from phalanx.utilities.memory import is_oom_error
    from phalanx.utilities.signature_utils import is_param_in_hook_signature

    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    groups = find_shared_parameters(tied)
    assert groups == [["0.weight", "1.weight"]]
    tied[1].weight = nn.Parameter(tied[0].weight.detach().clone())
    assert find_shared_parameters(tied) == []
    assert set_shared_parameters(tied, groups)[1].weight is tied[0].weight

    assert extract_batch_size({"x": torch.zeros(3, 2), "y": [torch.zeros(3)]}) == 3
    with pytest.raises(MisconfigurationException):
        extract_batch_size(["no tensor"])
    assert is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not is_oom_error(RuntimeError("something else"))

    def step(self: Any, batch: Any, batch_idx: int) -> None: ...

    assert is_param_in_hook_signature(step, "batch_idx")
    assert not is_param_in_hook_signature(step, "dataloader_idx", explicit=True)

    logger = DummyLogger()
    logger.log_image(key="x", images=[])  # any backend method exists and does nothing
    assert logger[0] is logger and logger.name == "" and logger.version == ""
    assert merge_dicts([{"a": 1, "b": {"c": 2}}, {"a": 3, "b": {"c": 4}}], {"a": max}) == {"a": 3, "b": {"c": 3}}


# ------------------------------------------------------------------------------- one list of gaps


def _surface_tool() -> Any:
    path = ROOT / "tools" / "lightning_surface.py"
    if not path.exists():
        pytest.skip("run from a source checkout")
    spec = importlib.util.spec_from_file_location("lightning_surface", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lightning_surface"] = module
    spec.loader.exec_module(module)
    return module


def test_every_deliberate_difference_is_documented() -> None:
    docs = (ROOT / "docs" / "migrating-from-lightning.md").read_text(encoding="utf-8")
    undocumented = [
        key
        for key in _surface_tool().DIFFERENCES
        if f"`{key.replace('lightning.pytorch', 'phalanx', 1).replace(':', '.')}`" not in docs
    ]
    assert not undocumented, f"add these to docs/migrating-from-lightning.md: {undocumented}"


def test_lightning_optimizer_pickles() -> None:
    """torch.save(trainer) pickles the optimizer wrappers; unpickling must not recurse in attribute lookup."""
    import pickle

    import torch

    from phalanx.core.optimizer import LightningOptimizer

    wrapped = LightningOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5))
    copy = pickle.loads(pickle.dumps(wrapped))
    assert copy.param_groups[0]["lr"] == 0.5 and isinstance(copy.optimizer, torch.optim.SGD)


def test_lightning_optimizer_is_an_instance_of_the_optimizer_class_and_writes_through() -> None:
    """As in Lightning, the wrapper passes isinstance checks; unlike a copy, it never drifts from the optimizer."""
    import copy

    import torch

    from phalanx.core.optimizer import LightningOptimizer

    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    wrapped = LightningOptimizer(optimizer)
    assert isinstance(wrapped, torch.optim.Adam) and isinstance(wrapped, LightningOptimizer)
    assert type(wrapped).__name__ == "LightningAdam" and str(wrapped) == "Lightning" + str(optimizer)
    state = copy.deepcopy(optimizer.state_dict())
    state["param_groups"][0]["lr"] = 1.0
    wrapped.load_state_dict(state)  # the optimizer's own method, on the optimizer
    assert optimizer.param_groups[0]["lr"] == 1.0 and wrapped.param_groups is optimizer.param_groups
    wrapped.defaults = {"lr": 2.0}
    assert optimizer.defaults == {"lr": 2.0}
    assert type(LightningOptimizer(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]))) is type(wrapped)


def test_loops_closure_is_what_optimizer_step_receives() -> None:
    import torch

    from phalanx import Trainer
    from phalanx.demos import BoringModel
    from phalanx.loops.optimization.automatic import Closure
    from phalanx.loops.utilities import check_finite_loss

    seen: list[object] = []

    class Model(BoringModel):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            seen.append(optimizer_closure)
            optimizer.step(closure=optimizer_closure)

    trainer = Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Model())
    assert len(seen) == 1 and isinstance(seen[0], Closure)
    check_finite_loss(torch.tensor(1.0))
    check_finite_loss(None)
    with pytest.raises(ValueError, match="not finite"):
        check_finite_loss(torch.tensor(float("nan")))
