"""DDP options and hooks, checked inside real 2-rank runs (scripts/features.py forks them all).

Final weights are compared with plain PyTorch computed here: the same model and per-rank batches,
each rank's gradients computed separately and averaged the way DDP's all-reduce does (each divided
by the world size, then summed), so the comparison is exact.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from ddp_helpers import SCRIPTS, load_json, start_job
from torch.utils.data import DataLoader, DistributedSampler

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


def _scripts_common() -> Any:
    """The scripts' model and data (loaded under a unique name: other packages have a common.py)."""
    spec = importlib.util.spec_from_file_location("ddp_scripts_common", SCRIPTS / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMMON = _scripts_common()


def _tensors(state: dict[str, list[float]], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(state[k]).reshape(like[k].shape) for k in like}


def plain_two_rank_fit(
    initial: dict[str, list[float]], *, accumulate: int = 1, fp16_compress: bool = False
) -> dict[str, torch.Tensor]:
    """One epoch of 2-rank DDP with Adam, by hand in this process; returns the final ``net.*`` weights."""
    net = COMMON.build_layers()
    template = {f"net.{k}": v for k, v in net.state_dict().items()}
    net.load_state_dict({k.removeprefix("net."): v for k, v in _tensors(initial, template).items()})
    optimizer = torch.optim.Adam(net.parameters(), lr=COMMON.LR)
    params = list(net.parameters())
    samplers = [DistributedSampler(COMMON.dataset(), num_replicas=2, rank=r, shuffle=True, seed=0) for r in (0, 1)]
    loaders = [DataLoader(COMMON.dataset(), batch_size=COMMON.BATCH_SIZE, sampler=sampler) for sampler in samplers]
    local = [[torch.zeros_like(p) for p in params] for _ in (0, 1)]
    for index, batches in enumerate(zip(*loaders)):
        for rank, (x, y) in enumerate(batches):
            loss = torch.nn.functional.mse_loss(net(x), y)
            grads = torch.autograd.grad(loss / accumulate if accumulate > 1 else loss, params)
            local[rank] = [a + g for a, g in zip(local[rank], grads)]
        if (index + 1) % accumulate:
            continue
        for p, g0, g1 in zip(params, *local):
            if fp16_compress:  # fp16_compress_wrapper: cast, divide and sum in float16, cast back
                p.grad = (g0.half() / 2 + g1.half() / 2).float()
            else:
                p.grad = g0 / 2 + g1 / 2
        optimizer.step()
        optimizer.zero_grad()
        local = [[torch.zeros_like(p) for p in params] for _ in (0, 1)]
    return {f"net.{k}": v for k, v in net.state_dict().items()}


def _assert_weights(facts: dict[str, Any], expected: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    got = _tensors(facts["final"], expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, atol=atol, rtol=0, msg=lambda m, k=key: f"{k}: {m}")


def test_find_unused_parameters_variant_trains_a_model_with_unused_layers(out: Path) -> None:
    ranks = _ranks(out, "unused")
    expected = plain_two_rank_fit(ranks[0]["initial"])
    for facts in ranks:
        assert facts["is_ddp"] and facts["find_unused_parameters"] is True
        _assert_weights(facts, expected, atol=1e-6)
        for key in ("unused.weight", "unused.bias"):  # no gradient ever reached it: untouched
            assert facts["final"][key] == ranks[0]["initial"][key]


def test_ddp_kwargs_backend_and_timeout_reach_ddp_and_the_process_group(out: Path) -> None:
    ranks = _ranks(out, "base")
    for facts in ranks:
        assert facts["static_graph"] is True
        assert facts["gradient_as_bucket_view"] is True
        assert facts["backend"] == "gloo"
        assert facts["pg_timeout_s"] == 77
        _assert_weights(facts, plain_two_rank_fit(ranks[0]["initial"]), atol=1e-6)
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_comm_hook_runs_once_per_optimizer_step_with_no_sync_accumulation(out: Path) -> None:
    # 48 samples / 2 ranks / batch 4 = 6 batches per rank; accumulate_grad_batches=2 -> 3 syncs.
    ranks = _ranks(out, "hook")
    assert [facts["calls"] for facts in ranks] == [3, 3]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    _assert_weights(ranks[0], plain_two_rank_fit(ranks[0]["initial"], accumulate=2), atol=1e-6)


def test_register_ddp_comm_hook_before_setup(out: Path) -> None:
    ranks = _ranks(out, "registered_hook")
    assert [facts["calls"] for facts in ranks] == [6, 6]
    _assert_weights(ranks[0], plain_two_rank_fit(ranks[0]["initial"]), atol=1e-6)


def test_comm_wrapper_compresses_the_hooks_all_reduce_to_fp16(out: Path) -> None:
    """ddp_comm_hook=allreduce_hook wrapped by fp16_compress_wrapper: fp16 gradient averages."""
    ranks = _ranks(out, "compressed")
    assert ranks[0]["weights"] == ranks[1]["weights"]
    compressed = plain_two_rank_fit(ranks[0]["initial"], fp16_compress=True)
    _assert_weights(ranks[0], compressed, atol=1e-6)
    # ... and the compression is visible: fp32 averages give other weights.
    full = plain_two_rank_fit(ranks[0]["initial"])
    assert max(float((compressed[k] - full[k]).abs().max()) for k in full) > 1e-5


def test_cpu_cores_are_shared_between_local_processes_without_omp_num_threads(out: Path) -> None:
    cores = load_json(out / "main.json")["cores"]
    for facts in _ranks(out, "threads"):
        assert facts["threads"] == max(1, cores // 2)
    for facts in _ranks(out, "base"):  # OMP_NUM_THREADS=1 (set by the test) is respected
        assert facts["threads"] == 1


def test_evaluation_broadcasts_rank_zeros_weights(out: Path) -> None:
    """Rank 1 built other weights in configure_model; validate runs rank 0's model on both ranks."""
    main = load_json(out / "main.json")
    net = COMMON.build_layers()
    template = {f"net.{k}": v for k, v in net.state_dict().items()}
    expected = _tensors(main["eval_state"], template)
    for rank in (0, 1):
        got = _tensors(load_json(out / f"eval.rank{rank}.json")["state"], template)
        assert all(torch.equal(got[k], expected[k]) for k in expected), f"rank {rank} evaluated other weights"
    net.load_state_dict({k.removeprefix("net."): v for k, v in expected.items()})
    x, y = COMMON.dataset().tensors
    with torch.no_grad():
        plain = float(torch.nn.functional.mse_loss(net(x), y))  # every sample once, equal batch sizes
    assert main["eval"][0]["val_loss"] == pytest.approx(plain, abs=1e-6)


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
        # block_backward_sync keeps each rank's gradient local; outside it DDP averages them.
        assert facts["no_sync_ranks_differ"] and facts["no_sync_is_local"]
        assert facts["synced_ranks_equal"] and facts["synced_is_mean"]


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
