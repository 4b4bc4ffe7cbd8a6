"""A misspelt DDPStrategy option fails at construction, naming the closest valid one.

DDPStrategy forwards what is neither its own option nor ParallelStrategy's to
``DistributedDataParallel``; those are checked against DistributedDataParallel's own signature,
so the mistake surfaces on the user's line, not inside the first fit.
"""

from __future__ import annotations

import pytest

from phalanx.errors import MisconfigurationError
from phalanx_strategy_ddp import DDPStrategy


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"find_unused_parameter": True}, "Did you mean 'find_unused_parameters'?"),
        ({"static_grpah": True}, "Did you mean 'static_graph'?"),
        ({"timout": 5}, "Did you mean 'timeout'?"),
        ({"device_ids": [0]}, "the strategy passes device_ids to DistributedDataParallel itself"),
    ],
)
def test_a_misspelt_or_supplied_option_fails_at_construction(kwargs: dict, fragment: str) -> None:
    with pytest.raises(MisconfigurationError) as info:
        DDPStrategy(**kwargs)
    assert fragment in str(info.value)


def test_lightning_spellings_reach_distributed_data_parallel() -> None:
    strategy = DDPStrategy(find_unused_parameters=True, static_graph=True, bucket_cap_mb=10, start_method="popen")
    assert strategy.ddp_kwargs == {"find_unused_parameters": True, "static_graph": True, "bucket_cap_mb": 10}
