"""Listing and selection work with or without torch-xla, and never import torch to list.

Without torch-xla (the core's usual torch environment) every name is listed as unavailable with
the install command, and selecting one raises that message; with torch-xla they are available.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from phalanx import _metadata
from phalanx.errors import PluginUnavailableError
from phalanx.registry import AcceleratorRegistry, CheckpointIORegistry, PrecisionRegistry, StrategyRegistry
from phalanx_strategy_xla import _plugin

STRATEGIES = ("single_xla", "xla", "xla_debug", "xla_fsdp")
REQUIREMENT = "torch-xla>=2.1"
HAS_TORCH_XLA = _metadata.version("torch-xla") is not None
without_torch_xla = pytest.mark.skipif(HAS_TORCH_XLA, reason="checks the behaviour where torch-xla is not installed")
with_torch_xla = pytest.mark.skipif(not HAS_TORCH_XLA, reason="needs torch-xla installed")


def _cli(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "phalanx.cli", *args], capture_output=True, text=True, timeout=120, check=True
    ).stdout


def test_listing_imports_neither_torch_nor_torch_xla() -> None:
    code = (
        "import sys, phalanx.cli; phalanx.cli.main(['strategies']);"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'torch_xla'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert "xla_fsdp" in out


def test_every_name_is_registered_by_this_plugin_and_requires_torch_xla() -> None:
    registries = {
        StrategyRegistry: STRATEGIES,
        AcceleratorRegistry: ("xla", "tpu"),
        PrecisionRegistry: ("xla-bf16-true", "xla-bf16-mixed"),
        CheckpointIORegistry: ("xla", "xla_sharded"),
    }
    for registry, names in registries.items():
        for name in names:
            entry = registry.entry(name)
            assert entry.source.distribution == "phalanx-strategy-xla", (registry.kind, name)
            assert entry.requires == (REQUIREMENT,), (registry.kind, name)
            assert entry.target_path.startswith("phalanx_strategy_xla."), (registry.kind, name)
    assert StrategyRegistry.entry("xla_debug").init_params == {"debug": True}


def test_auto_strategy_on_xla_is_single_xla_for_one_device_and_xla_for_several() -> None:
    select = _plugin.phalanx_select_strategy
    assert select(accelerator="xla", num_devices=1, num_nodes=1, interactive=False) == "single_xla"
    assert select(accelerator="tpu", num_devices=8, num_nodes=1, interactive=True) == "xla"
    assert select(accelerator="cuda", num_devices=2, num_nodes=1, interactive=False) is None


@without_torch_xla
def test_without_torch_xla_names_are_listed_unavailable_with_the_install_command() -> None:
    rows = {row["name"]: row for row in json.loads(_cli("strategies", "--json"))}
    for name in STRATEGIES:
        row = rows[name]
        assert row["available"] is False, name
        assert row["distribution"] == "phalanx-strategy-xla"
        assert f"pip install '{REQUIREMENT}'" in row["reason"], row["reason"]
    assert "not installed" in rows["xla"]["reason"]


@without_torch_xla
@pytest.mark.parametrize("name", STRATEGIES)
def test_without_torch_xla_selecting_a_strategy_raises_the_install_command(name: str) -> None:
    with pytest.raises(PluginUnavailableError, match=r"pip install 'torch-xla>=2\.1'"):
        StrategyRegistry.get(name)


@without_torch_xla
def test_without_torch_xla_trainer_and_imports_raise_the_install_command() -> None:
    from phalanx import Trainer

    with pytest.raises(PluginUnavailableError, match="torch-xla"):
        Trainer(strategy="single_xla", logger=False)
    with pytest.raises(PluginUnavailableError, match="torch-xla"):
        Trainer(accelerator="tpu", logger=False)
    # As in Lightning, the class imports without torch-xla (this package's modules do not import it
    # at the top); building a Trainer with it says what to install.
    from phalanx.strategies import XLAStrategy

    with pytest.raises(PluginUnavailableError, match="torch-xla"):
        Trainer(accelerator="xla", strategy=XLAStrategy(), logger=False)


@without_torch_xla
def test_without_torch_xla_auto_never_picks_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert _plugin.phalanx_select_accelerator() is None


@with_torch_xla
def test_with_torch_xla_every_name_is_available() -> None:
    for name in STRATEGIES:
        assert StrategyRegistry.entry(name).available, StrategyRegistry.entry(name).unavailable_reason()
    assert AcceleratorRegistry.entry("tpu").available
