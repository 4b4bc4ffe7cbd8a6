"""The bad-input table: each case sets up its files, then returns the call that must fail.

A case is ``(id, setup, error type, substrings)``: ``setup(tmp)`` prepares what the call needs
and returns a zero-argument callable; the callable must raise ``error type`` once, with a message
containing every substring (the bad value and at least one valid choice). The test adds the
checks every case shares: the message says how to fix it, and no file was written, moved or
deleted by the failing call.
"""

from __future__ import annotations

import json
import pickle
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rel_common import Net, build_layers, train_loader
from torch import nn

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.errors import CheckpointError, MisconfigurationError

Setup = Callable[[Path], Callable[[], Any]]
CASES: list[tuple[str, Setup, type[BaseException] | tuple[type[BaseException], ...], tuple[str, ...]]] = []


def case(name: str, error: Any, *must: str) -> Callable[[Setup], Setup]:
    def register(setup: Setup) -> Setup:
        CASES.append((name, setup, error, must))
        return setup

    return register


def trainer_call(must: tuple[str, ...] = (), **kwargs: Any) -> Setup:
    def setup(tmp: Path) -> Callable[[], Any]:
        options = {"accelerator": "cpu", "logger": False, "default_root_dir": str(tmp / "root"), **kwargs}
        return lambda: Trainer(**options)

    return setup


# ---------------------------------------------------------------- Trainer arguments: names and values
_TRAINER = [
    ("strategy-typo", {"strategy": "ddpp"}, "UnknownNameError", ("'ddpp'", "'ddp'")),
    ("strategy-unknown", {"strategy": "horovod"}, "UnknownNameError", ("'horovod'", "ddp")),
    ("strategy-type", {"strategy": 3}, MisconfigurationError, ("3",)),
    ("accelerator-typo", {"accelerator": "tpux"}, "UnknownNameError", ("'tpux'", "cpu")),
    ("accelerator-cuda-missing", {"accelerator": "cuda"}, MisconfigurationError, ("'cuda'", "'cpu'")),
    ("accelerator-mps-missing", {"accelerator": "mps"}, MisconfigurationError, ("'mps'", "'cpu'")),
    ("devices-negative", {"devices": -2}, MisconfigurationError, ("devices=-2", "devices=2")),
    ("devices-zero", {"devices": 0}, MisconfigurationError, ("devices=0", "devices=2")),
    ("devices-text", {"devices": "abc"}, MisconfigurationError, ("'abc'", "devices=2")),
    ("devices-index-list-on-cpu", {"devices": [0, 5]}, MisconfigurationError, ("[0, 5]", "devices=2")),
    ("num-nodes-zero", {"num_nodes": 0}, MisconfigurationError, ("num_nodes=0", ">= 1")),
    ("num-nodes-text", {"num_nodes": "2"}, MisconfigurationError, ("'2'", ">= 1")),
    ("precision-unknown", {"precision": "17-mixed"}, MisconfigurationError, ("'17-mixed'", "'16-mixed'")),
    ("precision-int", {"precision": 8}, MisconfigurationError, ("precision=8", "'32-true'")),
    ("max-epochs", {"max_epochs": -5}, MisconfigurationError, ("max_epochs=-5", "-1")),
    ("max-steps", {"max_steps": -3}, MisconfigurationError, ("max_steps=-3", ">= -1")),
    ("limit-train", {"limit_train_batches": 1.5}, MisconfigurationError, ("1.5", "[0.0, 1.0]")),
    ("limit-val", {"limit_val_batches": -1}, MisconfigurationError, ("-1", "[0.0, 1.0]")),
    ("val-check-interval", {"val_check_interval": 0.0}, MisconfigurationError, ("0.0", "(0.0, 1.0]")),
    ("check-val-every", {"check_val_every_n_epoch": 0}, MisconfigurationError, ("=0", ">= 1")),
    ("accumulate", {"accumulate_grad_batches": 0}, MisconfigurationError, ("=0", ">= 1")),
    ("clip-value", {"gradient_clip_val": -1.0}, MisconfigurationError, ("-1.0", ">= 0")),
    ("clip-algorithm", {"gradient_clip_algorithm": "l2"}, MisconfigurationError, ("'l2'", "'norm'")),
    ("log-every", {"log_every_n_steps": 0}, MisconfigurationError, ("=0", ">= 1")),
    ("deterministic", {"deterministic": "yes"}, MisconfigurationError, ("'yes'", "'warn'")),
    ("callbacks", {"callbacks": [object()]}, MisconfigurationError, ("object", "Callback")),
    ("logger", {"logger": "csv?"}, MisconfigurationError, ("logger='csv?'", "Did you mean 'csv'", "Available: csv")),
    ("plugins-unknown-name", {"plugins": ["nonexistent_io"]}, MisconfigurationError, ("'nonexistent_io'", "'torch'")),
    ("plugins-object", {"plugins": [object()]}, MisconfigurationError, ("object", "CheckpointIO")),
    ("default-root-dir", {"default_root_dir": 123}, MisconfigurationError, ("=123", "path")),
    # gcsfs / adlfs are not installed in the test environments: the URL fails naming the package
    (
        "default-root-dir-url",
        {"default_root_dir": "gs://bucket/run"},
        MisconfigurationError,
        ("'gs://bucket/run'", "pip install gcsfs"),
    ),
    (
        "default-root-dir-scheme",
        {"default_root_dir": "nosuchfs://b/run"},
        MisconfigurationError,
        ("'nosuchfs://b/run'", "'s3'"),
    ),
    ("sync-batchnorm", {"sync_batchnorm": "yes"}, MisconfigurationError, ("'yes'", "True")),
    ("use-distributed-sampler", {"use_distributed_sampler": "x"}, MisconfigurationError, ("'x'", "True")),
    (
        "single-device-two-devices",
        {"strategy": "single_device", "devices": 2},
        MisconfigurationError,
        ("devices=2", "'ddp'"),
    ),
    ("xla-not-installed", {"strategy": "xla"}, "PluginUnavailableError", ("'xla'", "pip install")),
    (
        "deepspeed-fp16-on-cpu",
        {"strategy": "deepspeed", "devices": 2, "precision": "16-mixed"},
        MisconfigurationError,
        ("'16-mixed'", "'bf16-mixed'"),
    ),
]
for _name, _kwargs, _error, _must in _TRAINER:
    case(f"trainer-{_name}", _error, *_must)(trainer_call(**_kwargs))


# ---------------------------------------------------------------- strategy constructors
def _ddp(**kwargs: Any) -> Callable[[], Any]:
    from phalanx_strategy_ddp import DDPStrategy

    return lambda: DDPStrategy(**kwargs)


case("ddp-backend", (MisconfigurationError, ValueError), "'glooo'", "gloo")(
    lambda tmp: _ddp(process_group_backend="glooo")
)
case("ddp-start-method", (MisconfigurationError, ValueError), "'thread'", "spawn")(
    lambda tmp: _ddp(start_method="thread")
)
case("ddp-timeout-type", (MisconfigurationError, TypeError, ValueError), "30", "timedelta")(
    lambda tmp: _ddp(timeout=30)
)


def _fsdp(**kwargs: Any) -> Callable[[], Any]:
    from phalanx_strategy_fsdp import FSDPStrategy

    return lambda: FSDPStrategy(**kwargs)


case("fsdp-state-dict-type", (MisconfigurationError, ValueError), "'half'", "'sharded'")(
    lambda tmp: _fsdp(state_dict_type="half")
)


# ---------------------------------------------------------------- DeepSpeed configs
def _deepspeed(**kwargs: Any) -> Callable[[], Any]:
    from phalanx_strategy_deepspeed import DeepSpeedStrategy

    return lambda: DeepSpeedStrategy(**kwargs)


case("deepspeed-config-missing-file", (MisconfigurationError, FileNotFoundError), "nope.json")(
    lambda tmp: _deepspeed(config=str(tmp / "nope.json"))
)


@case("deepspeed-config-invalid-json", MisconfigurationError, "ds.json")
def _ds_invalid_json(tmp: Path) -> Callable[[], Any]:
    (tmp / "ds.json").write_text('{"zero_optimization": {"stage": 2,}}')
    return _deepspeed(config=str(tmp / "ds.json"))


case("deepspeed-stage-out-of-range", MisconfigurationError, "7", "3")(lambda tmp: _deepspeed(stage=7))
case("deepspeed-offload-device", MisconfigurationError, "'disk'", "'cpu'")(
    lambda tmp: _deepspeed(offload_optimizer=True, offload_optimizer_device="disk")
)
case("deepspeed-nvme-without-path", MisconfigurationError, "'nvme'", "nvme_path")(
    lambda tmp: _deepspeed(remote_device="nvme")
)


@case("deepspeed-config-not-an-object", MisconfigurationError, "list.json", "object")
def _ds_list(tmp: Path) -> Callable[[], Any]:
    (tmp / "list.json").write_text("[1, 2]")
    return _deepspeed(config=str(tmp / "list.json"))


# ---------------------------------------------------------------- fit inputs
def _fit(tmp: Path, model: Any = None, data: Any = "default", **fit_kwargs: Any) -> Callable[[], Any]:
    trainer = Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=1, default_root_dir=str(tmp / "root")
    )
    loader = train_loader() if data == "default" else data
    return lambda: trainer.fit(Net() if model is None else model, loader, **fit_kwargs)


case("fit-not-a-module", MisconfigurationError, "Sequential", "phalanx.Module")(
    lambda tmp: _fit(tmp, model=build_layers())
)
case("fit-data-not-iterable", MisconfigurationError, "42")(lambda tmp: _fit(tmp, data=42))
case("fit-ckpt-path-type", MisconfigurationError, "3.5", "'last'")(lambda tmp: _fit(tmp, ckpt_path=3.5))
case("fit-ckpt-path-best", MisconfigurationError, "'best'", "'last'")(lambda tmp: _fit(tmp, ckpt_path="best"))
case("fit-ckpt-path-url", MisconfigurationError, "'abfs://container/run/last.ckpt'", "pip install adlfs")(
    lambda tmp: _fit(tmp, ckpt_path="abfs://container/run/last.ckpt")
)
case("fit-ckpt-path-url-missing", CheckpointError, "'memory://phalanx-bad-input/none.ckpt'", "'last'")(
    lambda tmp: _fit(tmp, ckpt_path="memory://phalanx-bad-input/none.ckpt")
)
case("fit-ckpt-missing", CheckpointError, "missing.ckpt", "'last'")(
    lambda tmp: _fit(tmp, ckpt_path=str(tmp / "missing.ckpt"))
)


@case("fit-ckpt-is-a-directory", CheckpointError, "somedir")
def _ckpt_dir(tmp: Path) -> Callable[[], Any]:
    (tmp / "somedir").mkdir()
    return _fit(tmp, ckpt_path=str(tmp / "somedir"))


def _good_checkpoint(tmp: Path, name: str = "good.ckpt") -> Path:
    trainer = Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        max_steps=1,
        default_root_dir=str(tmp / "make"),
    )
    trainer.fit(Net(), train_loader())
    path = tmp / name
    trainer.save_checkpoint(path)
    return path


@case("fit-ckpt-corrupt", CheckpointError, "corrupt.ckpt", "another checkpoint")
def _corrupt(tmp: Path) -> Callable[[], Any]:
    (tmp / "corrupt.ckpt").write_bytes(b"this is not a checkpoint at all" * 10)
    return _fit(tmp, ckpt_path=str(tmp / "corrupt.ckpt"))


@case("fit-ckpt-truncated", CheckpointError, "truncated.ckpt", "another checkpoint")
def _truncated(tmp: Path) -> Callable[[], Any]:
    good = _good_checkpoint(tmp)
    data = good.read_bytes()
    (tmp / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    return _fit(tmp, ckpt_path=str(tmp / "truncated.ckpt"))


class _Other(Net):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1))


@case("fit-ckpt-another-model", CheckpointError, "good.ckpt", "shape mismatch")
def _other_model(tmp: Path) -> Callable[[], Any]:
    return _fit(tmp, model=_Other(), ckpt_path=str(_good_checkpoint(tmp)))


@case("fit-ckpt-bare-state-dict", CheckpointError, "bare.ckpt", "load_state_dict")
def _bare(tmp: Path) -> Callable[[], Any]:
    torch.save(build_layers().state_dict(), tmp / "bare.ckpt")
    return _fit(tmp, ckpt_path=str(tmp / "bare.ckpt"))


@case("fit-ckpt-weights-only", CheckpointError, "weights.ckpt", "save_weights_only=False")
def _weights_only(tmp: Path) -> Callable[[], Any]:
    good = torch.load(_good_checkpoint(tmp), weights_only=True)
    torch.save({k: good[k] for k in ("format_version", "state_dict", "global_step", "epoch")}, tmp / "weights.ckpt")
    return _fit(tmp, ckpt_path=str(tmp / "weights.ckpt"))


@case("fit-ckpt-newer-format", CheckpointError, "newer.ckpt", "Upgrade phalanx-core")
def _newer(tmp: Path) -> Callable[[], Any]:
    good = torch.load(_good_checkpoint(tmp), weights_only=True)
    good["format_version"] = 99
    torch.save(good, tmp / "newer.ckpt")
    return _fit(tmp, ckpt_path=str(tmp / "newer.ckpt"))


class _Payload:
    """Unpickling this would create ``pwned``: a checkpoint must never run code on load."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> Any:
        return (open, (self.target, "w"))


@case("fit-ckpt-pickle-payload", CheckpointError, "payload.ckpt", "weights_only=False")
def _payload(tmp: Path) -> Callable[[], Any]:
    good = torch.load(_good_checkpoint(tmp), weights_only=True)
    good["evil"] = _Payload(str(tmp / "pwned"))
    with open(tmp / "payload.ckpt", "wb") as handle:
        torch.save(good, handle, pickle_module=pickle)
    return _fit(tmp, ckpt_path=str(tmp / "payload.ckpt"))


@case("fit-ckpt-another-strategy-world", CheckpointError, "ds.ckpt", "phalanx checkpoint convert")
def _other_world(tmp: Path) -> Callable[[], Any]:
    # a DeepSpeed directory from 4 ranks, resumed by single_device: not a phalanx single file
    (tmp / "ds.ckpt").mkdir()
    (tmp / "ds.ckpt" / "latest").write_text("checkpoint")
    (tmp / "ds.ckpt" / "phalanx_deepspeed.json").write_text(json.dumps({"world_size": 4, "zero_stage": 2}))
    return _fit(tmp, ckpt_path=str(tmp / "ds.ckpt"))


# ---------------------------------------------------------------- callbacks
case("model-checkpoint-top-k", MisconfigurationError, "-2", "-1")(lambda tmp: lambda: ModelCheckpoint(save_top_k=-2))
case("model-checkpoint-mode", MisconfigurationError, "'up'", "'min'")(lambda tmp: lambda: ModelCheckpoint(mode="up"))
case("model-checkpoint-dirpath-url", MisconfigurationError, "'gs://bucket/ckpts'", "pip install gcsfs")(
    lambda tmp: lambda: ModelCheckpoint(dirpath="gs://bucket/ckpts")
)
case("model-checkpoint-every-n", MisconfigurationError, "-1", "every_n_train_steps")(
    lambda tmp: lambda: ModelCheckpoint(every_n_train_steps=-1)
)


# ---------------------------------------------------------------- spawn cannot pickle
class _Unpicklable(Net):
    def __init__(self) -> None:
        super().__init__()
        self.transform = lambda x: x


@case("spawn-unpicklable-attribute", MisconfigurationError, "transform", "strategy='ddp'")
def _spawn(tmp: Path) -> Callable[[], Any]:
    trainer = Trainer(
        accelerator="cpu",
        strategy="ddp_spawn",
        devices=2,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp / "root"),
        max_steps=1,
    )
    return lambda: trainer.fit(_Unpicklable(), train_loader())


@case("spawn-unpicklable-data", MisconfigurationError, "strategy='ddp'")
def _spawn_data(tmp: Path) -> Callable[[], Any]:
    trainer = Trainer(
        accelerator="cpu",
        strategy="ddp_spawn",
        devices=2,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp / "root"),
        max_steps=1,
    )
    data = (batch for batch in train_loader())  # a generator cannot travel to another process
    return lambda: trainer.fit(Net(), data)


# ---------------------------------------------------------------- plugin faults (real installed distributions)
def install_plugin(site: Path, name: str, source: str, *, requires: tuple[str, ...] = ("phalanx-core",)) -> None:
    """Write a distribution ``name`` (module ``phalanx_<name>``) with an entry point into ``site``."""
    module = f"phalanx_{name.replace('-', '_')}"
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {module.replace('_', '-')}",
        "Version: 1.0",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(lines) + "\n\n")
    (info / "entry_points.txt").write_text(f"[phalanx]\n{name} = {module}\n")


_REGISTER = """
from phalanx import hookimpl

@hookimpl
def phalanx_register_strategies(registry):
    registry.register({name!r}, "phalanx.strategies:SingleDeviceStrategy", "test strategy")
"""
#: name -> (source, requires, strategy asked for, error type name, substrings); run by test_bad_input.
PLUGIN_CASES: dict[str, tuple[str, tuple[str, ...], str, str, tuple[str, ...]]] = {
    "plugin-broken-import": (
        "raise ImportError('no module named fakelib')\n",
        ("phalanx-core",),
        "fakebroken",
        "PluginUnavailableError",
        ("fakebroken",),
    ),
    "plugin-incompatible-core": (
        _REGISTER.format(name="fakeold"),
        ("phalanx-core<0.0.1",),
        "fakeold",
        "PluginUnavailableError",
        ("fakeold", "phalanx-core"),
    ),
    "plugin-duplicate-name": (_REGISTER.format(name="ddp"), ("phalanx-core",), "ddp", "", ("ddp",)),
}
