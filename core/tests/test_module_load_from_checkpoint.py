"""Lightning's ``LightningModule.load_from_checkpoint`` on phalanx.Module: weights, hyperparameters, errors.

Loaded weights are compared with the trained model's (``torch.equal``); every bad input names the
path and the fix and leaves nothing behind.
"""

from __future__ import annotations

import io
import os
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
from module_helpers import Regressor, assert_same_weights
from plugin_fixtures import SitePackages
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer


def _checkpoint(model: Module, path: Path, **extra: Any) -> Path:
    """A checkpoint file as the Trainer writes it (weights, class, hyperparameters)."""
    entries = {"state_dict": model.state_dict(), "module_class": f"{type(model).__module__}.{type(model).__qualname__}"}
    entries.update(model.hparams_for_checkpoint())
    entries.update(extra)
    torch.save(entries, path)
    return path


def _tree(root: Path) -> set[str]:
    """Every file and folder under ``root``."""
    return {os.path.join(folder, name) for folder, dirs, files in os.walk(root) for name in dirs + files}


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``tempfile`` use a folder of this test's own, so "nothing left behind" can be checked exactly."""
    folder = tmp_path / "system_tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


# ---------------------------------------------------------------------- load_from_checkpoint
def test_trainer_checkpoint_loads_the_trained_weights_and_hyperparameters(tmp_path: Path) -> None:
    model = Regressor(7, lr=0.1, activation="relu")
    trainer = Trainer(accelerator="cpu", max_steps=4, default_root_dir=tmp_path, **quiet())
    trainer.fit(model, loader())
    trainer.save_checkpoint(tmp_path / "trained.ckpt")
    saved = torch.load(tmp_path / "trained.ckpt", weights_only=True)
    assert saved["hyper_parameters"] == {"hidden": 7, "lr": 0.1, "activation": "relu"}
    loaded = Regressor.load_from_checkpoint(tmp_path / "trained.ckpt")
    assert type(loaded) is Regressor and dict(loaded.hparams) == dict(model.hparams)
    assert_same_weights(loaded, model.state_dict())
    assert torch.equal(loaded(torch.ones(2, 6)), model(torch.ones(2, 6)))


def test_keyword_arguments_override_saved_hyperparameters(tmp_path: Path) -> None:
    path = _checkpoint(Regressor(5, lr=0.1), tmp_path / "m.ckpt")
    loaded = Regressor.load_from_checkpoint(path, lr=0.5)
    assert dict(loaded.hparams) == {"hidden": 5, "lr": 0.5, "activation": "tanh"}


def test_config_argument_is_rebuilt_under_its_name(tmp_path: Path) -> None:
    class Configured(Module):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.save_hyperparameters(config)
            self.layer = nn.Linear(2, config["width"])

    model = Configured({"width": 3, "dropout": 0.0})
    loaded = Configured.load_from_checkpoint(_checkpoint(model, tmp_path / "m.ckpt"))
    assert dict(loaded.hparams) == {"width": 3, "dropout": 0.0}
    assert_same_weights(loaded, model.state_dict())


@pytest.mark.parametrize("extension", ["yaml", "csv"])
def test_hparams_file_supplies_missing_hyperparameters(tmp_path: Path, extension: str) -> None:
    model = Regressor(6)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "bare.ckpt")
    hparams = tmp_path / f"hparams.{extension}"
    if extension == "yaml":
        pytest.importorskip("yaml", reason="reading .yaml hparams files needs PyYAML")
        hparams.write_text("hidden: 6\nlr: 0.2\n")
    else:
        hparams.write_text("name,value\nhidden,6\nlr,0.2\nactivation,relu\n")
    loaded = Regressor.load_from_checkpoint(tmp_path / "bare.ckpt", hparams_file=hparams)
    assert loaded.hparams.hidden == 6 and loaded.hparams.lr == 0.2
    assert_same_weights(loaded, model.state_dict())
    with pytest.raises(MisconfigurationError, match=r"\.yaml, \.yml or \.csv"):
        Regressor.load_from_checkpoint(tmp_path / "bare.ckpt", hparams_file=tmp_path / "hparams.json")


def test_missing_hyperparameter_names_parameter_path_and_fix(tmp_path: Path) -> None:
    model = Regressor(6)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "bare.ckpt")
    with pytest.raises(MisconfigurationError) as error:
        Regressor.load_from_checkpoint(tmp_path / "bare.ckpt")
    message = str(error.value)
    assert "needs 'hidden'" in message and str(tmp_path / "bare.ckpt") in message
    assert "did not call self.save_hyperparameters()" in message and "hidden=..." in message
    assert_same_weights(Regressor.load_from_checkpoint(tmp_path / "bare.ckpt", hidden=6), model.state_dict())


def test_checkpoint_of_another_model_names_path_class_and_fix(tmp_path: Path) -> None:
    class Other(Module):
        def __init__(self, hidden: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.encoder = nn.Linear(6, hidden)

    path = _checkpoint(Other(), tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError) as error:
        Regressor.load_from_checkpoint(path)
    message = str(error.value)
    assert str(path) in message and "does not match Regressor" in message and "saved from" in message
    assert "missing keys ['net.0.weight'" in message and "unexpected keys ['encoder.weight'" in message
    assert "Fix: load it with Other.load_from_checkpoint" in message
    reshaped = _checkpoint(Regressor(9), tmp_path / "wide.ckpt")
    with pytest.raises(CheckpointError, match=r"shape mismatch \['net.0.weight: checkpoint \(9, 6\) vs model \(4, 6\)"):
        Regressor.load_from_checkpoint(reshaped, hidden=4)


def test_strict_false_loads_the_common_keys_and_strict_conflicts_are_refused(tmp_path: Path) -> None:
    class Headless(Regressor):
        def __init__(self, hidden: int, lenient: bool = False) -> None:
            super().__init__(hidden)
            if lenient:
                self.strict_loading = False

    model = Regressor(4)
    path = _checkpoint(model, tmp_path / "m.ckpt", hyper_parameters={"hidden": 4})
    partial = model.state_dict()
    del partial["net.2.bias"]
    torch.save({"state_dict": partial, "hyper_parameters": {"hidden": 4}}, tmp_path / "partial.ckpt")
    with pytest.warns(UserWarning, match=r"strict=False.*\['net.2.bias'\]"):
        loaded = Headless.load_from_checkpoint(tmp_path / "partial.ckpt", strict=False)
    assert torch.equal(loaded.net[0].weight, model.net[0].weight)
    with pytest.raises(CheckpointError, match="missing keys"):
        Headless.load_from_checkpoint(tmp_path / "partial.ckpt")
    with pytest.warns(UserWarning, match="strict=False"):  # the model's own strict_loading = False
        Headless.load_from_checkpoint(tmp_path / "partial.ckpt", lenient=True)
    with pytest.raises(MisconfigurationError, match="in conflict with Headless.strict_loading=False"):
        Headless.load_from_checkpoint(path, strict=True, lenient=True)


def test_configure_model_and_on_load_checkpoint_run_before_the_weights_load(tmp_path: Path) -> None:
    class Lazy(Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer: nn.Module | None = None
            self.restored: Any = None

        def configure_model(self) -> None:
            if self.layer is None:
                self.layer = nn.Linear(3, 2)

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.restored = checkpoint["extra"]

    trained = Lazy()
    trained.configure_model()
    path = _checkpoint(trained, tmp_path / "lazy.ckpt", extra="kept")
    loaded = Lazy.load_from_checkpoint(path)
    assert loaded.restored == "kept"
    assert_same_weights(loaded, trained.state_dict())


def test_file_objects_map_location_and_weights_only(tmp_path: Path) -> None:
    model = Regressor(3)
    buffer = io.BytesIO()
    torch.save({"state_dict": model.state_dict(), **model.hparams_for_checkpoint()}, buffer)
    buffer.seek(0)
    loaded = Regressor.load_from_checkpoint(buffer, map_location="cpu")
    assert_same_weights(loaded, model.state_dict())
    assert loaded.device == torch.device("cpu")
    unsafe = _checkpoint(model, tmp_path / "unsafe.ckpt", hyper_parameters={"hidden": 3, "lr": Namespace(x=1)})
    with pytest.raises(CheckpointError, match="weights_only=False"):
        Regressor.load_from_checkpoint(unsafe)
    assert Regressor.load_from_checkpoint(unsafe, weights_only=False).hparams.lr == Namespace(x=1)


def test_corrupt_missing_and_foreign_inputs_name_the_path_and_write_nothing(tmp_path: Path, private_tmp: Path) -> None:
    good = _checkpoint(Regressor(3), tmp_path / "good.ckpt")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (tmp_path / "not_a_checkpoint").mkdir()
    (tmp_path / "not_a_checkpoint" / "notes.txt").write_text("hello")
    torch.save({"weights": {}}, tmp_path / "foreign.pt")
    before = _tree(tmp_path)
    cases = {
        truncated: "may be truncated",
        tmp_path / "missing.ckpt": "does not exist",
        tmp_path / "not_a_checkpoint": "no installed plugin recognises",
        tmp_path / "foreign.pt": "no 'state_dict'",
    }
    for path, reason in cases.items():
        with pytest.raises(CheckpointError) as error:
            Regressor.load_from_checkpoint(path)
        assert str(path) in str(error.value) and reason in str(error.value)
    assert _tree(tmp_path) == before


def test_a_datamodule_is_rebuilt_from_its_own_hyperparameters_and_state(tmp_path: Path) -> None:
    from phalanx.datamodule import DataModule
    from phalanx.saving import load_from_checkpoint

    class Data(DataModule):
        def __init__(self, batch_size: int, root: str = "data") -> None:
            super().__init__()
            self.save_hyperparameters()
            self.position = 0

        def state_dict(self) -> dict[str, Any]:
            return {"position": self.position}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.position = state_dict["position"]

    data = Data(16, root="/x")
    data.position = 7
    path = _checkpoint(
        Regressor(3), tmp_path / "m.ckpt", **data.hparams_for_checkpoint(), **{Data.__qualname__: data.state_dict()}
    )
    assert "datamodule_hyper_parameters" in torch.load(path, weights_only=True)
    loaded = load_from_checkpoint(Data, path)
    assert dict(loaded.hparams) == {"batch_size": 16, "root": "/x"} and loaded.position == 7


def test_load_from_checkpoint_refuses_an_instance(tmp_path: Path) -> None:
    path = _checkpoint(Regressor(3), tmp_path / "m.ckpt")
    with pytest.raises(TypeError, match=r"model = Regressor.load_from_checkpoint\(...\)"):
        Regressor(3).load_from_checkpoint(path)


_VENDOR_PLUGIN = """
import json, os
from phalanx import hookimpl

@hookimpl
def phalanx_convert_checkpoint(source, destination):
    marker = os.path.join(source, "vendor.json")
    if not os.path.isfile(marker):
        return None
    import torch
    from phalanx.utilities import write_portable_checkpoint

    with open(marker) as handle:
        meta = json.load(handle)
    weights = torch.load(os.path.join(source, "weights.pt"), weights_only=True)
    write_portable_checkpoint(weights, destination, source=source, extra=meta)
    return True
"""


def test_a_vendor_directory_format_loads_through_its_converter(
    site_packages: SitePackages, tmp_path: Path, private_tmp: Path
) -> None:
    site_packages.add("phalanx-fake-vendorckpt", module_source=_VENDOR_PLUGIN)
    model = Regressor(5, lr=0.3).to(torch.bfloat16)
    folder = tmp_path / "vendor_ckpt"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "weights.pt")
    (folder / "vendor.json").write_text('{"hyper_parameters": {"hidden": 5, "lr": 0.3}, "hparams_name": "kwargs"}')
    before = _tree(tmp_path)
    loaded = Regressor.load_from_checkpoint(folder)
    assert loaded.hparams.lr == 0.3
    assert_same_weights(loaded, {k: v.float() for k, v in model.state_dict().items()})  # portable files are fp32
    assert _tree(tmp_path) == before  # the converted copy lived in a temporary folder, now removed


def test_a_checkpoint_naming_an_untrusted_instantiator_is_refused(tmp_path: Any) -> None:
    """A checkpoint's ``_instantiator`` runs at load: only the trusted paths may be named (Lightning's guard)."""
    from phalanx import saving

    path = tmp_path / "malicious.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"_instantiator": "os.system"}}, path)
    with pytest.raises(ValueError, match="not in the allowlist of trusted instantiators"):
        Module.load_from_checkpoint(path, strict=False)
    assert "phalanx.cli.instantiate_module" in saving.TRUSTED_INSTANTIATORS
