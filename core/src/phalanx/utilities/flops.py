"""Count the floating-point operations of a forward (and backward) pass without running it for real.

Build the model under ``torch.device("meta")``: torch's flop counter reads shapes only, so even a
model too large for this machine can be measured in milliseconds. Lightning users know this as
``lightning.pytorch.utilities.measure_flops``; the signature and result are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["measure_flops"]


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """The total FLOPs of ``forward_fn()`` and, with ``loss_fn``, of ``loss_fn(output).backward()``.

    Args:
        model: The module being measured. Kept for Lightning's signature: the counter counts every
            operation run inside ``forward_fn`` and ``loss_fn``, whichever module runs it.
        forward_fn: Runs the forward pass, e.g. ``lambda: model(x)``.
        loss_fn: Turns the output into a scalar to back-propagate; None measures the forward only.

    Example::

        with torch.device("meta"):  # shapes only: nothing is allocated or computed
            net = Transformer(config)
            tokens = torch.randint(0, config.vocab_size, (8, 1024))
        per_step = measure_flops(net, lambda: net(tokens), lambda logits: logits.mean())
    """
    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()
    return int(counter.get_total_flops())
