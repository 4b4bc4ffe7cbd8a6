"""2-rank training gives the plain torchrun DDP loop's weights, bit for bit, however it launches.

One module-scoped fixture starts every run at once (they are independent jobs, and starting
them together keeps the suite short): the plain loop and phalanx's ``ddp`` under ``torchrun
--nnodes 2`` (two agents on this machine), phalanx's own launcher as two "nodes" of one process,
and ``ddp`` / ``ddp_spawn`` / ``ddp_fork`` with two devices on one node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ddp_helpers import SCRIPTS, load_json, start_job

from phalanx.environments.local import find_free_port
from phalanx.testing.processes import Job

pytestmark = pytest.mark.timeout(400)

_RUNS = {
    "ddp": ["ddp", "2", "1"],
    "ddp_spawn": ["ddp_spawn", "2", "1"],
    "ddp_fork": ["ddp_fork", "2", "1"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("parity")
    jobs: dict[str, Job] = {}
    dirs: dict[str, Path] = {}
    torchrun_port, nodes_port = find_free_port(), find_free_port()
    dirs["torchrun"] = tmp / "torchrun"
    dirs["nodes"] = tmp / "nodes"
    for name in _RUNS:
        dirs[name] = tmp / name
    for directory in dirs.values():
        directory.mkdir()
    for node in (0, 1):
        jobs[f"torchrun{node}"] = start_job(
            tmp, f"torchrun{node}",
            "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
            "--master-addr", "127.0.0.1", "--master-port", str(torchrun_port),
            str(SCRIPTS / "plain_torchrun.py"), str(dirs["torchrun"]), "2", "1",
        )  # fmt: skip
        jobs[f"nodes{node}"] = start_job(
            tmp, f"nodes{node}", "fit.py", "ddp", str(dirs["nodes"]), "1", "2",
            env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(nodes_port), "NODE_RANK": str(node)},
        )  # fmt: skip
    for name, args in _RUNS.items():
        jobs[name] = start_job(tmp, name, "fit.py", args[0], str(dirs[name]), *args[1:])
    failures = []
    for name, job in jobs.items():
        try:
            code = job.wait(360)
        except TimeoutError as err:
            failures.append(f"{name}: {err}")
            continue
        if code != 0:
            failures.append(f"{name} exited {code}\n{job.output()}")
    for job in jobs.values():
        assert not job.leftovers()
    assert not failures, "\n".join(failures)
    return dirs


def _weights(result: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v) for k, v in result["state"].items()}


def _plain_val_loss(weights: dict[str, torch.Tensor]) -> float:
    """The validation loss of ``weights`` in plain torch: MSE over every sample of the scripts' data.

    Validation shards the 48 samples into 2 x 6 equal batches; the mean of the batch means is then
    the mean over all samples.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("ddp_scripts_common", SCRIPTS / "common.py")
    assert spec is not None and spec.loader is not None
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    net = common.build_layers()
    shapes = {k: v.shape for k, v in net.state_dict().items()}
    net.load_state_dict({k.removeprefix("net."): v.reshape(shapes[k.removeprefix("net.")]) for k, v in weights.items()})
    x, y = common.dataset().tensors
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(net(x), y))


def _assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=1e-6, rtol=0)
        assert torch.equal(actual[key], expected[key]), f"{key} differs in the last bits"


@pytest.fixture(scope="module")
def reference(runs: dict[str, Path]) -> dict[str, torch.Tensor]:
    ranks = [_weights(load_json(runs["torchrun"] / f"reference{r}.json")) for r in (0, 1)]
    _assert_same(ranks[1], ranks[0])
    return ranks[0]


def test_torchrun_two_nodes_launches_nothing_and_matches_plain_loop(
    runs: dict[str, Path], reference: dict[str, torch.Tensor]
) -> None:
    for rank in (0, 1):
        result = load_json(runs["torchrun"] / f"rank{rank}.json")
        assert result["env"] == "TorchElasticEnvironment"
        assert result["children"] == 0
        assert result["users_group_kept"]  # the script's own process group was used and left open
        assert (result["global_rank"], result["world_size"]) == (rank, 2)
        assert result["validate"][0]["val_loss"] == pytest.approx(_plain_val_loss(reference), abs=1e-6)
        _assert_same(_weights(result), reference)


def test_phalanx_launcher_two_nodes_matches_plain_loop(
    runs: dict[str, Path], reference: dict[str, torch.Tensor]
) -> None:
    results = [load_json(runs["nodes"] / f"rank{rank}.json") for rank in (0, 1)]
    assert {r["global_rank"] for r in results} == {0, 1}
    assert all(r["world_size"] == 2 and r["env"] == "LocalEnvironment" for r in results)
    for result in results:
        _assert_same(_weights(result), reference)


def test_ddp_reruns_script_and_matches_plain_loop(runs: dict[str, Path], reference: dict[str, torch.Tensor]) -> None:
    results = [load_json(runs["ddp"] / f"rank{rank}.json") for rank in (0, 1)]
    assert results[0]["pid"] != results[1]["pid"]
    assert results[0]["launcher"] == "SubprocessScriptLauncher"
    for result in results:
        assert result["direct_step"]  # the loop's direct step, through the DDP wrapper: still bit-identical
        _assert_same(_weights(result), reference)
        # validate ran afterwards in the same processes, on a fresh process group
        assert result["validate"] == results[0]["validate"]
        assert result["validate"][0]["val_loss"] == pytest.approx(_plain_val_loss(reference), abs=1e-6)
        assert result["callback_metrics"]["val_loss"] == pytest.approx(results[0]["validate"][0]["val_loss"])


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_worker_strategies_match_plain_loop_and_bring_results_home(
    runs: dict[str, Path], reference: dict[str, torch.Tensor], strategy: str
) -> None:
    main = load_json(runs[strategy] / "main.json")
    assert main["launcher"] == "MultiProcessingLauncher"
    _assert_same(_weights(main), reference)  # the weights the main process got back
    # Beyond Lightning: metrics and the checkpoint callback's paths come back too.
    assert "train_loss" in main["callback_metrics"]
    best = Path(main["best_model_path"])
    assert best.is_file() and runs[strategy] in best.parents
    if strategy == "ddp_fork":  # validate's return value came back from rank 0
        assert main["validate"][0]["val_loss"] == pytest.approx(_plain_val_loss(reference), abs=1e-6)
