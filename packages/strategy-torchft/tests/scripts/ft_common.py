"""Shared pieces of the torchft test scripts and tests: one model, one dataset, the replay references.

The phalanx run and the plain-PyTorch reference see the same initial weights, the same shards
(DistributedSampler over all ranks of all groups) and the same optimizer, so the reference can
replay exactly the steps that committed, with the groups that took part in each (``replay`` for
ft_ddp / ft_hsdp, ``diloco_replay`` for ft_diloco).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 0
BATCH_SIZE = 4
LR = 0.05
SAMPLES = 48


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = (x @ torch.randn(8, 1, generator=g)).tanh() + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


def build_layers() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def loss_fn(net: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(net(x), y)


def inner_optimizer(name: str, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The Module's optimizer: ``"sgd"``, ``"adamw"``, or Adam (what the ft_ddp tests use)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR)
    return torch.optim.Adam(params, lr=LR)


def write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # each writer its own: two ranks may write the same file
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def shard_batch(world: int, rank: int, epoch: int, batch_idx: int) -> Any:
    """Batch ``batch_idx`` of epoch ``epoch`` of rank ``rank`` of ``world`` (what DDP's sampler gives)."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset(), num_replicas=world, rank=rank, shuffle=True, seed=0
    )
    sampler.set_epoch(epoch)
    loader = DataLoader(dataset(), batch_size=BATCH_SIZE, sampler=sampler)
    for index, batch in enumerate(loader):
        if index == batch_idx:
            return batch
    msg = f"no batch {batch_idx} in epoch {epoch} for rank {rank}/{world}"
    raise IndexError(msg)


def replay(
    steps: Sequence[tuple[int, int, Sequence[int]]], world: int, *, accumulate: int = 1, clip: float | None = None
) -> dict[str, torch.Tensor]:
    """Plain PyTorch: for each (epoch, last batch_idx, ranks) apply one Adam step on the mean over
    ``ranks`` of each rank's gradient, accumulated over the ``accumulate`` batches ending at
    ``batch_idx`` (each loss divided by ``accumulate``), clipped to norm ``clip``. With every rank
    in every step this is plain DDP over ``world`` ranks."""
    torch.manual_seed(SEED)
    net = nn.Sequential()
    net.add_module("net", build_layers())
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    for epoch, batch_idx, ranks in steps:
        grads: list[list[torch.Tensor]] = []
        for rank in ranks:
            net.zero_grad()
            for micro in range(batch_idx - accumulate + 1, batch_idx + 1):
                (loss_fn(net.net, shard_batch(world, rank, epoch, micro)) / accumulate).backward()
            grads.append([p.grad.detach().clone() for p in net.parameters()])  # type: ignore[union-attr]
        for index, param in enumerate(net.parameters()):
            total = grads[0][index].clone()
            for other in grads[1:]:
                total += other[index]
            param.grad = total / len(ranks)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        optimizer.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def diloco_replay(
    steps: int,
    syncs: Sequence[tuple[bool, Sequence[int]]],
    world: int,
    *,
    sync_every: int,
    fragments: Sequence[Sequence[str]],
    delay: int = 0,
    inner: str = "adamw",
    resume: tuple[int, dict[str, Any]] | None = None,
    heal: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Plain PyTorch DiLoCo over ``world`` groups of one rank each, up to inner step ``steps``.

    Every group trains its own copy with its own inner optimizer on its shard. Fragment ``f``
    (torchft's step, the count of committed syncs, mod the number of fragments) syncs every
    ``sync_every // len(fragments)`` inner steps: its pseudo-gradient (global minus local weights)
    is taken ``delay`` steps before the sync and averaged over the groups ``syncs[i]`` names; if
    the sync commits, Nesterov SGD (lr 0.7, momentum 0.9: one optimizer per fragment) steps the
    global weights with it. Either way every group then continues from the global weights of that
    fragment. ``resume`` is ``(step, checkpoint)``: start at that step with every group holding the
    checkpoint's weights and inner optimizer state, and its DiLoCo state (``syncs`` then lists the
    syncs from there on). ``heal`` is ``(step, own_step)``: group 1, restarted, healed from group 0
    when that sync's pseudo-gradient was taken after inner step ``step``, its own step count being
    ``own_step`` (torchft: it receives group 0's weights and inner optimizer state, so both send the
    same pseudo-gradient); it then reads its shard from its own step ``own_step + 1`` on.

    Returns:
        ``groups``: each group's weights after the last step (the global weights of each fragment
        plus the group's inner steps since that fragment's last sync); ``global``: the global
        weights; ``outer``: the outer optimizers' state dicts.
    """
    torch.manual_seed(SEED)
    start = nn.Sequential()
    start.add_module("net", build_layers())
    global_params = {name: nn.Parameter(p.detach().clone()) for name, p in start.named_parameters()}
    outers = [
        torch.optim.SGD([global_params[name] for name in names], lr=0.7, momentum=0.9, nesterov=True)
        for names in fragments
    ]
    groups = [copy.deepcopy(start) for _ in range(world)]
    inners = [inner_optimizer(inner, net.parameters()) for net in groups]
    interval = sync_every // len(fragments)
    per_epoch = SAMPLES // world // BATCH_SIZE
    first, local, done, ft_step = 0, 0, 0, 0
    if resume is not None:
        first, checkpoint = resume
        state = checkpoint["diloco"]
        with torch.no_grad():
            for name, value in state["original_parameters"].items():
                global_params[name].copy_(value)
        for outer, outer_state in zip(outers, state["outer_optimizers"]):
            outer.load_state_dict(outer_state)
        for net, optimizer in zip(groups, inners):
            net.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(copy.deepcopy(checkpoint["optimizer_states"][0]))  # a state of its own
        local, ft_step = state["local_step"], state["manager"]["step"]
    pseudo: dict[str, torch.Tensor] = {}
    for step in range(first, steps):
        for rank, (net, optimizer) in enumerate(zip(groups, inners)):
            own = step - (heal[0] - heal[1]) if heal is not None and rank == 1 and step > heal[0] else step
            optimizer.zero_grad()
            loss_fn(net.net, shard_batch(world, rank, *divmod(own, per_epoch))).backward()
            optimizer.step()
        if heal is not None and step == heal[0]:
            groups[1].load_state_dict(groups[0].state_dict())
            inners[1].load_state_dict(copy.deepcopy(inners[0].state_dict()))
        local += 1
        fragment = ft_step % len(fragments)
        names = fragments[fragment]
        if local == interval - delay:
            ranks = syncs[done][1]
            with torch.no_grad():
                for name in names:
                    deltas = [global_params[name] - dict(groups[r].named_parameters())[name] for r in ranks]
                    total = deltas[0].clone()
                    for other in deltas[1:]:
                        total += other
                    pseudo[name] = total / len(ranks)
        if local == interval:
            if syncs[done][0]:
                for name in names:
                    global_params[name].grad = pseudo[name]
                outers[fragment].step()
                outers[fragment].zero_grad()
                ft_step += 1
            with torch.no_grad():
                for net in groups:
                    params = dict(net.named_parameters())
                    for name in names:
                        params[name].copy_(global_params[name])
            local, done = 0, done + 1
    return {
        "groups": [{k: v.detach().clone() for k, v in net.state_dict().items()} for net in groups],
        "global": {k: v.detach().clone() for k, v in global_params.items()},
        "outer": [outer.state_dict() for outer in outers],
    }
