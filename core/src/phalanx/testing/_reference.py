"""Plain PyTorch twins of the conformance script: what a correct strategy must produce.

No phalanx code runs here, so a bug shared by the Trainer and a strategy cannot cancel out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.testing._script import (
    BATCH,
    DATA_SEED,
    EVAL_SAMPLES,
    FEATURES,
    HIDDEN,
    LR,
    MODEL_SEED,
    MOMENTUM,
    OUTPUTS,
    SAMPLES,
    TEST_SEED,
    VAL_SEED,
)

if TYPE_CHECKING:
    import torch

__all__ = ["plain_model", "reference_evaluation", "reference_run"]


def _data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, FEATURES, generator=g), torch.randn(n, OUTPUTS, generator=g)


def plain_model(state: dict[str, torch.Tensor] | None = None) -> torch.nn.Sequential:
    """The script's ``Net`` as a plain ``nn.Sequential`` (same parameter names), optionally loaded."""
    import torch

    torch.manual_seed(MODEL_SEED)
    model = torch.nn.Sequential()
    model.add_module("hidden", torch.nn.Linear(FEATURES, HIDDEN))
    model.add_module("act", torch.nn.Tanh())
    model.add_module("head", torch.nn.Linear(HIDDEN, OUTPUTS))
    if state is not None:
        model.load_state_dict({k: v.detach().cpu().float() for k, v in state.items() if k.split(".")[0] in {"hidden", "head"}})
    return model


def reference_run(world_size: int, steps: int) -> tuple[dict[str, Any], list[float]]:
    """Plain PyTorch: SGD with momentum on the union of ``world_size`` ranks' batches.

    Rank ``r`` reads samples ``r, r + world_size, ...`` (DistributedSampler without shuffling).

    Returns the final state dict and rank 0's per-step loss (its own half of each global batch).
    """
    import torch

    x, y = _data(DATA_SEED, SAMPLES)
    model = plain_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    per_rank = [list(range(r, SAMPLES, world_size)) for r in range(world_size)]
    batches_per_epoch = len(per_rank[0]) // BATCH
    losses = []
    for step in range(steps):
        b = step % batches_per_epoch
        rank_losses = []
        for rank in range(world_size):
            idx = per_rank[rank][b * BATCH : (b + 1) * BATCH]
            rank_losses.append(torch.nn.functional.mse_loss(model(x[idx]), y[idx]))
        losses.append(rank_losses[0].item())
        optimizer.zero_grad()
        torch.stack(rank_losses).mean().backward()
        optimizer.step()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, losses


def reference_evaluation(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Validation and test loss over the whole evaluation sets, and every prediction, for ``state``.

    The script logs the per-batch mean squared error with ``sync_dist=True``; every batch holds
    ``BATCH`` samples and every rank as many batches, so the epoch mean is the loss over the set.
    """
    import torch

    model = plain_model(state)
    x, y = _data(VAL_SEED, EVAL_SAMPLES)
    tx, ty = _data(TEST_SEED, EVAL_SAMPLES)
    with torch.no_grad():
        return {
            "val_loss": torch.nn.functional.mse_loss(model(x), y).item(),
            "test_loss": torch.nn.functional.mse_loss(model(tx), ty).item(),
            "predictions": model(x),
        }
