"""apply_to_collection / move_data_to_device keep container types and only touch matching leaves."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any

import torch

from phalanx.utilities.apply_func import apply_to_collection, move_data_to_device

Pair = namedtuple("Pair", ["x", "y"])


@dataclass
class Batch:
    x: torch.Tensor
    label: str
    derived: int = field(init=False, default=0)


@dataclass(frozen=True)
class Frozen:
    x: torch.Tensor


class Movable:
    """A user type that knows how to move itself."""

    def __init__(self) -> None:
        self.device: str | None = None

    def to(self, device: torch.device) -> Movable:
        moved = Movable()
        moved.device = str(device)
        return moved


def _double(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def test_nested_containers_keep_their_types() -> None:
    data: dict[str, Any] = {
        "od": OrderedDict(b=torch.ones(1), a=torch.ones(1)),
        "dd": defaultdict(list, {"k": torch.ones(1)}),
        "pair": Pair(torch.ones(1), [torch.ones(1), "s"]),
        "tuple": (torch.ones(1), 3),
        "set": {1, 2},
        "text": "keep",
    }
    out = apply_to_collection(data, torch.Tensor, _double)
    assert isinstance(out["od"], OrderedDict) and list(out["od"]) == ["b", "a"]
    assert isinstance(out["dd"], defaultdict) and out["dd"].default_factory is list
    assert isinstance(out["pair"], Pair) and out["pair"].y[1] == "s"
    assert torch.equal(out["pair"].y[0], torch.full((1,), 2.0))
    assert out["tuple"][1] == 3 and out["set"] == {1, 2} and out["text"] == "keep"
    assert torch.equal(data["tuple"][0], torch.ones(1))  # input untouched


def test_dataclasses_including_frozen_and_init_false_fields() -> None:
    batch = Batch(torch.ones(2), "b")
    batch.derived = 5
    out = apply_to_collection(batch, torch.Tensor, _double)
    assert isinstance(out, Batch) and out is not batch
    assert torch.equal(out.x, torch.full((2,), 2.0)) and out.label == "b" and out.derived == 5
    frozen = apply_to_collection(Frozen(torch.ones(1)), torch.Tensor, _double)
    assert torch.equal(frozen.x, torch.full((1,), 2.0))


def test_extra_arguments_are_forwarded() -> None:
    out = apply_to_collection([torch.ones(1)], torch.Tensor, torch.add, 5)
    assert torch.equal(out[0], torch.full((1,), 6.0))


def test_move_data_to_device_moves_tensors_and_objects_with_to() -> None:
    batch = {"x": torch.ones(2), "m": Movable(), "n": 3}
    moved = move_data_to_device(batch, "meta")
    assert moved["x"].device.type == "meta"
    assert moved["m"].device == "meta"
    assert moved["n"] == 3
    assert move_data_to_device(torch.ones(1), torch.device("cpu")).device.type == "cpu"
