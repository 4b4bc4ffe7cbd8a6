"""Install hints: every name an in-repo package registers maps to that package's distribution.

The table in ``phalanx._hints`` is written by hand (the core imports no plugin), so it can drift
from what the packages register: ``hsdp`` once had no hint, ``model_parallel`` before it (issue
27). This test runs each package's own registration hooks from its source file, against a plain
Registry, so a name added to a package without a hint fails here, whether or not the package is
installed in this session.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

from phalanx import Trainer
from phalanx._hints import install_hint, providing_distribution
from phalanx._metadata import version
from phalanx.errors import UnknownNameError
from phalanx.registry import Registry

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
#: Each packages/* folder by the distribution it builds (phalanx-strategy-ddp, phalanx-ray, ...).
FOLDERS = {
    tomllib.loads((p / "pyproject.toml").read_text())["project"]["name"]: p.name
    for p in PACKAGES.iterdir()
    if (p / "pyproject.toml").is_file()
}


def _registrations() -> list[tuple[str, str, str, str]]:
    """``(distribution, hook, name, target)`` for everything each packages/* plugin registers."""
    found = []
    for folder in sorted(p for p in PACKAGES.iterdir() if (p / "pyproject.toml").is_file()):
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        for entry_point, module in project["entry-points"]["phalanx"].items():
            path = folder / "src" / (module.replace(".", "/") + ".py")
            spec = importlib.util.spec_from_file_location(f"_hints_probe_{entry_point}", path)
            assert spec is not None and spec.loader is not None, path
            plugin = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(plugin)  # a _plugin.py imports no torch and no plugin library
            for hook in sorted(n for n in dir(plugin) if n.startswith("phalanx_register_")):
                registry = Registry(hook.removeprefix("phalanx_register_"))
                getattr(plugin, hook)(registry)
                found += [(project["name"], hook, e.name, e.target_path) for e in registry.entries()]
    return found


REGISTRATIONS = _registrations()


def test_the_packages_register_what_this_test_expects() -> None:
    """Guards the probe itself: an empty scan would make the mapping test pass vacuously."""
    distributions = {distribution for distribution, *_ in REGISTRATIONS}
    assert distributions == set(FOLDERS)
    names = {name for _, _, name, _ in REGISTRATIONS}
    assert {"ddp", "fsdp", "hsdp", "deepspeed_stage_3", "model_parallel", "xla_fsdp", "tpu"} <= names


@pytest.mark.parametrize(("distribution", "hook", "name", "target"), REGISTRATIONS, ids=lambda v: str(v))
def test_every_registered_name_hints_its_distribution(distribution: str, hook: str, name: str, target: str) -> None:
    assert providing_distribution(name) == distribution, f"{hook} registers {name!r}; add it to phalanx._hints"
    folder = FOLDERS[distribution]
    assert (
        install_hint(distribution) == f"pip install {distribution} (from a checkout: pip install ./packages/{folder})"
    )


@pytest.mark.parametrize(
    "target", sorted({t for _, hook, _, t in REGISTRATIONS if hook == "phalanx_register_strategies"})
)
def test_every_strategy_class_hints_its_distribution(target: str) -> None:
    """``from phalanx.strategies import ModelParallelStrategy`` names the package when it is missing."""
    distribution = next(d for d, _, _, t in REGISTRATIONS if t == target)
    assert providing_distribution(target.rpartition(":")[2]) == distribution


def test_trainer_names_the_model_parallel_package_when_it_is_missing() -> None:
    """What the newcomer typed (issue 27): the error says which package to install, and how."""
    if version("phalanx-strategy-model-parallel") is not None:
        pytest.skip("phalanx-strategy-model-parallel is installed here (the tests-core session has no plugins)")
    with pytest.raises(UnknownNameError) as raised:
        Trainer(strategy="model_parallel", logger=False)
    message = str(raised.value)
    assert "provided by phalanx-strategy-model-parallel, which is not installed" in message, message
    assert "pip install phalanx-strategy-model-parallel" in message and "./packages/strategy-model-parallel" in message
