"""Each decision hook of the plugin contract, answered by the core and by a plugin."""

from __future__ import annotations

import pytest
import torch
from plugin_fixtures import SitePackages

from phalanx import discovery
from phalanx.errors import CheckpointError, MisconfigurationError, PluginHookError

TORCHRUN_VARS = {"RANK": "1", "GROUP_RANK": "0", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [*TORCHRUN_VARS, "SLURM_NTASKS", "SLURM_JOB_NAME", "PHALANX_CLUSTER_ENVIRONMENT"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_select_accelerator_builtin_answers_cpu_here() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert discovery.select_accelerator_name() == expected


def test_select_accelerator_plugin_wins(site_packages: SitePackages) -> None:
    source = "from phalanx import hookimpl\n\n@hookimpl\ndef phalanx_select_accelerator():\n    return 'npu'\n"
    site_packages.add("phalanx-fake-npu", module_source=source)
    assert discovery.select_accelerator_name() == "npu"


def test_detect_local_torchelastic_and_slurm(clean_env: pytest.MonkeyPatch) -> None:
    assert type(discovery.detect_cluster_environment()).__name__ == "LocalEnvironment"
    for name, value in TORCHRUN_VARS.items():
        clean_env.setenv(name, value)
    env = discovery.detect_cluster_environment()
    assert type(env).__name__ == "TorchElasticEnvironment" and env.global_rank() == 1
    for name in TORCHRUN_VARS:
        clean_env.delenv(name)
    clean_env.setenv("SLURM_NTASKS", "2")
    clean_env.setenv("SLURM_JOB_NAME", "train")
    assert type(discovery.detect_cluster_environment()).__name__ == "SLURMEnvironment"
    clean_env.setenv("SLURM_JOB_NAME", "bash")  # interactive allocation: phalanx launches itself
    assert type(discovery.detect_cluster_environment()).__name__ == "LocalEnvironment"


def test_plugin_environment_is_detected_by_the_builtin_detector(site_packages: SitePackages, clean_env: pytest.MonkeyPatch) -> None:
    source = """
import os
from phalanx import hookimpl
from phalanx.environments.local import LocalEnvironment

class LabEnvironment(LocalEnvironment):
    @staticmethod
    def detect():
        return os.environ.get("LAB_SCHEDULER") == "1"

@hookimpl
def phalanx_register_cluster_environments(registry):
    registry.register("lab", "phalanx_fake_lab:LabEnvironment", "The lab's scheduler")
"""
    site_packages.add("phalanx-fake-lab", module_source=source)
    assert type(discovery.detect_cluster_environment()).__name__ == "LocalEnvironment"
    clean_env.setenv("LAB_SCHEDULER", "1")
    assert type(discovery.detect_cluster_environment()).__name__ == "LabEnvironment"


def test_convert_plain_checkpoint_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "run.ckpt"
    weights = {"layer.weight": torch.randn(3, 3, dtype=torch.float64), "steps": torch.tensor(4)}
    torch.save({"state_dict": weights, "epoch": 2, "global_step": 40, "optimizer_states": []}, source)
    target = tmp_path / "portable.ckpt"
    discovery.convert_checkpoint(str(source), str(target))
    portable = torch.load(target, weights_only=True)
    assert torch.equal(portable["state_dict"]["layer.weight"], weights["layer.weight"].float())
    assert portable["state_dict"]["layer.weight"].dtype == torch.float32
    assert portable["state_dict"]["steps"].dtype == torch.int64
    assert portable["epoch"] == 2 and portable["global_step"] == 40 and "optimizer_states" not in portable


def test_convert_rejects_unknown_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MisconfigurationError, match="No installed plugin recognises"):
        discovery.convert_checkpoint(str(tmp_path / "missing"), str(tmp_path / "out.ckpt"))
    not_phalanx = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(1)}, not_phalanx)
    with pytest.raises(CheckpointError, match="no 'state_dict' key"):
        discovery.convert_checkpoint(str(not_phalanx), str(tmp_path / "out.ckpt"))


def test_wrapper_hookimpl_sees_and_replaces_the_decision(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl(wrapper=True)
def phalanx_select_strategy(num_devices):
    chosen = yield  # what the other plugins decided
    return "vendor_ddp" if chosen == "ddp" else chosen
"""
    site_packages.add("phalanx-fake-wrapper", module_source=source)
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=2, num_nodes=1, interactive=False) == "vendor_ddp"
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=1, num_nodes=1, interactive=False) == "single_device"
    assert discovery.select_strategy_name(accelerator="cpu", num_devices=2, num_nodes=1, interactive=True) == "ddp_notebook"


def test_old_style_hookwrapper_can_force_the_decision(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl(hookwrapper=True)
def phalanx_select_accelerator():
    outcome = yield
    if outcome.get_result() == "cpu":
        outcome.force_result("npu")
"""
    site_packages.add("phalanx-fake-oldwrap", module_source=source)
    assert discovery.select_accelerator_name() == ("cuda" if torch.cuda.is_available() else "npu")


RAISES = """
from phalanx import hookimpl

def _look_up(num_devices):
    return {{}}[num_devices]  # the error is raised in a helper the hook calls

@hookimpl(tryfirst=True)
def phalanx_select_strategy(num_devices):
    return _look_up(num_devices)
"""

PASS_THROUGH_WRAPPER = """
from phalanx import hookimpl

@hookimpl(wrapper=True)
def phalanx_select_strategy():
    return (yield)
"""


def test_raise_under_a_wrapper_names_the_plugin_that_raised(site_packages: SitePackages) -> None:
    site_packages.add("phalanx-fake-wraps", module_source=PASS_THROUGH_WRAPPER)
    site_packages.add("phalanx-fake-raises", module_source=RAISES.format())
    with pytest.raises(PluginHookError) as info:
        discovery.select_strategy_name(accelerator="cpu", num_devices=3, num_nodes=1, interactive=False)
    text = str(info.value)
    assert "Plugin 'phalanx-fake-raises' failed in phalanx_select_strategy(" in text
    assert "KeyError: 3" in text and "PHALANX_DISABLE_PLUGINS=phalanx-fake-raises" in text
    assert "phalanx-fake-wraps" not in text
    assert isinstance(info.value.__cause__, KeyError)


def test_a_wrapper_that_raises_is_named_itself(site_packages: SitePackages) -> None:
    source = """
from phalanx import hookimpl

@hookimpl(wrapper=True)
def phalanx_detect_cluster_environment():
    found = yield
    raise RuntimeError(f"refusing {found}")
"""
    site_packages.add("phalanx-fake-badwrap", module_source=source)
    with pytest.raises(PluginHookError, match=r"Plugin 'phalanx-fake-badwrap' failed in phalanx_detect_cluster_environment\(\): RuntimeError: refusing"):
        discovery.detect_cluster_environment()
    assert discovery.select_accelerator_name() in {"cpu", "cuda"}  # other hooks keep working
