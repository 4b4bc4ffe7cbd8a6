"""Expert parallel (MoE): EP meshes train exactly like one process; DCP checkpoints reshard between EP sizes.

Two jobs: 2 ranks (EP 2 trains an epoch and saves a DCP checkpoint; EP 1 resumes from it for a
second epoch and saves; EP 2 with StackedExperts; three refused setups), then 4 ranks (dp 4 x ep 2
trains an epoch; then resumes from the EP 1 checkpoint for a third; ep 2 with tp 2, with HSDP and
with cp 2). Every per-step loss (the mean over data (x context) parallel ranks of task +
load-balancing loss) and the final weights are compared with one process training the same MoE
network on the global batches, computed in the test; the gradients are clipped
(``clip_grad_norm_`` against torch's on one process) and their per-step norms compared too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from moe_common import DIM, EXPERTS, MoENet, single_process
from mp_testing import read_ranks, run_script
from torch import nn

from phalanx.errors import MisconfigurationError

pytestmark = pytest.mark.timeout(300)

ATOL = 1e-5


@pytest.fixture(scope="module")
def moe_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks: EP 2 (1 epoch, saves ck_ep2); EP 1 resumes ck_ep2 (epoch 2, saves ck_ep1); bad models."""
    out = tmp_path_factory.mktemp("moe")
    common = {"devices": 2, "dp": 2}
    runs = [
        {**common, "tag": "ep2", "ep": 2, "save": "ck_ep2"},
        {**common, "tag": "stacked_ep2", "ep": 2, "model": "stacked"},
        {**common, "tag": "ep1", "ep": 1, "epochs": 2, "resume": "ck_ep2", "save": "ck_ep1"},
        {**common, "tag": "three", "ep": 2, "model": "three", "expect_error": True},
        {**common, "tag": "noep", "ep": 2, "model": "noep", "expect_error": True},
        {**common, "tag": "clip", "ep": 2, "clip": 1.0, "expect_error": True},
    ]
    run_script("train_moe.py", str(out), json.dumps(runs))
    return out


@pytest.fixture(scope="module")
def moe_4(moe_2: Path) -> Path:
    """4 ranks, dp 4 x ep 2: one epoch from scratch; epoch 3 resumed from the EP 1 checkpoint; ep 2 with
    tp 2, with HSDP (2 replicas x 2 shards) and with cp 2, one epoch each."""
    common = {"devices": 4, "dp": 4, "ep": 2}
    runs = [
        {**common, "tag": "d4e2"},
        {**common, "tag": "r4e2", "epochs": 3, "resume": "ck_ep1"},
        {**common, "tag": "tp2ep2", "dp": 2, "tp": 2},
        {**common, "tag": "hsdp_ep2", "rep": 2, "dp": 2},
        {**common, "tag": "cp2ep2", "dp": 2, "cp": 2},
    ]
    run_script("train_moe.py", str(moe_2), json.dumps(runs), timeout=280)
    return moe_2


def _check(
    out: Path, tag: str, world: int, epochs: int, first_step: int = 0, stacked: bool = False
) -> list[dict[str, object]]:
    """Every rank's global losses equal one process's from ``first_step`` on; rank 0's weights equal its final ones."""
    losses, norms, weights = single_process(epochs, stacked=stacked)
    results = read_ranks(out, tag, world)
    for result in results:
        assert result["global_step"] == len(losses)
        for key, expected in (("global_losses", losses), ("grad_norms", norms)):
            got = result[key]
            assert len(got) == len(losses) - first_step and got, (tag, key, len(got))
            worst = max(abs(a - b) for a, b in zip(got, expected[first_step:]))
            assert worst <= ATOL, f"{tag}: {key} differ from one process by {worst:.3g}"
    gathered = torch.load(out / f"{tag}_weights.pt", weights_only=True)
    assert set(gathered) == {f"net.{k}" for k in weights}
    worst = max(float((gathered[f"net.{k}"] - v).abs().max()) for k, v in weights.items())
    assert worst <= ATOL, f"{tag}: final weights differ from one process by {worst:.3g}"
    return results


def test_expert_parallel_2_matches_one_process(moe_2: Path) -> None:
    results = _check(moe_2, "ep2", 2, epochs=1)
    for result in results:  # each rank holds half of the experts, and reads its own data
        assert result["expert_mesh"] == ["expert_data_parallel", "expert_parallel"]
        assert result["local_experts"] == EXPERTS // 2
    assert [r["coords"]["expert_parallel"] for r in results] == [0, 1]
    assert results[0]["losses"] != results[1]["losses"]


def test_stacked_module_list_experts_under_expert_parallel_2_match_one_process(moe_2: Path) -> None:
    """The nn.ModuleList recipe: StackedExperts of FFN modules, sharded by ExpertParallel, trains like one process."""
    for result in _check(moe_2, "stacked_ep2", 2, epochs=1, stacked=True):
        assert result["local_experts"] == EXPERTS // 2


def test_data_parallel_4_times_expert_parallel_2_matches_one_process(moe_4: Path) -> None:
    results = _check(moe_4, "d4e2", 4, epochs=1)
    coords = [(r["coords"]["expert_data_parallel"], r["coords"]["expert_parallel"]) for r in results]
    assert coords == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for result in results:  # 2 experts per ep rank, FSDP-sharded over the 2 ranks holding the same ones
        assert result["local_experts"] == EXPERTS // 4
    assert len({tuple(r["losses"]) for r in results}) == 4  # data differs over all four dp ranks


@pytest.mark.parametrize(
    ("tag", "local_experts"),
    [("tp2ep2", EXPERTS // 2), ("hsdp_ep2", EXPERTS // 2), ("cp2ep2", EXPERTS // 4)],
)
def test_expert_parallel_composes_with_tensor_hybrid_and_context_parallel(
    moe_4: Path, tag: str, local_experts: int
) -> None:
    """Experts replicated over tp ranks, over HSDP replicas, FSDP-sharded over the cp ranks of their dp rank."""
    for result in _check(moe_4, tag, 4, epochs=1):
        assert result["local_experts"] == local_experts, result


def test_checkpoint_reshards_from_expert_parallel_2_to_1_and_back(moe_4: Path, tmp_path: Path) -> None:
    """EP 1 continues the EP 2 run from its checkpoint, and dp 4 x EP 2 continues the EP 1 run, exactly;
    ``phalanx checkpoint convert`` gathers the EP 2 experts into whole ``[E, ...]`` tensors."""
    assert sorted(p.name for p in (moe_4 / "ck_ep2").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    ]
    for result in _check(moe_4, "ep1", 2, epochs=2, first_step=4):
        assert result["expert_mesh"] == ["data_parallel"] and result["local_experts"] == EXPERTS // 2
    _check(moe_4, "r4e2", 4, epochs=3, first_step=8)
    from phalanx.cli import main

    assert main(["checkpoint", "convert", str(moe_4 / "ck_ep2"), str(tmp_path / "portable.pt")]) == 0
    portable = torch.load(tmp_path / "portable.pt", weights_only=True)["state_dict"]
    for key, value in single_process(1)[2].items():
        torch.testing.assert_close(portable[f"net.{key}"], value, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("tag", "fragments"),
    [
        ("three", ["expert_parallel_size=2 does not divide the 3 experts", "values: [1, 3]", "Fix:"]),
        ("noep", ["no parameter of NoExpertParallel is sharded over device_mesh['expert_parallel']", "Fix:"]),
        ("clip", ["Trainer(gradient_clip_val=1.0) with expert_parallel_size=2", "clip_grad_norm_(self.parameters()"]),
    ],
)
def test_bad_models_are_refused_on_every_rank(moe_2: Path, tag: str, fragments: list[str]) -> None:
    for result in read_ranks(moe_2, tag, 2):
        assert result["error"].startswith("MisconfigurationError"), result["error"]
        for fragment in fragments:
            assert fragment in result["error"], result["error"]


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        (
            {"data_parallel_size": 4, "expert_parallel_size": 3},
            ["expert_parallel_size=3) must divide data_parallel_size=4", "[1, 2, 4]", "Fix:"],
        ),
        (
            {"data_parallel_replicate_size": 2, "data_parallel_shard_size": 2, "expert_parallel_size": 4},
            ["expert_parallel_size=4) must divide data_parallel_shard_size=2", "[1, 2]", "Fix:"],
        ),
        (
            {"data_parallel_size": 4, "expert_parallel_size": 0},
            ["expert_parallel_size=0) is invalid: pass a positive int"],
        ),
    ],
)
def test_bad_expert_parallel_size_fails_in_the_trainer_before_launch(
    kwargs: dict[str, object], fragments: list[str], tmp_path: Path
) -> None:
    import phalanx
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    with pytest.raises(MisconfigurationError) as info:
        strategy = ModelParallelStrategy(tensor_parallel_size=1, **kwargs)  # type: ignore[arg-type]
        trainer = phalanx.Trainer(
            accelerator="cpu", devices=4, strategy=strategy, logger=False, default_root_dir=tmp_path
        )
        trainer.fit(phalanx.Module())
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_layout_borrows_expert_parallel_ranks_from_data_parallel() -> None:
    from phalanx_strategy_model_parallel._layout import resolve_layout

    plain = resolve_layout(4, 1, 1, num_nodes=1, num_processes=4, expert_parallel_size=2)
    assert plain.dim_names == ("expert_data_parallel", "expert_parallel", "tensor_parallel")
    assert plain.shape == (2, 2, 1) and plain.world_size == 4 and plain.data_parallel == 4
    assert dict(plain.flattened) == {"data_parallel": ("expert_data_parallel", "expert_parallel")}
    assert plain.fsdp_dims == ("data_parallel",) and plain.expert_fsdp_dims == ("expert_data_parallel",)
    assert [plain.coordinates(r)["data_parallel"] for r in range(4)] == [0, 1, 2, 3]

    hsdp_cp = resolve_layout(
        "auto",
        1,
        1,
        num_nodes=1,
        num_processes=16,
        data_parallel_replicate_size=2,
        expert_parallel_size=2,
        context_parallel_size=2,
    )
    assert hsdp_cp.dim_names == (
        "data_parallel_replicate",
        "expert_data_parallel",
        "expert_parallel",
        "context_parallel",
        "tensor_parallel",
    )
    assert hsdp_cp.shape == (2, 2, 2, 2, 1)
    assert hsdp_cp.expert_fsdp_dims == ("data_parallel_replicate", "expert_data_parallel_context_parallel")
    assert hsdp_cp.fsdp_dims == ("data_parallel_replicate", "data_parallel_shard_context_parallel")
    assert dict(hsdp_cp.flattened)["data_parallel"] == (
        "data_parallel_replicate",
        "expert_data_parallel",
        "expert_parallel",
    )

    without = resolve_layout(2, 1, 1, num_nodes=1, num_processes=2)
    assert without.expert_fsdp_dims == without.fsdp_dims and "expert_parallel" not in without.dim_names


class _FFN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 16)
        self.down = nn.Linear(16, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_stacked_experts_compute_what_the_module_list_computes() -> None:
    """StackedExperts(ModuleList): same outputs and gradients as calling each expert on its rows."""
    from phalanx_strategy_model_parallel import MoE, StackedExperts

    torch.manual_seed(0)
    experts = nn.ModuleList(_FFN() for _ in range(EXPERTS))
    stacked = StackedExperts.from_modules(experts)
    assert {k: tuple(v.shape) for k, v in stacked.state_dict().items()} == {
        "up.weight": (EXPERTS, 16, DIM),
        "up.bias": (EXPERTS, 16),
        "down.weight": (EXPERTS, DIM, 16),
        "down.bias": (EXPERTS, DIM),
    }
    counts = torch.tensor([3, 0, 2, 5])
    x = torch.randn(int(counts.sum()), DIM)
    expected = torch.cat([experts[e](chunk) for e, chunk in enumerate(x.split(counts.tolist()))])
    got = stacked(x, counts)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    got.square().sum().backward()
    expected.square().sum().backward()
    for e, expert in enumerate(experts):
        torch.testing.assert_close(stacked.up.weight.grad[e], expert.up.weight.grad, atol=1e-6, rtol=0)
    moe = MoE(DIM, 16, EXPERTS, top_k=2, experts=stacked)
    assert moe(torch.randn(2, 3, DIM)).shape == (2, 3, DIM) and moe.aux_loss.item() > 0
    with pytest.raises(MisconfigurationError, match="same parameter names and shapes"):
        StackedExperts([_FFN(), nn.Linear(DIM, DIM)])


def test_moe_block_routes_each_token_to_its_top_k_experts() -> None:
    """The MoE block against a per-token loop over its top-k experts (the dispatch the EP runs rely on)."""
    net = MoENet()
    moe = net.moe
    x = torch.randn(6, DIM)
    probs = torch.softmax(moe.router(x), dim=-1)
    weights, ids = probs.topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    w1, w2 = moe.experts.w1, moe.experts.w2
    expected = torch.stack(
        [
            sum(weights[t, j] * (torch.nn.functional.gelu(x[t] @ w1[ids[t, j]]) @ w2[ids[t, j]]) for j in range(2))
            for t in range(6)
        ]
    )
    torch.testing.assert_close(moe(x), expected, atol=1e-6, rtol=0)
    fraction = torch.bincount(ids.flatten(), minlength=EXPERTS).float() / 12
    torch.testing.assert_close(moe.aux_loss, EXPERTS * (fraction * probs.mean(0)).sum())


def test_plan_counts_experts_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    """``Trainer.plan`` passes expert_parallel_size; the estimate's layout says how many experts a rank
    holds, and ``phalanx plan --strategy model_parallel`` prints it under the row."""
    import phalanx
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    class Planned(phalanx.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = MoENet()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def planned(ep: int) -> object:
        strategy = ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=1, expert_parallel_size=ep)
        trainer = phalanx.Trainer(accelerator="cpu", strategy=strategy, devices=4, logger=False)
        row = trainer.plan(Planned()).rows[0]
        assert row.estimate is not None
        return row.estimate

    ep2, ep1 = planned(2), planned(1)
    assert ep2.layout.endswith(f"ep=2 (of dp): {EXPERTS // 2} experts per rank"), ep2.layout
    assert (
        f"experts: 1 MoE layer(s) of {EXPERTS} experts, {EXPERTS // 2} per rank over ep=2 (not split by tp)"
        in ep2.notes
    )
    assert "ep=" not in ep1.layout and ep2.parameters == ep1.parameters  # EP ranks are dp ranks: same bytes
    from phalanx.cli import main

    args = ["--strategy", "model_parallel", "--devices", "4", "--param", "tensor_parallel_size=1"]
    assert main(["plan", "moe_common:MoENet", *args, "--param", "expert_parallel_size=2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"layout: dp=4 x tp=1 x pp=1, ep=2 (of dp): {EXPERTS // 2} experts per rank;" in out, out
