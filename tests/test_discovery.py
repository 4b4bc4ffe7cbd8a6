"""Discovery of real, pip-installed plugin distributions (the integration session installs them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from phalanx.discovery import plugin_records
from phalanx.registry import CheckpointIORegistry, StrategyRegistry


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "phalanx.cli", *args], capture_output=True, text=True, timeout=60, check=True)


def test_installed_test_plugin_is_listed_by_the_cli() -> None:
    rows = {row["name"]: row for row in json.loads(_cli("strategies", "--json").stdout)}
    row = rows["counting_single_device"]
    assert row["distribution"] == "phalanx-testplugin"
    assert row["version"] == "0.4.0"
    assert row["plugin"] == "testplugin"
    assert row["available"] is True
    plugins = {p["entry_point"]: p for p in json.loads(_cli("plugins", "--json").stdout)}
    assert plugins["testplugin"]["status"] == "loaded"
    assert plugins["testplugin"]["provides"]["checkpoint IO"] == ["counting_torch"]


def test_installed_test_plugin_resolves_through_the_registry() -> None:
    strategy = StrategyRegistry.get("counting_single_device")
    assert type(strategy).__module__ == "phalanx_testplugin.strategy"
    assert str(strategy.root_device) == "cpu"
    assert type(CheckpointIORegistry.get("counting_torch")).__name__ == "CountingCheckpointIO"
    assert any(r.distribution == "phalanx-testplugin" for r in plugin_records())


def test_first_party_strategy_classes_import_from_phalanx_strategies() -> None:
    installed = {r.distribution for r in plugin_records() if r.status == "loaded"}
    if "phalanx-strategy-ddp" not in installed:
        pytest.skip("phalanx-strategy-ddp is not installed in this environment")
    from phalanx.strategies import DDPStrategy

    assert DDPStrategy.__module__.startswith("phalanx_strategy_ddp")


def test_listing_every_installed_plugin_does_not_import_torch() -> None:
    code = "import sys, phalanx.cli; phalanx.cli.main(['strategies']); phalanx.cli.main(['plugins']); print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'deepspeed', 'torch_xla'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
