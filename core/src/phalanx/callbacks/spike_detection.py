"""SpikeDetection: stop training when the loss jumps far above its running mean, and say which batches to skip.

A loss spike in a long run (a corrupt batch, a numerically unlucky step) can ruin hours of
training before anyone looks at the curve. This callback compares each training loss with the
running mean of the last ``window`` losses and, on a spike, writes the indices of the current and
the previous batch to a JSON file (the previous batch may have moved the weights to where the
current one explodes) and raises :class:`TrainingSpikeException`, so the run can be resumed from
the last checkpoint with those batches skipped. Lightning's ``SpikeDetection`` (arguments, file
format, exception); the running mean is kept here directly, so torchmetrics is not needed.

Detection is per rank, but the decision is shared: if any rank sees a spike, every rank raises at
the same batch (``reduce_boolean_decision(all=False)``), so no rank waits forever in a collective.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["SpikeDetection", "TrainingSpikeException"]


class TrainingSpikeException(RuntimeError):
    """Raised on every rank when a training loss spike was detected."""

    def __init__(self, batch_idx: int, *args: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args)
        self.batch_idx = batch_idx


_LIGHTNING_SPIKE_MODULE = "lightning.fabric.utilities.spike"
_interop_classes: dict[type, type] = {}


def _spike_exception(batch_idx: int) -> TrainingSpikeException:
    """The exception to raise: phalanx's, and Lightning's too when Lightning's class is loaded.

    Lightning's public home for its spike exception is ``lightning.fabric.utilities.spike``, a
    path the rename rule does not cover, so Lightning code keeps catching that class after the
    rename. When that module is already imported (it is never imported from here), the raised
    exception also derives from Lightning's class, so such an ``except`` still catches it.
    """
    foreign = getattr(sys.modules.get(_LIGHTNING_SPIKE_MODULE), "TrainingSpikeException", None)
    if not isinstance(foreign, type) or not issubclass(foreign, BaseException):
        return TrainingSpikeException(batch_idx)
    cls = _interop_classes.get(foreign)
    if cls is None:

        def __init__(self: TrainingSpikeException, batch_idx: int, *args: Any) -> None:
            RuntimeError.__init__(self, f"Training spike detected in batch {batch_idx}", *args)
            self.batch_idx = batch_idx

        cls = type("TrainingSpikeException", (TrainingSpikeException, foreign), {"__init__": __init__})
        cls.__module__ = __name__
        _interop_classes[foreign] = cls
    return cls(batch_idx)


class SpikeDetection(Callback):
    """Raise :class:`TrainingSpikeException` when the training loss spikes.

    A loss is a spike when it is not an improvement over the previous loss (per ``mode``) and
    differs from the running mean by at least ``atol`` and by at least ``rtol x running mean``
    (each check is skipped when its tolerance is None); with ``finite_only`` a NaN/inf loss is a
    spike too.

    Args:
        mode: ``"min"`` (lower is better) or ``"max"``.
        window: Number of recent losses in the running mean.
        warmup: Batches of each epoch before checking starts.
        atol: Absolute tolerance, or None.
        rtol: Relative tolerance (to the running mean), or None.
        exclude_batches_path: File (``.json``) or directory for the list of batches to skip;
            ``<default_root_dir>/skip_batches.json`` by default.
        finite_only: Treat non-finite losses as spikes. With False they are neither spikes nor
            added to the running mean.

    Raises:
        MisconfigurationError: ``mode`` is not ``"min"``/``"max"`` or ``window`` < 1.
    """

    def __init__(
        self,
        mode: str = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike[str] | None = None,
        finite_only: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            msg = f"SpikeDetection(mode={mode!r}) is invalid; valid modes are 'min' and 'max' (which way is better)."
            raise MisconfigurationError(msg)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            msg = f"SpikeDetection(window={window!r}) is invalid; pass the number of losses to average (>= 1)."
            raise MisconfigurationError(msg)
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.last_val: float = 0.0
        self.bad_batches: list[int] = []
        self._recent: deque[float] = deque(maxlen=window)

    @property
    def running_mean(self) -> float:
        """Mean of the last ``window`` accepted losses (NaN before the first)."""
        return sum(self._recent) / len(self._recent) if self._recent else float("nan")

    @torch.no_grad()
    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Check this batch's loss; agree across ranks; raise on a spike anywhere."""
        if isinstance(outputs, torch.Tensor):
            loss = outputs.detach()
        elif isinstance(outputs, Mapping) and "loss" in outputs:
            loss = outputs["loss"].detach()
        else:
            msg = (
                f"SpikeDetection needs the training loss, but training_step returned {type(outputs).__qualname__}; "
                "return the loss tensor or a dict with a 'loss' key."
            )
            raise TypeError(msg)
        path = os.fspath(self.exclude_batches_path or trainer.default_root_dir)
        if not path.endswith(".json"):
            path = os.path.join(path, "skip_batches.json")
        self.exclude_batches_path = path
        value = float(loss.float().mean())
        is_spike = batch_idx >= self.warmup and self._is_spike(value)
        strategy = trainer.strategy
        if strategy.reduce_boolean_decision(is_spike, all=False):
            self._handle_spike(trainer, batch_idx)
        finite = torch.isfinite(loss).all().item()
        if (self.finite_only or strategy.reduce_boolean_decision(bool(finite), all=True)) and finite:
            self._recent.append(value)
            self.last_val = value

    def _is_spike(self, value: float) -> bool:
        if self.finite_only and not math.isfinite(value):
            return True
        # Without finite_only the usual comparison decides, as in Lightning: +inf (min mode) is
        # far above the mean, so a spike; NaN compares false everywhere and -inf is an
        # improvement, so neither is one.
        diff = value - self.last_val
        if (diff <= 0) if self.mode == "min" else (diff >= 0):
            return False  # an improvement is never a spike
        mean = self.running_mean
        atol_hit = self.atol is None or abs(value - mean) >= abs(self.atol)
        rtol_hit = self.rtol is None or abs(value - mean) >= abs(self.rtol * mean)
        return atol_hit and rtol_hit

    def _handle_spike(self, trainer: TrainerView, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if trainer.is_global_zero:
            path = os.fspath(self.exclude_batches_path)  # type: ignore[arg-type]
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self.bad_batches, handle, indent=4)
        raise _spike_exception(batch_idx)

    def state_dict(self) -> dict[str, Any]:
        """The running mean's window and the batches found bad so far."""
        return {
            "last_val": self.last_val,
            "mode": self.mode,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "bad_batches": list(self.bad_batches),
            "bad_batches_path": None if self.exclude_batches_path is None else os.fspath(self.exclude_batches_path),
            "running": list(self._recent),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.last_val = state_dict["last_val"]
        self.mode = state_dict["mode"]
        self.warmup = state_dict["warmup"]
        self.atol = state_dict["atol"]
        self.rtol = state_dict["rtol"]
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict["bad_batches_path"]
        self._recent = deque(state_dict["running"], maxlen=self.window)
