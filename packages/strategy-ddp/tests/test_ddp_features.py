"""DDP options and hooks, checked inside real 2-rank runs (scripts/features.py forks them all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ddp_helpers import load_json, start_job

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("features")
    job = start_job(directory, "features", "features.py", str(directory))
    code = job.wait(280)
    assert code == 0, job.output()
    assert not job.leftovers()
    return directory


def _ranks(out: Path, scenario: str) -> list[dict[str, Any]]:
    return [load_json(out / f"{scenario}.rank{rank}.json") for rank in (0, 1)]


def test_find_unused_parameters_variant_trains_a_model_with_unused_layers(out: Path) -> None:
    for facts in _ranks(out, "unused"):
        assert facts["is_ddp"] and facts["find_unused_parameters"] is True


def test_ddp_kwargs_backend_and_timeout_reach_ddp_and_the_process_group(out: Path) -> None:
    ranks = _ranks(out, "base")
    for facts in ranks:
        assert facts["static_graph"] is True
        assert facts["gradient_as_bucket_view"] is True
        assert facts["backend"] == "gloo"
        assert facts["pg_timeout_s"] == 77
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_comm_hook_runs_once_per_optimizer_step_with_no_sync_accumulation(out: Path) -> None:
    # 48 samples / 2 ranks / batch 4 = 6 batches per rank; accumulate_grad_batches=2 -> 3 syncs.
    ranks = _ranks(out, "hook")
    assert [facts["calls"] for facts in ranks] == [3, 3]
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_register_ddp_comm_hook_before_setup(out: Path) -> None:
    assert [facts["calls"] for facts in _ranks(out, "registered_hook")] == [6, 6]


def test_custom_strategy_configure_ddp_override(out: Path) -> None:
    for facts in _ranks(out, "custom"):
        assert facts["wrapper"] == "MyCustomDistributedDataParallel"


def test_collectives(out: Path) -> None:
    for rank, facts in enumerate(_ranks(out, "collectives")):
        assert facts["all_gather"] == [[0, 10], [1, 11]]
        assert (facts["sum"], facts["mean"], facts["max"], facts["min"]) == (3.0, 1.5, 2.0, 1.0)
        assert facts["non_tensor"] == "text"
        assert facts["broadcast"] == {"from": 1}
        assert (facts["all_true"], facts["any_true"]) == (False, True)
        assert facts["grad"] == [2.0]  # d(sum of gathered)/dx summed over both ranks' graphs
        assert facts["sampler"] == {"num_replicas": 2, "rank": rank}


def test_unpicklable_module_on_spawn_names_the_attribute_and_suggests_ddp(out: Path) -> None:
    message = load_json(out / "main.json")["unpicklable"]
    assert message.startswith("MisconfigurationError")
    assert "trainer._module.transform" in message or ".transform` (a function)" in message
    assert "strategy='ddp'" in message


def test_sync_batchnorm_on_cpu_is_refused_before_launch(out: Path) -> None:
    message = load_json(out / "main.json")["syncbn"]
    assert "SyncBatchNorm" in message and "accelerator='cuda'" in message


def test_interactive_session_with_several_devices_picks_ddp_notebook(out: Path) -> None:
    assert load_json(out / "main.json")["auto_interactive"] == ["DDPStrategy", "fork"]
