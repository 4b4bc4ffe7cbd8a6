"""LearningRateFinder: a learning-rate range test at fit start (Lightning's ``LearningRateFinder``).

Picking a learning rate by trial and error costs whole runs. The range test (L. Smith, "Cyclical
Learning Rates for Training Neural Networks") costs ``num_training_steps`` steps instead: train with
a rate rising from ``min_lr`` to ``max_lr``, record the (smoothed) loss at each rate, and suggest
the rate where the loss falls fastest. The model and the optimizer are put back exactly as they
were before the sweep, so the real training starts from the same initial weights, with only the
learning rate changed.

The sweep runs in ``on_fit_start``, when the strategy has set up the model (wrapped, on its
device) and the optimizer: each sweep step goes through the strategy's own ``training_step``,
``backward`` and ``optimizer_step``, so DDP's gradient all-reduce, the precision's scaling and
gradient clipping apply as in training. The Trainer's loop position is untouched (the sweep is
not part of fit's steps), which is the state Lightning restores after its sweep.

The schedule, the smoothing, the divergence test and the suggestion reproduce Lightning 2.6's
numbers: step ``k`` (from 0) uses ``min_lr`` for ``k == 0`` and ``min_lr * (max_lr/min_lr) **
((k+1)/N)`` after (``min_lr + (k+1)/N * (max_lr - min_lr)`` in linear mode); the recorded loss is
an exponential moving average (``beta=0.98``) with bias correction; the sweep stops once the
smoothed loss exceeds ``early_stop_threshold`` times the best one.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["LearningRateFinder"]

log = logging.getLogger(__name__)

_MODES = ("linear", "exponential")
_LR_ATTRS = ("lr", "learning_rate")
_BETA = 0.98  # Lightning's smoothing of the recorded loss


class _TunerExitException(Exception):
    """Raised by a finder run for :class:`phalanx.tuner.Tuner` once its search is done: the
    Tuner's short-lived search Trainer has nothing left to do, and the Tuner catches it."""


# ---------------------------------------------------------------------- attributes on the model
def _holder(model: Any, name: str, datamodule: Any = None) -> Any:
    """The object holding attribute ``name``: the model, its ``hparams``, or the DataModule (or None).

    Lightning's ``lightning_hasattr`` order: the model first, then ``model.hparams`` (a dict-like),
    then the DataModule.
    """
    if hasattr(model, name):
        return model
    hparams = getattr(model, "hparams", None)
    if isinstance(hparams, Mapping) and name in hparams:
        return hparams
    if datamodule is not None and hasattr(datamodule, name):
        return datamodule
    return None


def get_attr(model: Any, name: str, datamodule: Any = None) -> Any:
    """Read ``name`` from the model, its ``hparams`` or the DataModule (see :func:`_holder`)."""
    holder = _holder(model, name, datamodule)
    return holder[name] if isinstance(holder, Mapping) else getattr(holder, name)


def set_attr(model: Any, name: str, value: Any, datamodule: Any = None) -> None:
    """Write ``name`` where :func:`get_attr` reads it (the hparams entry too when both exist)."""
    holder = _holder(model, name, datamodule)
    if isinstance(holder, Mapping):
        holder[name] = value  # type: ignore[index]
        return
    setattr(holder, name, value)
    hparams = getattr(model, "hparams", None)
    if holder is model and isinstance(hparams, Mapping) and name in hparams:
        hparams[name] = value  # type: ignore[index]


@contextmanager
def muted_logging(module: Any) -> Iterator[None]:
    """Drop ``self.log`` calls while a finder runs steps outside the loop.

    The search's steps run from a hook (``setup``, ``on_fit_start``) where logging is not allowed,
    and their values must not reach the loggers anyway (Lightning swaps in a ``DummyLogger``).
    """

    def _drop(*args: Any, **kwargs: Any) -> None:
        return None

    module.log = _drop
    module.log_dict = _drop
    try:
        yield
    finally:
        del module.log
        del module.log_dict


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss in a ``training_step`` output (a tensor, a dict with ``"loss"``, or None)."""
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and "loss" in output:
        return output["loss"]  # type: ignore[no-any-return]
    msg = f"training_step returned {type(output).__name__}; return the loss tensor or a dict with a 'loss' key."
    raise MisconfigurationError(msg)


# ---------------------------------------------------------------------- the result
class _LRFinder:
    """What a range test found: ``results`` ({"lr": [...], "loss": [...]}), a suggestion, a plot.

    Args:
        mode: ``"exponential"`` or ``"linear"`` (how the rate rose; the plot uses a log axis for the former).
        lr_min: The first rate.
        lr_max: The last rate.
        num_training: Planned number of steps.
    """

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode = mode
        self.lr_min = lr_min
        self.lr_max = lr_max
        self.num_training = num_training
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The rate at the steepest descent of the loss (Lightning's rule), or None with too few points.

        The first ``skip_begin`` and last ``skip_end`` points are ignored (the start is noise, the
        end already diverges), as are non-finite losses; the gradient of the loss with respect to
        the rate is taken with ``torch.gradient`` on the remaining points.
        """
        losses = torch.tensor(self.results["loss"][skip_begin:-skip_end], dtype=torch.float64)
        lrs = torch.tensor(self.results["lr"][skip_begin:-skip_end], dtype=torch.float64)
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            log.error(
                "The learning rate finder has too few points to suggest a rate (%d usable). Fix: raise "
                "num_training, or give it more training batches.",
                len(losses),
            )
            self._optimal_idx = None
            return None
        gradients = torch.gradient(losses, spacing=[lrs])[0]
        steepest = int(torch.argmin(gradients).item())
        kept = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(kept[steepest].item())
        return self.results["lr"][self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """Plot loss against rate (matplotlib); ``suggest`` marks the suggestion with a red dot.

        Returns:
            The matplotlib Figure (the one holding ``ax`` when given).

        Raises:
            MisconfigurationError: matplotlib is not installed.
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as error:
            msg = (
                "LR finder plot(): matplotlib is not installed. Fix: `pip install -U matplotlib`, or read the "
                "numbers from lr_finder.results."
            )
            raise MisconfigurationError(msg) from error
        lrs, losses = self.results["lr"], self.results["loss"]
        if ax is None:
            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion() is not None and self._optimal_idx is not None:
            ax.plot(lrs[self._optimal_idx], losses[self._optimal_idx], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


def lr_at(step: int, *, mode: str, min_lr: float, max_lr: float, num_training: int) -> float:
    """The rate of sweep step ``step`` (from 0), as Lightning's ``_ExponentialLR`` / ``_LinearLR`` give it."""
    if step == 0:
        return min_lr
    fraction = (step + 1) / num_training
    if mode == "linear":
        return min_lr + fraction * (max_lr - min_lr)
    return float(min_lr * (max_lr / min_lr) ** fraction)


# ---------------------------------------------------------------------- the callback
class LearningRateFinder(Callback):
    """Run a learning-rate range test when fit starts, and (``update_attr``) train with its suggestion.

    Args:
        min_lr: The first rate tried.
        max_lr: The last rate tried.
        num_training_steps: Steps of the sweep (rates tried).
        mode: ``"exponential"`` (rates evenly spaced on a log scale) or ``"linear"``.
        early_stop_threshold: Stop the sweep once the smoothed loss exceeds this times the best one
            (None: never stop early).
        update_attr: Write the suggestion to the Module's ``lr`` / ``learning_rate`` (or
            ``attr_name``; also found in ``hparams``) and to the optimizer's param groups.
        attr_name: The attribute holding the rate, when it is neither ``lr`` nor ``learning_rate``.
        exit_after_search: End the stage right after the sweep (what :class:`phalanx.tuner.Tuner`
            uses; a phalanx addition, Lightning sets a private flag instead).

    Attributes:
        optimal_lr: The :class:`_LRFinder` with the results of the last sweep (None before).

    Raises:
        MisconfigurationError: An invalid argument; the Module has more than one optimizer; or
            ``update_attr`` is set and no learning-rate attribute exists.
    """

    SUPPORTED_MODES = _MODES

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
        *,
        exit_after_search: bool = False,
    ) -> None:
        if mode not in _MODES:
            msg = f"LearningRateFinder(mode={mode!r}) is invalid; valid values are {list(_MODES)}. Fix: pass mode='exponential'."
            raise MisconfigurationError(msg)
        if not (0 < min_lr < max_lr):
            msg = (
                f"LearningRateFinder(min_lr={min_lr}, max_lr={max_lr}) needs 0 < min_lr < max_lr; pass e.g. "
                "min_lr=1e-8, max_lr=1."
            )
            raise MisconfigurationError(msg)
        if isinstance(num_training_steps, bool) or not isinstance(num_training_steps, int) or num_training_steps < 1:
            msg = f"LearningRateFinder(num_training_steps={num_training_steps!r}) must be an int >= 1, e.g. 100."
            raise MisconfigurationError(msg)
        self._min_lr = float(min_lr)
        self._max_lr = float(max_lr)
        self._num_training_steps = num_training_steps
        self._mode = mode
        self._early_stop_threshold = early_stop_threshold
        self._update_attr = update_attr
        self._attr_name = attr_name
        self.exit_after_search = exit_after_search
        self.optimal_lr: _LRFinder | None = None

    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Run the sweep before the first training batch."""
        self.lr_find(trainer, pl_module)
        if self.exit_after_search:
            raise _TunerExitException

    def lr_find(self, trainer: TrainerView, pl_module: Module) -> _LRFinder | None:
        """Sweep, restore the initial model and optimizer state, then apply the suggestion.

        Returns:
            The :class:`_LRFinder` (also in :attr:`optimal_lr`), or None in a ``fast_dev_run``.
        """
        if trainer.fast_dev_run:
            rank_zero_warn("Skipping learning rate finder since `fast_dev_run` is enabled.")
            return None
        attr = self._lr_attr(pl_module) if self._update_attr else ""
        optimizers = trainer.optimizers
        if len(optimizers) != 1:
            msg = (
                f"LearningRateFinder needs exactly one optimizer, but configure_optimizers returned {len(optimizers)}. "
                "Fix: return one optimizer, or run the finder on a model with one."
            )
            raise MisconfigurationError(msg)
        optimizer = optimizers[0]
        saved_model = {key: value.detach().clone() for key, value in pl_module.state_dict().items()}
        saved_optimizer = copy.deepcopy(optimizer.state_dict())
        was_training = pl_module.training
        finder = _LRFinder(self._mode, self._min_lr, self._max_lr, self._num_training_steps)
        try:
            pl_module.train()
            with muted_logging(pl_module):
                self._sweep(trainer, pl_module, optimizer, finder)
        finally:
            pl_module.load_state_dict(saved_model)
            optimizer.load_state_dict(saved_optimizer)
            optimizer.zero_grad(set_to_none=True)
            pl_module.train(was_training)
        finder.results = trainer.strategy.broadcast(finder.results)  # every rank suggests the same rate
        self.optimal_lr = finder
        if attr:
            lr = finder.suggestion()
            if lr is not None:
                set_attr(pl_module, attr, lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                log.info("Learning rate set to %s", lr)
        return finder

    def _lr_attr(self, pl_module: Module) -> str:
        names = (self._attr_name,) if self._attr_name else _LR_ATTRS
        for name in names:
            if _holder(pl_module, name) is not None:
                return name
        msg = (
            f"LearningRateFinder(update_attr=True) found none of {list(names)} on {type(pl_module).__qualname__} "
            "or its hparams. Fix: store the rate in self.lr (or self.learning_rate) and read it in "
            "configure_optimizers, pass attr_name='<your attribute>', or pass update_attr=False."
        )
        raise MisconfigurationError(msg)

    def _batches(self, trainer: TrainerView) -> Iterator[Any]:
        """Training batches for the sweep: epochs of the training data, within ``max_epochs``."""
        loader = trainer.train_dataloader
        per_epoch = trainer.num_training_batches
        epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs > 0 else math.inf
        epoch = 0
        while epoch < epochs:
            for index, batch in enumerate(loader):
                if index >= per_epoch:
                    break
                yield batch
            epoch += 1

    def _sweep(self, trainer: TrainerView, pl_module: Module, optimizer: Any, finder: _LRFinder) -> None:
        """The range test: one optimizer step per batch at the scheduled rate; records lr and smoothed loss."""
        strategy = trainer.strategy
        avg_loss, best_loss = 0.0, 0.0
        batches = self._batches(trainer)
        for step in range(self._num_training_steps):
            batch = next(batches, None)
            if batch is None:
                break
            lr = lr_at(
                step, mode=self._mode, min_lr=self._min_lr, max_lr=self._max_lr, num_training=self._num_training_steps
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = strategy.batch_to_device(batch)
            loss = self._step(strategy, pl_module, optimizer, batch, step)
            finder.results["lr"].append(lr)
            if loss is None:  # a skipped batch: NaN is ignored by the suggestion
                finder.results["loss"].append(float("nan"))
                continue
            current = float(loss.detach().float().item())
            count = step + 1  # Lightning's global_step after this step
            avg_loss = _BETA * avg_loss + (1 - _BETA) * current
            smoothed = avg_loss / (1 - _BETA ** (count + 1))
            threshold = self._early_stop_threshold
            diverged = threshold is not None and count > 1 and smoothed > threshold * best_loss
            if smoothed < best_loss or count == 1:
                best_loss = smoothed
            finder.results["loss"].append(smoothed)
            if strategy.broadcast(diverged):  # rank 0 decides, so every rank stops at the same step
                log.info("LR finder stopped early after %d steps due to diverging loss.", count)
                break

    @staticmethod
    def _step(strategy: Any, pl_module: Module, optimizer: Any, batch: Any, batch_idx: int) -> torch.Tensor | None:
        """One optimizer step through the strategy (its wrapper, precision and clipping)."""
        losses: list[torch.Tensor | None] = []

        def closure() -> torch.Tensor | None:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(strategy.training_step(batch, batch_idx))
            losses.append(loss)
            if loss is not None:
                strategy.backward(loss, optimizer)
            return loss

        strategy.optimizer_step(optimizer, closure, pl_module)
        return losses[-1] if losses else None
