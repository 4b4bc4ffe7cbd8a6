"""The README's demo under real strategies, with every first-party plugin installed together."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.testing.processes import run_command

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"


def _demo(tmp_path: Path, *args: str) -> str:
    command = [sys.executable, str(DEMO), "--max-steps", "30", "--no-progress-bar", "--root-dir", str(tmp_path), *args]
    result = run_command(command, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.output()
    result.check_leftovers()
    return result.stdout


def _plain_losses(steps: int, *, world: int = 2, batch: int = 16, block: int = 32) -> list[float]:
    """The demo's training in plain PyTorch: per step, the mean over ``world`` ranks of their batch loss.

    The same text, windows, model (built in the demo's order after ``torch.manual_seed(0)``, so the
    initial weights are identical), AdamW, warmup + cosine schedule; each rank's batches are what
    DistributedSampler(shuffle=False) gives it; gradients averaged over ranks as DDP and FSDP do.
    """
    import torch
    from torch import nn

    text = (ROOT / "examples" / "data" / "harbour_notes.txt").read_text(encoding="utf-8")
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(ch) for ch in text], dtype=torch.long)[: int(len(text) * 0.9)]
    starts = list(range(0, len(ids) - block - 1, block // 2))
    torch.manual_seed(0)
    width = 64
    token, position = nn.Embedding(len(vocab), width), nn.Embedding(block, width)
    layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
    blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    norm, head = nn.LayerNorm(width), nn.Linear(width, len(vocab))
    model = nn.ModuleList([token, position, blocks, norm, head])
    mask = torch.ones(block, block, dtype=torch.bool).triu(diagonal=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, eps=1e-8)
    warmup = max(1, steps // 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min((step - warmup) / max(1, steps - warmup), 1.0)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    padded = starts + starts[: (-len(starts)) % world]
    shards = [padded[rank::world] for rank in range(world)]
    params = list(model.parameters())
    losses = []
    for step in range(steps):
        grads, step_losses = [], []
        for shard in shards:
            window = torch.stack([ids[s : s + block + 1] for s in shard[step * batch : (step + 1) * batch]])
            x, y = window[:, :-1], window[:, 1:]
            hidden = blocks(token(x) + position(torch.arange(block)), mask=mask, is_causal=True)
            loss = nn.functional.cross_entropy(head(norm(hidden)).flatten(0, 1), y.flatten())
            step_losses.append(float(loss.detach()))
            grads.append(torch.autograd.grad(loss, params))
        for param, *rank_grads in zip(params, *grads):
            param.grad = sum(g / world for g in rank_grads)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(sum(step_losses) / world)
    return losses


@pytest.fixture(scope="module")
def plain_losses() -> list[float]:
    return _plain_losses(30)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_demo_with_two_processes_trains_like_plain_pytorch(tmp_path: Path, strategy: str, plain_losses: list[float]) -> None:
    """Without shuffling and dropout, the demo's final training loss is plain PyTorch's on the same ranks' batches."""
    report = tmp_path / "report"
    out = _demo(tmp_path, "--strategy", strategy, "--devices", "2", "--no-shuffle", "--dropout", "0", "--report", str(report))
    assert f"strategy={strategy}" in out and "devices=2" in out
    match = re.search(r"train_loss=([0-9.]+).*\(chance level ([0-9.]+)\)", out)
    assert match is not None, out
    assert float(match.group(1)) < float(match.group(2))
    ranks = [json.loads(Path(f"{report}.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    # 30 steps end mid-epoch: the reported value is the step-30 loss, averaged over the ranks.
    for r in ranks:
        assert abs(r["train_loss"] - plain_losses[-1]) < 1e-5, (r["train_loss"], plain_losses[-5:])
    assert plain_losses[-1] < plain_losses[0] - 0.5  # and the reference itself learned


def test_every_installed_first_party_package_lists_its_names() -> None:
    raw = subprocess.run([sys.executable, "-m", "phalanx.cli", "strategies", "--json"], capture_output=True, text=True, timeout=60, check=True).stdout
    rows = {row["name"]: row for row in json.loads(raw)}
    expected = {
        "phalanx-strategy-ddp": ["ddp", "ddp_spawn", "ddp_fork", "ddp_notebook"],
        "phalanx-strategy-fsdp": ["fsdp", "fsdp_cpu_offload"],
        "phalanx-strategy-deepspeed": ["deepspeed", "deepspeed_stage_3_offload_nvme"],
        "phalanx-strategy-xla": ["single_xla", "xla", "xla_debug", "xla_fsdp"],
    }
    installed = {row["distribution"] for row in rows.values()}
    for distribution, names in expected.items():
        if distribution not in installed:
            continue
        for name in names:
            assert rows[name]["distribution"] == distribution
    if "phalanx-strategy-xla" in installed and not any(r["available"] for r in rows.values() if r["distribution"] == "phalanx-strategy-xla"):
        assert "torch-xla" in (rows["xla"]["reason"] or "")
