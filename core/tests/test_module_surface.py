"""Lightning's LightningModule members on phalanx.Module: hyperparameters, exporting, toggling.

``load_from_checkpoint`` is tested in test_module_load_from_checkpoint.py.

Numbers are compared with plain PyTorch computed in the same test (``torch.equal``): loaded weights
against the trained model's, gradients against ``loss.backward()``, learning rates against a plain
scheduler, toggled training against a hand-written loop that sets ``requires_grad`` itself.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
from module_helpers import Regressor, assert_same_weights
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.errors import MisconfigurationError
from phalanx.hparams import AttributeDict, HyperparametersMixin, hparams_to_log
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer


# ---------------------------------------------------------------------- save_hyperparameters
def test_save_hyperparameters_records_every_init_argument_with_defaults() -> None:
    model = Regressor(8, activation="relu")
    assert dict(model.hparams) == {"hidden": 8, "lr": 0.05, "activation": "relu"}
    assert model.hparams.hidden == 8 and isinstance(model.hparams, AttributeDict)
    assert model.should_log_hparams
    assert model.hparams_for_checkpoint() == {
        "hyper_parameters": {"hidden": 8, "lr": 0.05, "activation": "relu"},
        "hparams_name": "kwargs",
    }


def test_hparams_initial_is_a_frozen_copy() -> None:
    model = Regressor(8)
    model.hparams.lr = 1.0
    initial = model.hparams_initial
    initial["hidden"] = 99
    assert model.hparams.lr == 1.0 and model.hparams_initial.lr == 0.05 and model.hparams_initial.hidden == 8


def test_subclass_chain_merges_arguments_with_the_subclass_winning() -> None:
    class Base(Module):
        def __init__(self, width: int = 4, depth: int = 1, **kwargs: Any) -> None:
            super().__init__()
            self.save_hyperparameters()

    class Child(Base):
        def __init__(self, width: int, dropout: float = 0.1) -> None:
            width = width * 2  # the value the chain passes on is the one saved
            super().__init__(width=width, depth=3, extra="x")

    assert dict(Child(5).hparams) == {"width": 10, "depth": 3, "extra": "x", "dropout": 0.1}


def test_a_submodule_built_inside_init_keeps_its_own_arguments() -> None:
    class Inner(Module):
        def __init__(self, size: int) -> None:
            super().__init__()
            self.save_hyperparameters()

    class Outer(Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.inner = Inner(3)

    assert dict(Outer("outer").inner.hparams) == {"size": 3}


def test_ignore_accepts_a_name_or_a_list() -> None:
    class Model(Module):
        def __init__(self, a: int, b: int, backbone: nn.Module, ignore: Any) -> None:
            super().__init__()
            self.save_hyperparameters(ignore=ignore)

    assert dict(Model(1, 2, nn.Identity(), ignore="backbone").hparams) == {"a": 1, "b": 2, "ignore": "backbone"}
    assert dict(Model(1, 2, nn.Identity(), ignore=["backbone", "b", "ignore"]).hparams) == {"a": 1}
    with pytest.warns(UserWarning, match=r"ignore=\['backbone'\]"):
        Model(1, 2, nn.Identity(), ignore=[])


def test_names_select_arguments_and_unknown_names_are_refused() -> None:
    class Model(Module):
        def __init__(self, a: int, b: int, c: int, names: tuple[str, ...]) -> None:
            super().__init__()
            self.save_hyperparameters(*names)

    assert dict(Model(1, 2, 3, ("a", "c")).hparams) == {"a": 1, "c": 3}
    with pytest.raises(MisconfigurationError, match=r"\['d'\] is not an argument of the __init__.*'a', 'b', 'c'"):
        Model(1, 2, 3, ("a", "d"))


def test_a_dict_or_namespace_argument_is_saved_as_is_under_its_name() -> None:
    class Model(Module):
        def __init__(self, config: Any) -> None:
            super().__init__()
            self.save_hyperparameters(config)

    from_dict = Model({"lr": 0.1, "layers": [1, 2]})
    assert dict(from_dict.hparams) == {"lr": 0.1, "layers": [1, 2]}
    assert from_dict.hparams_for_checkpoint()["hparams_name"] == "config"
    assert dict(Model(Namespace(lr=0.2)).hparams) == {"lr": 0.2}
    with pytest.raises(MisconfigurationError, match="must be a dict"):
        Model(0.5)


def test_logger_false_and_merging_with_a_datamodule() -> None:
    class Data(HyperparametersMixin):  # a plain object, as a DataModule is
        def __init__(self, batch_size: int, lr: float = 0.05, log: bool = True) -> None:
            self.save_hyperparameters(logger=log)

    model = Regressor(4)
    assert hparams_to_log(model, Data(32)) == {
        "hidden": 4,
        "lr": 0.05,
        "activation": "tanh",
        "batch_size": 32,
        "log": True,
    }
    assert hparams_to_log(model, Data(32, log=False)) == dict(model.hparams)
    with pytest.raises(MisconfigurationError, match=r"\['lr'\] with different values"):
        hparams_to_log(model, Data(32, lr=0.1))
    quiet_model = Regressor(4)
    quiet_model.save_hyperparameters(logger=False)  # outside __init__: records nothing new
    assert not quiet_model.should_log_hparams and hparams_to_log(quiet_model) is None


def test_dataclass_records_its_init_fields() -> None:
    @dataclasses.dataclass
    class Data(HyperparametersMixin):
        batch_size: int = 8
        cache: dict[str, Any] = dataclasses.field(default_factory=dict, init=False)

        def __post_init__(self) -> None:
            self.save_hyperparameters()

    assert dict(Data(16).hparams) == {"batch_size": 16}


def test_attribute_dict_behaves_as_dict_and_attributes() -> None:
    hparams = AttributeDict(lr=0.1)
    hparams.layers = 2
    assert hparams == {"lr": 0.1, "layers": 2} and hparams["layers"] == 2
    del hparams.layers
    assert not hasattr(hparams, "layers") and getattr(hparams, "momentum", None) is None
    with pytest.raises(AttributeError, match="no key 'layers'"):
        del hparams.layers
    assert pickle.loads(pickle.dumps(hparams)) == hparams and copy.deepcopy(hparams) == hparams
    assert repr(AttributeDict(bb=1, a="x")) == '"a":  x\n"bb": 1'


def test_hparams_module_imports_no_torch() -> None:
    code = "import sys, phalanx.hparams; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------------- hooks and helpers
def test_backward_default_matches_plain_backward() -> None:
    torch.manual_seed(0)
    model = Regressor(4)
    plain = copy.deepcopy(model)
    x, y = torch.randn(5, 6), torch.randn(5, 1)
    model.backward(nn.functional.mse_loss(model(x), y))
    nn.functional.mse_loss(plain(x), y).backward()
    for ours, theirs in zip(model.parameters(), plain.parameters()):
        assert torch.equal(ours.grad, theirs.grad)


@pytest.mark.parametrize("plateau", [False, True])
def test_lr_scheduler_step_matches_plain_scheduler(plateau: bool) -> None:
    def make() -> tuple[torch.optim.Optimizer, Any]:
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        if plateau:
            return optimizer, torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    (ours, our_scheduler), (theirs, their_scheduler) = make(), make()
    for metric in (3.0, 2.0, 2.5, 2.5):
        ours.step()
        theirs.step()
        Regressor(2).lr_scheduler_step(our_scheduler, metric if plateau else None)
        if plateau:
            their_scheduler.step(metric)
        else:
            their_scheduler.step()
        assert ours.param_groups[0]["lr"] == theirs.param_groups[0]["lr"]
    assert ours.param_groups[0]["lr"] < 1.0


def test_default_hooks_callbacks_zero_grad_example_input_and_strictness() -> None:
    model = Regressor(4)
    assert model.configure_callbacks() == []
    assert model.prepare_data_per_node and not model.allow_zero_length_dataloader_with_multiple_devices
    model(torch.randn(2, 6)).sum().backward()
    model.on_validation_model_zero_grad()
    assert all(param.grad is None for param in model.parameters())
    assert model.example_input_array is None
    model.example_input_array = torch.ones(1, 6)
    assert torch.equal(model.example_input_array, torch.ones(1, 6))
    assert model.strict_loading is True and not model.on_gpu
    model.strict_loading = False
    assert model.strict_loading is False


def test_freeze_and_unfreeze() -> None:
    model = Regressor(4)
    assert model.freeze() is model and not model.training
    assert not any(param.requires_grad for param in model.parameters())
    assert model.unfreeze() is model and model.training
    assert all(param.requires_grad for param in model.parameters())


def test_every_property_is_hidden_from_torchscript() -> None:
    properties = {
        name for klass in Module.__mro__ for name, value in vars(klass).items() if isinstance(value, property)
    }
    assert properties <= set(Module.__jit_unused_properties__)


class _TwoOptimizers(Module):
    """Manual optimization with one optimizer per layer, each step toggled (a GAN's pattern)."""

    def __init__(self, *, use_context: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(6, 6), nn.Linear(6, 1)
        self.first.bias.requires_grad = False  # frozen by the user: must stay frozen
        self.automatic_optimization = False
        self.use_context = use_context
        self.seen: list[tuple[bool, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))

    def _step(self, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        self.seen.append(tuple(param.requires_grad for param in self.parameters()))
        optimizer.zero_grad()
        self.manual_backward(nn.functional.mse_loss(self(x), y))
        optimizer.step()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        for optimizer in self.optimizers():
            if self.use_context:
                with self.toggled_optimizer(optimizer):
                    self._step(optimizer, *batch)
            else:
                self.toggle_optimizer(optimizer)
                self._step(optimizer, *batch)
                self.untoggle_optimizer(optimizer)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.SGD(self.first.parameters(), lr=0.1), torch.optim.SGD(self.second.parameters(), lr=0.1)]


def _plain_toggled(model: _TwoOptimizers, data: Any) -> dict[str, torch.Tensor]:
    """The same training written by hand: requires_grad switched around each optimizer's step."""
    optimizers = model.configure_optimizers()
    layers = [model.first, model.second]
    for x, y in data:
        for active, optimizer in zip(layers, optimizers):
            other = layers[1 - layers.index(active)]
            saved = {param: param.requires_grad for param in other.parameters()}
            for param in other.parameters():
                param.requires_grad = False
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            for param, flag in saved.items():
                param.requires_grad = flag
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("use_context", [False, True])
def test_toggled_optimizers_train_like_plain_torch(tmp_path: Path, use_context: bool) -> None:
    model = _TwoOptimizers(use_context=use_context)
    expected = _plain_toggled(_TwoOptimizers(use_context=use_context), loader(n=12))
    Trainer(accelerator="cpu", max_epochs=1, default_root_dir=tmp_path, **quiet()).fit(model, loader(n=12))
    assert_same_weights(model, expected)
    # first.weight, first.bias (frozen), second.weight, second.bias while each optimizer was toggled
    assert model.seen[:2] == [(True, False, False, False), (False, False, True, True)]
    assert [param.requires_grad for param in model.parameters()] == [True, False, True, True]
    assert model._param_requires_grad_state == {}


# ---------------------------------------------------------------------- export
def test_to_torchscript_script_and_trace_match_eager(tmp_path: Path) -> None:
    model = Regressor(4)
    model.example_input_array = torch.randn(3, 6)
    x = torch.randn(5, 6)
    scripted = model.to_torchscript(file_path=tmp_path / "out" / "model.pt")
    traced = model.to_torchscript(method="trace")
    assert model.training  # put back in the mode it was in
    with torch.no_grad():
        expected = model(x)
        assert torch.equal(scripted(x), expected) and torch.equal(traced(x), expected)
        assert torch.equal(torch.jit.load(tmp_path / "out" / "model.pt")(x), expected)
    with pytest.raises(MisconfigurationError, match="choose 'script' or 'trace'"):
        model.to_torchscript(method="compile")
    with pytest.raises(MisconfigurationError, match="example_input_array"):
        Regressor(4).to_torchscript(method="trace")


def test_to_torchscript_scripts_modules_inside_modules() -> None:
    class Outer(Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Regressor(3)  # its `trainer` property must not raise while TorchScript reads it

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * 2

    model = Outer()
    x = torch.randn(4, 6)
    with torch.no_grad():
        assert torch.equal(model.to_torchscript()(x), model(x))


def _onnx_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("onnx") is not None and find_spec("onnxscript") is not None


@pytest.mark.skipif(_onnx_installed(), reason="onnx and onnxscript are installed: the export itself is tested")
def test_to_onnx_without_its_packages_says_what_to_install(tmp_path: Path) -> None:
    model = Regressor(4)
    with pytest.raises(ModuleNotFoundError, match="Fix: pip install onnx onnxscript"):
        model.to_onnx(tmp_path / "model.onnx", torch.randn(1, 6))
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.skipif(not _onnx_installed(), reason="to_onnx needs onnx and onnxscript (pip install onnx onnxscript)")
def test_to_onnx_writes_a_model(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    model = Regressor(4)
    model.example_input_array = torch.randn(2, 6)
    model.to_onnx(tmp_path / "model.onnx")
    graph = onnx.load(str(tmp_path / "model.onnx"))
    onnx.checker.check_model(graph)
    weights = {item.name: torch.from_numpy(numpy_helper.to_array(item).copy()) for item in graph.graph.initializer}
    assert set(weights) == set(model.state_dict())
    assert all(torch.equal(weights[key], value) for key, value in model.state_dict().items())
    assert model.training  # exported in eval mode, then put back
