"""A misspelt FSDPStrategy option fails at construction, naming the closest valid one.

What is neither FSDPStrategy's option nor ParallelStrategy's goes to every ``fully_shard`` call;
it is checked against ``fully_shard``'s signature, less what the strategy passes itself.
"""

from __future__ import annotations

import pytest

from phalanx.errors import MisconfigurationError
from phalanx_strategy_fsdp import FSDPStrategy


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"reshard_after_foward": False}, "Did you mean 'reshard_after_forward'?"),
        ({"auto_wrap_polcy": None}, "Did you mean 'auto_wrap_policy'?"),
        ({"shard_placement": None}, "Did you mean 'shard_placement_fn'?"),
        ({"mesh": None}, "the strategy passes mesh to fully_shard itself"),
        ({"mp_policy": None}, "the strategy passes mp_policy to fully_shard itself"),
    ],
)
def test_a_misspelt_or_supplied_option_fails_at_construction(kwargs: dict, fragment: str) -> None:
    with pytest.raises(MisconfigurationError) as info:
        FSDPStrategy(**kwargs)
    assert fragment in str(info.value)


def test_fully_shard_options_are_kept_for_every_call() -> None:
    strategy = FSDPStrategy(reshard_after_forward=False, shard_placement_fn=None, ignored_params=None)
    assert strategy.reshard_after_forward is False
    assert strategy.fully_shard_kwargs == {"shard_placement_fn": None, "ignored_params": None}
