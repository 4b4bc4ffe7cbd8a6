"""BaseFinetuning / BackboneFinetuning on real fits, against the same freeze/unfreeze done by hand."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer

LR = 0.1


class WithBackbone(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)
        self.epochs: list[tuple[list[float], bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def on_train_epoch_start(self) -> None:  # after the callbacks' on_train_epoch_start
        groups = self.trainer.optimizers[0].param_groups
        self.epochs.append(([g["lr"] for g in groups], self.backbone[0].weight.requires_grad))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=LR, momentum=0.9)


def plain(model: WithBackbone, epochs: int, unfreeze_at: int, factor: float) -> None:
    """The schedule by hand: head only, then the backbone as a second group at lr/10, x``factor`` per epoch."""
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=LR, momentum=0.9)
    backbone_lr = LR * 0.1
    for epoch in range(epochs):
        if epoch == unfreeze_at:
            for p in model.backbone.parameters():
                p.requires_grad_(True)
            optimizer.add_param_group({"params": list(model.backbone.parameters()), "lr": backbone_lr})
        elif epoch > unfreeze_at:
            backbone_lr = min(backbone_lr * factor, LR)
            optimizer.param_groups[-1]["lr"] = backbone_lr
        for x, y in loader(n=16):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()


def _same(a: nn.Module, b: nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_backbone_frozen_until_its_epoch_then_a_new_group_with_scheduled_lr() -> None:
    model = WithBackbone()
    reference = copy.deepcopy(model)
    start = model.backbone[0].weight.detach().clone()
    plain(reference, epochs=6, unfreeze_at=2, factor=3.0)
    callback = BackboneFinetuning(unfreeze_backbone_at_epoch=2, lambda_func=lambda epoch: 3.0)
    Trainer(max_epochs=6, callbacks=[callback], **quiet()).fit(model, loader(n=16))
    lrs = [[round(lr, 10) for lr in lrs] for lrs, _ in model.epochs]
    assert lrs == [[0.1], [0.1], [0.1, 0.01], [0.1, 0.03], [0.1, 0.09], [0.1, 0.1]]  # aligned at the model lr
    assert [trainable for _, trainable in model.epochs] == [False, False, True, True, True, True]
    assert not torch.equal(model.backbone[0].weight, start)
    _same(model, reference)


def test_backbone_stays_frozen_before_unfreezing() -> None:
    model = WithBackbone()
    start = copy.deepcopy(model.backbone.state_dict())
    Trainer(max_epochs=2, callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=5)], **quiet()).fit(
        model, loader(n=16)
    )
    _same(model.backbone, _loaded(start))


def _loaded(state: dict[str, torch.Tensor]) -> nn.Module:
    module = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
    module.load_state_dict(state)
    return module


def test_resume_rebuilds_the_param_groups_and_continues(tmp_path: Path) -> None:
    whole = WithBackbone()
    Trainer(max_epochs=5, callbacks=[BackboneFinetuning(1, lambda e: 1.5)], **quiet()).fit(whole, loader(n=16))

    first = WithBackbone()
    ckpt = ModelCheckpoint(tmp_path, save_last=True, save_top_k=0)
    callbacks: list[Any] = [BackboneFinetuning(1, lambda e: 1.5), ckpt]
    Trainer(max_epochs=3, callbacks=callbacks, **quiet(enable_checkpointing=True)).fit(first, loader(n=16))

    resumed = WithBackbone()
    callback = BackboneFinetuning(1, lambda e: 1.5)
    Trainer(max_epochs=5, callbacks=[callback], **quiet()).fit(
        resumed, loader(n=16), ckpt_path=str(tmp_path / "last.ckpt")
    )
    assert [len(lrs) for lrs, _ in resumed.epochs] == [2, 2]
    assert callback.previous_backbone_lr == pytest.approx(0.01 * 1.5**3)
    _same(resumed, whole)


def test_custom_base_finetuning_and_helpers() -> None:
    class HeadLater(BaseFinetuning):
        def freeze_before_training(self, pl_module: Module) -> None:
            self.freeze(pl_module.head)  # type: ignore[arg-type]

        def finetune_function(self, pl_module: Module, epoch: int, optimizer: torch.optim.Optimizer) -> None:
            if epoch == 1:
                self.unfreeze_and_add_param_group(pl_module.head, optimizer)  # type: ignore[arg-type]

    model = WithBackbone()
    callback = HeadLater()
    Trainer(max_epochs=2, callbacks=[callback], **quiet()).fit(model, loader(n=16))
    assert [lrs for lrs, _ in model.epochs] == [[LR], [LR, LR / 10]]  # lr / initial_denom_lr
    groups = callback.state_dict()["internal_optimizer_metadata"][0]
    assert [g["params"] for g in groups] == [["backbone.0.weight", "backbone.0.bias"], ["head.weight", "head.bias"]]

    bn = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    BaseFinetuning.freeze(bn, train_bn=False)
    assert not any(p.requires_grad for p in bn.parameters()) and not bn[1].track_running_stats
    assert list(BaseFinetuning.filter_params(bn, requires_grad=False)) == list(bn.parameters())
    BaseFinetuning.make_trainable(bn)
    assert all(p.requires_grad for p in bn.parameters()) and bn[1].track_running_stats


def test_a_module_without_backbone_is_refused() -> None:
    class NoBackbone(WithBackbone):
        def __init__(self) -> None:
            super().__init__()
            del self.backbone
            self.body = nn.Linear(6, 8)

    trainer = Trainer(max_epochs=1, callbacks=[BackboneFinetuning()], **quiet())
    with pytest.raises(MisconfigurationError, match="should have a nn.Module `backbone` attribute; NoBackbone"):
        trainer.fit(NoBackbone(), loader(n=8))
