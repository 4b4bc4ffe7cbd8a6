"""phalanx's conformance kit against ``local_sgd``, run as any vendor runs it.

The kit's reference is synchronous data-parallel SGD, which local SGD equals when it averages after
every step, so the kit runs it with ``sync_every=1``. The periodic schedule (``sync_every > 1``)
is checked against a plain torchrun loop in test_torchrun_parity.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

from phalanx.testing import StrategyConformance


class TestLocalSGDConformance(StrategyConformance):
    strategy = "local_sgd"
    devices = 2
    strategy_params: ClassVar[dict[str, Any]] = {"sync_every": 1}
