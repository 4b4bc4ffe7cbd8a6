"""The ``ray`` cluster environment: the conformance kit, detection through the hook, the errors.

No Ray cluster here: a Ray Train worker is recognised by the variables Ray sets in it, so these
tests give a process exactly those variables (the runs on a real cluster are in
test_ray_cluster.py, which check the same detection inside real workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import ClassVar

import pytest

from phalanx.discovery import detect_cluster_environment
from phalanx.errors import MisconfigurationError
from phalanx.testing import ClusterEnvironmentConformance
from phalanx_ray.environment import RayEnvironment

#: What Ray Train sets in worker 5 of 8 (4 per node, so on the second node), plus the raylet's marker.
WORKER = {
    "RAY_JOB_ID": "02000000",
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "NODE_RANK": "1",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "29512",
}


class TestRayEnvironmentConformance(ClusterEnvironmentConformance):
    cluster_environment = "ray"
    job_environment: ClassVar[dict[str, str]] = WORKER
    expected: ClassVar[dict[str, object]] = {
        "global_rank": 5, "world_size": 8, "local_rank": 1, "node_rank": 1, "main_address": "10.0.0.7", "main_port": 29512,
    }  # fmt: skip
    allocation = (4, 2)


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process looks like a Ray Train worker (the variables are restored after the test)."""
    for name, value in WORKER.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_detected_through_the_hook_even_inside_a_slurm_allocation(worker_env: pytest.MonkeyPatch) -> None:
    """A Ray cluster started in an sbatch job hands SLURM's variables to its workers: Ray still wins."""
    worker_env.setenv("SLURM_NTASKS", "2")
    worker_env.setenv("SLURM_JOB_NAME", "train")
    assert isinstance(detect_cluster_environment(), RayEnvironment)
    worker_env.setenv("PHALANX_CLUSTER_ENVIRONMENT", "slurm")  # the user's explicit choice wins
    assert type(detect_cluster_environment()).__name__ == "SLURMEnvironment"


@pytest.mark.parametrize(
    ("change", "detected"),
    [
        ({"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "1"}, "TorchElasticEnvironment"),  # torchrun inside a Ray task
        ({"RANK": None, "LOCAL_WORLD_SIZE": None}, "LocalEnvironment"),  # a child of phalanx's own launcher
        ({"RAY_JOB_ID": None}, "LocalEnvironment"),  # torchrun-style variables set by hand, no Ray
    ],
)
def test_not_detected_for_other_launchers(
    worker_env: pytest.MonkeyPatch, change: dict[str, str | None], detected: str
) -> None:
    for name, value in change.items():
        if value is None:
            worker_env.delenv(name)
        else:
            worker_env.setenv(name, value)
    assert type(detect_cluster_environment()).__name__ == detected


def test_world_size_mismatch_names_both_numbers_and_the_fix(worker_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(MisconfigurationError) as caught:
        RayEnvironment().validate_settings(num_devices=2, num_nodes=2)
    assert str(caught.value) == (
        "Trainer(devices=2, num_nodes=2) asks for 4 processes, but Ray Train started 8 workers "
        "(ScalingConfig(num_workers=8); 4 of them on this node). Each Ray Train worker is one phalanx process. "
        "Fix: pass devices=4 (workers per node) and num_nodes=2 (nodes) so that devices x num_nodes = 8, or change "
        "ScalingConfig(num_workers=4)."
    )


def test_more_workers_on_a_node_than_devices_is_refused(worker_env: pytest.MonkeyPatch) -> None:
    """8 workers as 6 + 2 on two nodes: devices=4 x 2 nodes matches the world, not this node."""
    worker_env.setenv("LOCAL_WORLD_SIZE", "6")
    with pytest.raises(MisconfigurationError, match=r"Ray Train placed 6 of its 8 workers on this node"):
        RayEnvironment().validate_settings(num_devices=4, num_nodes=2)


def test_missing_rendezvous_address_says_how_to_get_one(worker_env: pytest.MonkeyPatch) -> None:
    worker_env.delenv("MASTER_ADDR")
    with pytest.raises(
        MisconfigurationError, match=r"Ray Train did not set MASTER_ADDR .*TorchConfig\(init_method='env'\)"
    ):
        _ = RayEnvironment().main_address


def test_plugin_module_imports_neither_torch_nor_ray() -> None:
    code = "import sys, phalanx_ray, phalanx_ray._plugin, phalanx_ray.environment; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.strip() == "[]", result.stderr


def _site_without_ray(folder: Path) -> Path:
    """A site folder with every installed distribution of this interpreter except Ray (symlinks)."""
    site = folder / "site"
    site.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        if entry.name == "ray" or (entry.name.startswith("ray-") and entry.name.endswith(".dist-info")):
            continue
        (site / entry.name).symlink_to(entry)
    return site


@pytest.mark.timeout(120)
def test_without_ray_both_names_are_unavailable_with_the_install_line(tmp_path: Path) -> None:
    """A real interpreter where Ray is not installed (its site folder without Ray), not a mock."""
    site = _site_without_ray(tmp_path)
    code = (
        f"import site; site.addsitedir({str(site)!r})\n"
        "import json, importlib.util\n"
        "from phalanx.registry import CallbackRegistry, ClusterEnvironmentRegistry\n"
        "from phalanx.discovery import detect_cluster_environment\n"
        "import phalanx_ray\n"
        "try:\n"
        "    phalanx_ray.fit(dict, num_workers=2)\n"
        "    fit_error = None\n"
        "except ImportError as error:\n"
        "    fit_error = str(error)\n"
        "print(json.dumps({'ray_importable': importlib.util.find_spec('ray') is not None,\n"
        "    'environment': ClusterEnvironmentRegistry.entry('ray').unavailable_reason(),\n"
        "    'callback': CallbackRegistry.entry('ray_train_report').unavailable_reason(),\n"
        "    'detected': type(detect_cluster_environment()).__name__, 'fit': fit_error}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | WORKER  # looks like a worker, has no Ray
    result = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=90, check=False, env=env
    )
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["ray_importable"] is False
    install = "requires ray[train]>=2.60, which is not installed; fix: pip install 'ray[train]>=2.60'"
    assert found["environment"] == install and found["callback"] == install
    assert found["detected"] == "LocalEnvironment"  # an unavailable environment is never chosen
    assert "Fix: pip install 'ray[train]>=2.60'" in found["fit"]
