"""A misspelt ft_ddp / ft_hsdp option fails at construction, naming the closest valid one.

FTDDPStrategy forwards the other keywords to ``DistributedDataParallel``, FTHSDPStrategy to
``fully_shard``; each is checked against its target's signature when the strategy is built.
"""

from __future__ import annotations

import pytest
from phalanx_strategy_torchft import FTDDPStrategy, FTHSDPStrategy

from phalanx.errors import MisconfigurationError


@pytest.mark.parametrize(
    ("cls", "kwargs", "fragment"),
    [
        (FTDDPStrategy, {"replica_group": 2}, "Did you mean 'replica_groups'?"),
        (FTDDPStrategy, {"gradient_as_bucket_veiw": True}, "Did you mean 'gradient_as_bucket_view'?"),
        (FTHSDPStrategy, {"reshard_after_foward": False}, "Did you mean 'reshard_after_forward'?"),
        (FTHSDPStrategy, {"mesh": None}, "the strategy passes mesh to fully_shard itself"),
    ],
)
def test_a_misspelt_or_supplied_option_fails_at_construction(cls: type, kwargs: dict, fragment: str) -> None:
    with pytest.raises(MisconfigurationError) as info:
        cls(**kwargs)
    assert fragment in str(info.value)
