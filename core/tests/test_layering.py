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
        "from phalanx._metadata import version\n"
        "from phalanx.launchers import _results\n"
        "def f():\n    import phalanx.strategies._steps\n"
        "from phalanx.utilities import optimizers_to_device as fine\n"
        "from phalanx.utilities.optim import optimizers_to_device as also_fine\n"
    )
    vendor = tmp_path / "examples" / "vendor" / "src" / "vendor_strategy"
    vendor.mkdir(parents=True)
    (vendor / "strategy.py").write_text("from phalanx.precision.precision import _optimizer_params\n")
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
    # rule 5: bad.py and _plugin.py sit directly under phalanx/, where LAYERS names no such module
    unmatched = [p for p in problems if "add it to LAYERS" in p]
    assert [p.split(":")[0] for p in unmatched] == ["core/src/phalanx/_plugin.py", "core/src/phalanx/bad.py"]
    assert len(problems) == 10


def _tree(root: Path, files: dict[str, str]) -> Path:
    """Write a synthetic checkout: ``files`` maps paths under core/src/phalanx to their source."""
    for relative, text in files.items():
        path = root / "core" / "src" / "phalanx" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_made_only_through_a_type_checking_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "errors.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from phalanx.registry import Registry\n",
            "registry.py": "from phalanx.errors import PhalanxError\n",
        },
    )
    assert _checker().check(root) == [
        "core/src/phalanx/errors.py:3: import cycle among 2 core modules (phalanx.errors, phalanx.registry), "
        "e.g. phalanx.errors -> phalanx.registry (core/src/phalanx/errors.py:3) "
        "-> phalanx.errors (core/src/phalanx/registry.py:1): move the shared name down a layer to break it"
    ]


def test_a_cycle_through_a_function_local_relative_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "strategies/__init__.py": "",
            "strategies/a.py": "def f():\n    from . import b\n",
            "strategies/b.py": "from .c import helper\n",
            "strategies/c.py": "def g():\n    from .a import f\n",
        },
    )
    (problem,) = _checker().check(root)
    assert (
        "import cycle among 3 core modules (phalanx.strategies.a, phalanx.strategies.b, phalanx.strategies.c)"
        in problem
    )
    assert (
        "phalanx.strategies.a -> phalanx.strategies.b (core/src/phalanx/strategies/a.py:2) "
        "-> phalanx.strategies.c (core/src/phalanx/strategies/b.py:1) "
        "-> phalanx.strategies.a (core/src/phalanx/strategies/c.py:2)"
    ) in problem


def test_imports_resolve_to_the_module_that_runs(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "trainer/__init__.py": "from phalanx.trainer.trainer import Trainer\n",
            "trainer/trainer.py": "",
            "trainer/loop.py": "from phalanx.trainer import trainer\nfrom phalanx.trainer import Trainer\n"
            "from .. import errors\nimport phalanx.errors as e\n",
            "errors.py": "",
        },
    )
    graph = _checker().import_graph(root)
    assert graph["phalanx.trainer.loop"] == {
        "phalanx.trainer.trainer": [1],
        "phalanx.trainer": [2],
        "phalanx.errors": [3, 4],
    }
    assert graph["phalanx.trainer"] == {"phalanx.trainer.trainer": [1]}


def test_an_upward_import_is_found_with_both_layers(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "strategies/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from phalanx.trainer.y import Y\n",
            "trainer/y.py": "from phalanx.strategies.x import X\n",  # downward: fine
        },
    )
    problems = _checker().check(root)
    cycles = [p for p in problems if "import cycle" in p]
    assert len(cycles) == 1
    assert [p for p in problems if p not in cycles] == [
        "core/src/phalanx/strategies/x.py:3: phalanx.strategies.x (layer 5 'strategies') imports phalanx.trainer.y "
        "(layer 7 'trainer'): a lower layer must not import a higher one; move the shared name down"
    ]


def test_a_module_matching_no_layer_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"misc.py": "", "trainer_viewer.py": "", "errors.py": ""})
    assert _checker().check(root) == [
        "core/src/phalanx/misc.py:1: phalanx.misc matches no layer: add it to LAYERS in tools/check_layering.py",
        "core/src/phalanx/trainer_viewer.py:1: phalanx.trainer_viewer matches no layer: add it to LAYERS in "
        "tools/check_layering.py",
    ]


def test_layer_prefixes_match_whole_components_and_the_special_forms() -> None:
    checker = _checker()
    names = {name: index for index, (name, _) in enumerate(checker.LAYERS)}
    assert checker.layer_of("phalanx.trainer") == checker.layer_of("phalanx.trainer.fit_loop") == names["trainer"]
    assert checker.layer_of("phalanx.trainer_view") == names["foundations (torch-free)"]
    assert checker.layer_of("phalanx.utilities.apply_func") == names["helpers"]  # "phalanx.utilities.*"
    assert checker.layer_of("phalanx.utilities") == names["tools and façades"]  # the façade __init__
    assert checker.layer_of("phalanx") == names["tools and façades"]  # "phalanx.__init__": the root only
    assert checker.layer_of("phalanx.misc") is None


def test_private_reaches_across_objects_are_found(tmp_path: Path) -> None:
    loop = (
        "import os\n"  # 1
        "from torch import nn\n"  # 2
        "class Loop:\n"  # 3
        "    def run(self, trainer, module):\n"  # 4
        "        trainer._call_hooks('on_fit_start')\n"  # 5
        "        getattr(trainer, '_x')\n"  # 6
        "        return module._trainer\n"  # 7
        "    def fine(self, batch):\n"  # 8
        "        self._x = super()._y + type(self)._z\n"  # 9
        "        nn._reduction, batch._asdict()\n"  # 10
        "        os._exit(1)\n"  # 11
        "    def reach_through_self(self):\n"  # 12
        "        return self.trainer._strategy\n"  # 13
    )
    root = _tree(
        tmp_path,
        {
            "trainer/loop.py": loop,
            "trainer/trainer.py": "class Trainer:\n    def f(self, module):\n        return module._trainer\n",
        },
    )
    reaches = [p for p in _checker().check(root) if "private attribute" in p]
    assert [p.split(" of another")[0] for p in reaches] == [
        "core/src/phalanx/trainer/loop.py:5: reaches into private attribute '_call_hooks'",
        "core/src/phalanx/trainer/loop.py:6: reaches into private attribute '_x'",
        "core/src/phalanx/trainer/loop.py:7: reaches into private attribute '_trainer'",
        "core/src/phalanx/trainer/loop.py:13: reaches into private attribute '_strategy'",
    ]
    assert reaches[0].endswith("; use a public name (TrainerView, Run, ...)")


def test_the_private_reach_allow_list_has_no_stale_or_phalanx_entries() -> None:
    for path, attribute in _checker().ALLOWED_PRIVATE_REACH:
        source = ROOT / "core" / "src" / path
        assert source.is_file() and attribute in source.read_text(), f"stale entry {(path, attribute)}"
        assert not any(owner in attribute for owner in ("trainer", "module", "strategy", "connector", "hook"))


def test_graph_option_prints_each_module_with_its_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path, {"errors.py": "", "strategies/x.py": "from phalanx import errors\n", "odd.py": ""})
    assert _checker().format_graph(root).splitlines() == [
        "[0] foundations (torch-free)",
        "  phalanx.errors",
        "[5] strategies",
        "  phalanx.strategies.x -> phalanx.errors [0]",
        "[?] matches no layer: add it to LAYERS",
        "  phalanx.odd",
    ]
    assert _checker().main(["--graph"]) == 0
    assert "[7] trainer" in capsys.readouterr().out


def test_a_plugin_class_using_a_private_member_of_its_core_base_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "errors.py": "",
            "strategies/strategy.py": (
                "class Strategy:\n"
                "    _flag = True\n"
                "    def __init__(self):\n        self._module = None\n        self.public = 1\n"
                "    def _helper(self):\n        pass\n"
            ),
            "strategies/parallel.py": (
                "from phalanx.strategies.strategy import Strategy\n"
                "class ParallelStrategy(Strategy):\n    def __init__(self):\n        self._backend = 'gloo'\n"
            ),
        },
    )
    pkg = root / "packages" / "strategy-x" / "src" / "phalanx_strategy_x"
    pkg.mkdir(parents=True)
    (root / "packages" / "strategy-x" / "pyproject.toml").write_text(
        '[project]\nname = "phalanx-strategy-x"\ndependencies = ["phalanx-core"]\n'
    )
    (pkg / "strategy.py").write_text(
        "from phalanx.strategies.parallel import ParallelStrategy\n"
        "class Base(ParallelStrategy):\n"
        "    def run(self):\n        return self._backend, self.public, self._own\n"  # line 4: _backend
        "class X(Base):\n"
        "    def __init__(self):\n        self._own = 1\n"
        "    def go(self):\n        self._helper()\n        return self._module, self._flag\n"  # lines 9-10
        "class Unrelated:\n    def __init__(self):\n        self._module = 'mine'\n"  # not a core subclass
    )
    problems = [p for p in _checker().check(root) if "private member of its core base" in p]
    found = sorted(p.split(": ", 1)[0].rsplit(":", 1)[1] + " " + p.split("uses ")[1].split(",")[0] for p in problems)
    assert found == ["10 '_flag'", "10 '_module'", "4 '_backend'", "9 '_helper'"], problems


def test_a_base_in_another_file_and_a_mixin_are_followed_for_inherited_privates(tmp_path: Path) -> None:
    """A package's subclass of its own base from another file, and a mixin mixed into a core subclass
    (its methods run on the same self), may not use the core class's privates either."""
    root = _tree(
        tmp_path,
        {
            "errors.py": "",
            "strategies/strategy.py": "class Strategy:\n    def __init__(self):\n        self._module = None\n",
        },
    )
    pkg = root / "packages" / "strategy-x" / "src" / "phalanx_strategy_x"
    pkg.mkdir(parents=True)
    (root / "packages" / "strategy-x" / "pyproject.toml").write_text(
        '[project]\nname = "phalanx-strategy-x"\ndependencies = ["phalanx-core"]\n'
    )
    (pkg / "base.py").write_text("from phalanx.strategies.strategy import Strategy\nclass Base(Strategy):\n    pass\n")
    (pkg / "steps.py").write_text("class Steps:\n    def name(self):\n        return type(self._module).__name__\n")
    (pkg / "strategy.py").write_text(
        "from phalanx_strategy_x.base import Base\nfrom phalanx_strategy_x.steps import Steps\n"
        "class X(Steps, Base):\n    def go(self):\n        return self._module\n"  # line 5
        "class Alone:\n    def go(self):\n        return self._module\n"  # no core base: its own business
    )
    problems = [p for p in _checker().check(root) if "private member of its core base" in p]
    found = sorted(p.split(": ", 1)[0].split("/")[-1] + " " + p.split(": ", 1)[1].split(" uses")[0] for p in problems)
    assert found == ["steps.py:3 Steps", "strategy.py:5 X"], problems
