"""The layering rule of DESIGN.md §6 holds for the tree, and the checker really catches violations."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _checker():  # type: ignore[no-untyped-def]
    path = ROOT / "tools" / "check_layering.py"
    if not path.exists():
        pytest.skip("run from a source checkout")
    spec = importlib.util.spec_from_file_location("check_layering", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layering"] = module
    spec.loader.exec_module(module)
    return module


def test_repository_respects_layering() -> None:
    assert _checker().check(ROOT) == []


def test_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    core = tmp_path / "core" / "src" / "phalanx"
    core.mkdir(parents=True)
    (core / "bad.py").write_text("def f():\n    import phalanx_strategy_ddp\n")
    (core / "_plugin.py").write_text("import torch\n")
    pkg = tmp_path / "packages" / "strategy-x"
    (pkg / "src" / "phalanx_strategy_x").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text('[project]\nname = "phalanx-strategy-x"\ndependencies = ["phalanx-core"]\n')
    (pkg / "src" / "phalanx_strategy_x" / "_plugin.py").write_text("if True:\n    from torch import nn\n")
    (pkg / "src" / "phalanx_strategy_x" / "strategy.py").write_text("import phalanx_strategy_ddp.strategy\n")
    (pkg / "src" / "phalanx_strategy_x" / "helpers.py").write_text(
        "from phalanx._optim import optimizers_to_device\n"
        "from phalanx.launchers import _results\n"
        "def f():\n    import phalanx.strategies._redirect\n"
        "from phalanx.utilities import optimizers_to_device as fine\n"
    )
    vendor = tmp_path / "examples" / "vendor" / "src" / "vendor_strategy"
    vendor.mkdir(parents=True)
    (vendor / "strategy.py").write_text("from phalanx.precision.precision import _cast_floats\n")
    problems = _checker().check(tmp_path)
    private = [p for p in problems if "private core name" in p]
    assert sorted(p.split(": imports")[0] for p in private) == [
        "examples/vendor/src/vendor_strategy/strategy.py:1",
        "packages/strategy-x/src/phalanx_strategy_x/helpers.py:1",
        "packages/strategy-x/src/phalanx_strategy_x/helpers.py:2",
        "packages/strategy-x/src/phalanx_strategy_x/helpers.py:4",
    ]
    assert any("'phalanx.launchers._results'" in p for p in private)
    assert any("core imports plugin-side module 'phalanx_strategy_ddp'" in p for p in problems)
    assert any("core/src/phalanx/_plugin.py:1: _plugin.py imports 'torch'" in p for p in problems)
    assert any("strategy-x/src/phalanx_strategy_x/_plugin.py:2" in p for p in problems)
    assert any("does not depend on it" in p for p in problems)
    assert len(problems) == 8
