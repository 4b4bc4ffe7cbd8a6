"""Precisions train for real on CPU and match a hand-written PyTorch loop bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import torch
from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from phalanx.precision._aliases import CANONICAL_PRECISIONS, normalize_precision

STEPS = 4


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)
    return [(x, y)] * STEPS  # one batch, so the loss must fall


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


class RecordingTrainer:
    """Stands in for the Trainer's pre-step slot (the stage's ``Run.before_optimizer_step``, handed
    to the precision with ``connect_before_optimizer_step``): records the gradients it sees."""

    def __init__(self) -> None:
        self.seen: list[list[torch.Tensor]] = []

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.seen.append([p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]])


def _train_with(precision: Precision, *, device: str = "cpu") -> tuple[nn.Module, list[float], RecordingTrainer]:
    precision.setup(torch.device(device))
    model = precision.convert_module(_model())
    trainer = RecordingTrainer()
    precision.connect_before_optimizer_step(trainer.before_optimizer_step)
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, [optimizer] = precision.connect(model, [optimizer])
    losses: list[float] = []
    for x, y in _data():
        x, y = precision.convert_input((x, y))

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            optimizer.zero_grad()
            with precision.train_step_context():
                loss = nn.functional.mse_loss(model(x).float(), y.float())
            loss = precision.pre_backward(loss, model)
            precision.backward(loss, model, optimizer)
            return precision.post_backward(loss, model)

        losses.append(precision.optimizer_step(optimizer, model, closure).item())
    return model, losses, trainer


def _train_by_hand(
    *,
    dtype: torch.dtype = torch.float32,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[nn.Module, list[float]]:
    model = _model().to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in _data():
        x, y = x.to(dtype), y.to(dtype)
        optimizer.zero_grad()
        with autocast():
            loss = nn.functional.mse_loss(model(x).float(), y.float())
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
        losses.append(loss.item())
    return model, losses


def _assert_same_weights(left: nn.Module, right: nn.Module) -> None:
    for a, b in zip(left.state_dict().values(), right.state_dict().values()):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)


def test_32_true_is_plain_pytorch() -> None:
    model, losses, trainer = _train_with(Precision())
    reference, reference_losses = _train_by_hand()
    _assert_same_weights(model, reference)
    assert losses == reference_losses
    assert len(trainer.seen) == STEPS  # the Trainer's slot ran once per step
    assert losses[-1] < losses[0]


def test_64_true_trains_in_float64() -> None:
    model, losses, _ = _train_with(DoublePrecision())
    reference, reference_losses = _train_by_hand(dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64
    _assert_same_weights(model, reference)
    assert losses == reference_losses


@pytest.mark.parametrize(("name", "dtype"), [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_half_true_trains_in_16_bits(name: str, dtype: torch.dtype) -> None:
    model, losses, _ = _train_with(HalfPrecision(name))
    reference, reference_losses = _train_by_hand(dtype=dtype)
    assert next(model.parameters()).dtype == dtype
    _assert_same_weights(model, reference)
    assert losses == reference_losses


def test_bf16_mixed_autocasts_and_keeps_float32_weights() -> None:
    precision = MixedPrecision("bf16-mixed")
    model, losses, _ = _train_with(precision)
    reference, reference_losses = _train_by_hand(autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert precision.scaler is None and precision.device == "cpu"
    assert next(model.parameters()).dtype == torch.float32
    _assert_same_weights(model, reference)
    assert losses == reference_losses
    with precision.forward_context():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_16_mixed_scales_the_loss_and_clipping_sees_unscaled_gradients() -> None:
    precision = MixedPrecision("16-mixed")
    model, losses, trainer = _train_with(precision)
    reference, reference_losses = _train_by_hand(
        autocast=lambda: torch.autocast("cpu", dtype=torch.float16), scaler=torch.amp.GradScaler("cpu")
    )
    assert isinstance(precision.scaler, torch.amp.GradScaler)
    _assert_same_weights(model, reference)
    assert losses == reference_losses
    # With an initial scale of 65536 scaled gradients would be huge; the Trainer's slot must see
    # the true ones (same magnitude as an fp32 step's gradients).
    _, _, fp32_trainer = _train_with(Precision())
    scaled_ratio = trainer.seen[0][0].abs().max() / fp32_trainer.seen[0][0].abs().max()
    assert 0.5 < float(scaled_ratio) < 2.0


def test_16_mixed_skips_a_step_with_inf_gradients_and_lowers_the_scale() -> None:
    precision = MixedPrecision("16-mixed", device="cpu")
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scale_before = precision.scaler.get_scale()  # type: ignore[union-attr]

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        with precision.forward_context():
            loss = model(torch.ones(1, 4)).sum() * float("inf")
        precision.backward(loss, model, optimizer)
        return loss

    precision.optimizer_step(optimizer, model, closure)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert precision.scaler.get_scale() < scale_before  # type: ignore[union-attr]


def test_16_mixed_scaler_state_round_trips_even_before_setup() -> None:
    trained = MixedPrecision("16-mixed", device="cpu")
    trained.scaler.scale(torch.ones(()))  # type: ignore[union-attr]
    trained.scaler.update(new_scale=1024.0)  # type: ignore[union-attr]
    state = trained.state_dict()
    assert state["scale"] == 1024.0
    fresh = MixedPrecision("16-mixed")  # device unknown until setup, like a Trainer restoring early
    fresh.load_state_dict(state)
    fresh.setup(torch.device("cpu"))
    assert fresh.scaler.get_scale() == 1024.0  # type: ignore[union-attr]
    assert MixedPrecision("bf16-mixed").state_dict() == {}


def test_16_mixed_unscale_is_idempotent_within_a_step() -> None:
    """Unscaling in the pre-step slot (as clipping does) and again in the step divides only once."""
    x = torch.ones(2, 4)

    # The plain loop: one unscale_ per step, then the scaled step.
    reference = _model()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # no overflow: every step updates
    ref_grads = []
    for _ in range(2):
        ref_optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = reference(x).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(ref_optimizer)
        ref_grads.append([p.grad.clone() for p in reference.parameters()])
        scaler.step(ref_optimizer)
        scaler.update()

    precision = MixedPrecision("16-mixed", device="cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[list[torch.Tensor]] = []

    def before_step(opt: torch.optim.Optimizer) -> None:
        precision.unscale_gradients(opt)
        precision.unscale_gradients(opt)  # a second caller in the same step must be a no-op
        seen.append([p.grad.clone() for p in model.parameters()])

    precision.connect_before_optimizer_step(before_step)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        with precision.forward_context():
            loss = model(x).pow(2).mean()
        precision.backward(loss, model, optimizer)
        return loss

    for _ in range(2):
        precision.optimizer_step(optimizer, model, closure)
    for got, expected in zip(seen, ref_grads, strict=True):
        for g, e in zip(got, expected, strict=True):
            assert torch.equal(g, e)  # true gradients: divided by the scale exactly once
    assert all(torch.isfinite(g).all() for step in seen for g in step)
    for got, expected in zip(model.parameters(), reference.parameters()):
        assert torch.equal(got, expected)
    assert precision.scaler.get_scale() == scaler.get_scale()  # type: ignore[union-attr]


def test_16_mixed_rejects_lbfgs_and_bf16_rejects_a_scaler() -> None:
    precision = MixedPrecision("16-mixed", device="cpu")
    model = _model()
    optimizer = torch.optim.LBFGS(model.parameters())
    with pytest.raises(MisconfigurationError, match="LBFGS"):
        precision.optimizer_step(optimizer, model, lambda: None)
    with pytest.raises(MisconfigurationError, match="bfloat16 does not need"):
        MixedPrecision("bf16-mixed", scaler=torch.amp.GradScaler("cpu"))


def test_base_precision_drives_lbfgs_which_evaluates_the_closure_repeatedly() -> None:
    model = _model()
    trainer = RecordingTrainer()
    precision = Precision()
    precision.connect_before_optimizer_step(trainer.before_optimizer_step)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=5)
    x, y = _data()[0]

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    first = precision.optimizer_step(optimizer, model, closure)
    assert len(trainer.seen) > 1
    with torch.no_grad():
        assert nn.functional.mse_loss(model(x), y).item() < first.item()


@pytest.mark.parametrize(
    ("algorithm", "reference"),
    [("norm", torch.nn.utils.clip_grad_norm_), ("value", torch.nn.utils.clip_grad_value_)],
)
def test_clip_gradients_matches_torch(algorithm: str, reference: Callable[..., Any]) -> None:
    model = _model()
    x, y = _data()[0]
    (nn.functional.mse_loss(model(x), y) * 100).backward()
    expected = [p.grad.detach().clone() for p in model.parameters()]  # type: ignore[union-attr]
    clones = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    for clone, grad in zip(clones, expected):
        clone.grad = grad.clone()
    reference(clones, 0.05)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    Precision().clip_gradients(optimizer, 0.05, algorithm)
    for param, clone, original in zip(model.parameters(), clones, expected):
        assert torch.equal(param.grad, clone.grad)  # type: ignore[arg-type]
        assert not torch.equal(param.grad, original)  # type: ignore[arg-type]


def test_clip_gradients_rejects_unknown_algorithm_and_ignores_disabled_values() -> None:
    model = _model()
    model(torch.ones(1, 4)).sum().backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    with pytest.raises(MisconfigurationError, match=r"'norms'.*\['norm', 'value'\]"):
        Precision().clip_gradients(optimizer, 1.0, "norms")
    Precision().clip_gradients(optimizer, None, "norm")
    Precision().clip_gradients(optimizer, 0.0, "value")
    assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters()))  # type: ignore[arg-type]


def test_init_contexts_set_and_restore_the_default_dtype() -> None:
    assert torch.get_default_dtype() == torch.float32
    with DoublePrecision().tensor_init_context():
        assert torch.empty(1).dtype == torch.float64
    with HalfPrecision("bf16-true").module_init_context():
        assert nn.Linear(2, 2).weight.dtype == torch.bfloat16
    with Precision().tensor_init_context():
        assert torch.empty(1).dtype == torch.float32
    assert torch.get_default_dtype() == torch.float32


def test_convert_input_casts_floats_only_and_keeps_containers() -> None:
    batch = {"x": torch.ones(2), "label": torch.tensor([1, 2]), "meta": ["a", torch.zeros(1)]}
    converted = HalfPrecision("16-true").convert_input(batch)
    assert converted["x"].dtype == torch.float16
    assert converted["label"].dtype == torch.int64
    assert converted["meta"][0] == "a" and converted["meta"][1].dtype == torch.float16
    assert Precision().convert_input(batch) is batch


def test_constructors_reject_unknown_names() -> None:
    with pytest.raises(MisconfigurationError, match="'16-true', 'bf16-true'"):
        HalfPrecision("16-mixed")
    with pytest.raises(MisconfigurationError, match="'16-mixed', 'bf16-mixed'"):
        MixedPrecision("16-true")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(32, "32-true"), ("32", "32-true"), (64, "64-true"), (16, "16-mixed"), ("16", "16-mixed"), ("bf16", "bf16-mixed")]
    + [(name, name) for name in CANONICAL_PRECISIONS],
)
def test_normalize_precision_accepts_aliases(value: object, expected: str) -> None:
    assert normalize_precision(value) == expected  # type: ignore[arg-type]


def test_normalize_precision_suggests_the_closest_name() -> None:
    with pytest.raises(MisconfigurationError, match="Did you mean 'bf16-mixed'") as info:
        normalize_precision("bf16-mixd")
    assert "'32-true'" in str(info.value)
    with pytest.raises(MisconfigurationError):
        normalize_precision(True)  # type: ignore[arg-type]
    assert normalize_precision("transformer-engine", extra_choices=["transformer-engine"]) == "transformer-engine"
