"""ModelPruning on real fits, checked against ``torch.nn.utils.prune`` applied by hand.

Each test trains a tiny two-layer net with the Trainer and the same net with a plain PyTorch loop
(same initial weights, same batches), prunes the plain one with torch's own functions, and compares
masks and weights exactly: the callback must prune what a hand-written pruning call would.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.pruning import ModelPruning
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.strategies import SingleDeviceStrategy
from phalanx.trainer.trainer import Trainer

LR = 0.1


class TwoLayer(Module):
    """Linear(6, 4) -> tanh -> Linear(4, 1), plain SGD: deterministic and cheap."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(6, 4)
        self.fc2 = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def _fit(tmp_path: Path, model: TwoLayer, *callbacks: Callback, epochs: int = 1, val: bool = False, **kw: Any) -> None:
    kw.setdefault("enable_model_summary", False)
    trainer = Trainer(
        accelerator="cpu", default_root_dir=tmp_path, max_epochs=epochs, callbacks=list(callbacks), **quiet(**kw)
    )
    trainer.fit(model, loader(n=8), loader(n=4) if val else None)


def _plain_epoch(model: TwoLayer) -> None:
    """One epoch of the same training by hand (same batches, plain SGD)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in loader(n=8):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def _zeros(t: torch.Tensor) -> int:
    return int((t == 0).sum())


def test_l1_unstructured_zeroes_the_smallest_half_as_torch_does(tmp_path: Path) -> None:
    model, reference = TwoLayer(), TwoLayer()
    pruning = ModelPruning(
        "l1_unstructured",
        parameters_to_prune=[(model.fc1, "weight")],
        use_global_unstructured=False,
        amount=0.5,
        use_lottery_ticket_hypothesis=False,
        make_pruning_permanent=False,
    )
    _fit(tmp_path, model, pruning)
    _plain_epoch(reference)
    trained = reference.fc1.weight.detach().clone()
    prune.l1_unstructured(reference.fc1, "weight", amount=0.5)

    assert _zeros(model.fc1.weight) == model.fc1.weight.numel() // 2 == 12
    assert torch.equal(model.fc1.weight_mask, reference.fc1.weight_mask)
    torch.testing.assert_close(model.fc1.weight, reference.fc1.weight, rtol=0, atol=1e-7)
    # the zeroed entries are the smallest in magnitude of the trained weights
    kept = reference.fc1.weight_mask.bool()
    assert trained[~kept].abs().max() < trained[kept].abs().min()
    # only the named tensor was pruned
    assert not prune.is_pruned(model.fc2) and not hasattr(model.fc1, "bias_orig")


def test_a_plain_pruning_function_is_accepted_for_local_pruning(tmp_path: Path) -> None:
    model, reference = TwoLayer(), TwoLayer()
    pruning = ModelPruning(
        prune.l1_unstructured,
        parameters_to_prune=[(model.fc1, "weight")],
        use_global_unstructured=False,
        amount=3,  # an int: an absolute count
        use_lottery_ticket_hypothesis=False,
        make_pruning_permanent=False,
    )
    _fit(tmp_path, model, pruning)
    _plain_epoch(reference)
    prune.l1_unstructured(reference.fc1, "weight", amount=3)
    assert _zeros(model.fc1.weight) == 3
    assert torch.equal(model.fc1.weight_mask, reference.fc1.weight_mask)


def test_global_unstructured_matches_torch_global_unstructured(tmp_path: Path) -> None:
    model, reference = TwoLayer(), TwoLayer()
    pruning = ModelPruning(
        "l1_unstructured",
        parameter_names=["weight"],  # every weight of the model, ranked together
        amount=0.5,
        use_lottery_ticket_hypothesis=False,
        make_pruning_permanent=False,
    )
    _fit(tmp_path, model, pruning)
    _plain_epoch(reference)
    prune.global_unstructured(
        [(reference.fc1, "weight"), (reference.fc2, "weight")], pruning_method=prune.L1Unstructured, amount=0.5
    )
    for name in ("fc1", "fc2"):
        mine, theirs = getattr(model, name), getattr(reference, name)
        assert torch.equal(mine.weight_mask, theirs.weight_mask), name
        torch.testing.assert_close(mine.weight, theirs.weight, rtol=0, atol=1e-7)
    assert _zeros(model.fc1.weight) + _zeros(model.fc2.weight) == (24 + 4) // 2
    assert not hasattr(model.fc1, "bias_mask") and not hasattr(model.fc2, "bias_mask")  # biases not named


def test_amount_and_apply_pruning_as_callables_of_the_epoch(tmp_path: Path) -> None:
    seen: list[int] = []
    zeros_after: list[int] = []

    def amount(epoch: int) -> float:
        seen.append(epoch)
        return [0.25, 0.5, 0.5][epoch]

    class Count(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            zeros_after.append(_zeros(pl_module.fc1.weight))

    model = TwoLayer()
    pruning = ModelPruning(
        "l1_unstructured",
        parameters_to_prune=[(model.fc1, "weight")],
        amount=amount,
        apply_pruning=lambda epoch: epoch != 2,
        use_lottery_ticket_hypothesis=False,
        make_pruning_permanent=False,
    )
    _fit(tmp_path, model, pruning, Count(), epochs=3)
    assert seen == [0, 1, 2]
    # 25% of 24 -> 6; then 50% of the 18 left -> 15 in all; epoch 2 is skipped by apply_pruning
    assert zeros_after == [6, 15, 15]


def test_prune_on_validation_epoch_end_skips_the_sanity_check(tmp_path: Path) -> None:
    seen: list[int] = []
    model = TwoLayer()
    pruning = ModelPruning(
        "random_unstructured",
        amount=lambda epoch: seen.append(epoch) or 0.5,
        prune_on_train_epoch_end=False,
        use_lottery_ticket_hypothesis=False,
    )
    _fit(tmp_path, model, pruning, epochs=2, val=True, num_sanity_val_steps=1)
    assert seen == [0, 1]
    # global random pruning over weights and biases: 75% of 33 entries, rounded as torch does
    total = sum(p.numel() for p in model.parameters())
    assert sum(_zeros(p) for p in model.parameters()) == round(0.5 * total) + round(0.5 * (total - round(0.5 * total)))


def test_lottery_ticket_rewinds_the_surviving_weights_every_time(tmp_path: Path) -> None:
    model = TwoLayer()
    original = model.fc1.weight.detach().clone()
    original_bias = model.fc1.bias.detach().clone()
    masks: list[torch.Tensor] = []
    trained: list[torch.Tensor] = []

    class Before(Callback):  # runs before ModelPruning: the weights as training left them
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            w = getattr(pl_module.fc1, "weight_orig", pl_module.fc1.weight)
            trained.append(w.detach().clone())

    class After(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            masks.append(pl_module.fc1.weight_mask.clone())

    pruning = ModelPruning(
        "l1_unstructured",
        parameters_to_prune=[(model.fc1, "weight")],
        use_global_unstructured=False,
        amount=0.25,
        make_pruning_permanent=False,
    )
    _fit(tmp_path, model, Before(), pruning, After(), epochs=2)
    for epoch, mask in enumerate(masks):
        # the mask ranks the *trained* weights, as pruning by hand would
        reference = nn.Linear(6, 4)
        with torch.no_grad():
            reference.weight.copy_(trained[epoch])
        if epoch:  # epoch 0's mask stays: the second pruning ranks only the surviving entries
            prune.custom_from_mask(reference, "weight", masks[epoch - 1])
        prune.l1_unstructured(reference, "weight", amount=0.25)
        assert torch.equal(mask, reference.weight_mask), epoch
    kept = masks[-1].bool()
    assert _zeros(masks[-1]) == 6 + round(0.25 * 18)  # torch rounds 4.5 to 4
    # training moved the weights, yet the survivors are back at their initial values after epoch 2 too
    assert not torch.equal(trained[1][kept], original[kept])
    assert torch.equal(model.fc1.weight_orig[kept], original[kept])
    assert torch.equal(model.fc1.weight, original * masks[-1])
    assert not torch.equal(model.fc1.bias, original_bias)  # only the pruned tensor is rewound


def test_resample_parameters_draws_fresh_initial_values(tmp_path: Path) -> None:
    model = TwoLayer()
    original = model.fc1.weight.detach().clone()
    pruning = ModelPruning(
        "l1_unstructured",
        parameters_to_prune=[(model.fc1, "weight")],
        amount=0.5,
        resample_parameters=True,
        make_pruning_permanent=False,
    )
    _fit(tmp_path, model, pruning)
    kept = model.fc1.weight_mask.bool()
    survivors = model.fc1.weight_orig[kept]
    assert not torch.isin(survivors, original).any()  # new draws, not the recorded initial values
    assert survivors.abs().max() <= 1 / 6**0.5  # nn.Linear's reset_parameters bound, 1/sqrt(fan_in)
    # the recorded copy is untouched, so a later rewind could still use the true initial values
    recorded = next(iter(pruning._original_layers.values()))["data"]  # type: ignore[union-attr]
    assert torch.equal(recorded.weight, original)


def test_verbose_logs_sparsity_before_and_after(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = TwoLayer()
    pruning = ModelPruning("l1_unstructured", amount=0.5, verbose=2, use_lottery_ticket_hypothesis=False)
    with caplog.at_level(logging.INFO, logger="phalanx.callbacks.pruning"):
        _fit(tmp_path, model, pruning)
    text = caplog.text
    assert "Applied `L1Unstructured`. Pruned: 0/33 (0.00%) -> 16/33 (48.48%)" in text
    assert text.count("Applied `L1Unstructured` to `Linear(") == 4  # verbose=2: one line per tensor


def test_make_pruning_permanent_removes_masks_and_checkpoints_plain_weights(tmp_path: Path) -> None:
    model = TwoLayer()
    pruning = ModelPruning("l1_unstructured", amount=0.5, use_lottery_ticket_hypothesis=False)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="pruned")
    _fit(tmp_path, model, pruning, checkpoint, enable_checkpointing=True)

    for module in (model.fc1, model.fc2):
        assert not prune.is_pruned(module)
        assert not hasattr(module, "weight_orig") and not hasattr(module, "weight_mask")
        assert isinstance(module.weight, nn.Parameter)
    assert sorted(name for name, _ in model.named_parameters()) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]

    saved = torch.load(tmp_path / "ckpt" / "pruned.ckpt", weights_only=True)["state_dict"]
    assert sorted(saved) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    for key, value in model.state_dict().items():
        assert torch.equal(saved[key], value), key
    # the checkpoint loads into the unpruned class, and half of all 33 entries are zero
    fresh = TwoLayer(seed=1)
    fresh.load_state_dict(saved)
    assert sum(_zeros(p) for p in fresh.parameters()) == round(0.5 * 33)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pruning_fn": "l2_unstructured"}, r"expected to be a str in \['ln_structured', 'l1_unstructured', 'random_s"),
        ({"pruning_fn": "ln_structured", "use_global_unstructured": False}, "pruning_dim"),
        ({"pruning_fn": "ln_structured", "pruning_dim": 0, "use_global_unstructured": False}, "pruning_norm"),
        ({"pruning_fn": "random_structured", "pruning_dim": 0}, "use_global_unstructured=False"),
        ({"pruning_fn": prune.L1Unstructured, "use_global_unstructured": False}, "use_global_unstructured=True"),
        ({"pruning_fn": prune.l1_unstructured}, "use_global_unstructured=False"),
        ({"pruning_fn": "l1_unstructured", "parameter_names": ["gamma"]}, r"gamma isn't in \('weight', 'bias'\)"),
        ({"pruning_fn": "l1_unstructured", "amount": "half"}, "amount='half'"),
        ({"pruning_fn": "l1_unstructured", "verbose": 3}, "verbose=3"),
    ],
)
def test_bad_arguments_raise_naming_the_valid_choices(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        ModelPruning(**kwargs)


def test_parameters_not_in_the_model_are_refused_at_setup(tmp_path: Path) -> None:
    stranger = nn.Linear(2, 2)
    with pytest.raises(MisconfigurationError, match="missing modules"):
        _fit(tmp_path, TwoLayer(), ModelPruning("l1_unstructured", parameters_to_prune=[(stranger, "weight")]))


class _ShardedStandIn(SingleDeviceStrategy):
    """A strategy that declares sharded checkpoint state, as FSDP, DeepSpeed and model parallel do."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True


def test_sharded_strategies_are_refused_at_setup(tmp_path: Path) -> None:
    model = TwoLayer()
    with pytest.raises(MisconfigurationError, match=r"does not support sharded models.*strategy='ddp'"):
        _fit(tmp_path, model, ModelPruning("l1_unstructured"), strategy=_ShardedStandIn("cpu"))
    assert not prune.is_pruned(model)
