"""Tuner: run the LR finder or the batch-size finder once, before ``trainer.fit`` (Lightning's ``Tuner``).

Lightning runs the search inside the user's Trainer and then puts its loop, callbacks and loggers
back. Here the search runs in a short-lived *search Trainer* built from the user's one (same
strategy, accelerator, devices and loop arguments; no loggers, checkpoints, progress bar or sanity
check, and only the finder as callback), so the user's Trainer is never touched: its step counter,
log directory and callbacks are exactly as before, and the ``trainer.fit(model)`` that follows
starts from scratch, with the tuned attribute and the original weights.
"""

from __future__ import annotations

from typing import Any

from phalanx.callbacks.batch_size_finder import BatchSizeFinder
from phalanx.callbacks.callback import Callback
from phalanx.callbacks.lr_finder import LearningRateFinder, _LRFinder, _TunerExitException
from phalanx.errors import MisconfigurationError
from phalanx.trainer.trainer import Trainer

__all__ = ["Tuner"]

_METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """Tune a Module's learning rate or batch size with the settings of ``trainer``.

    Args:
        trainer: The Trainer that will train the model afterwards (left unchanged).
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def lr_find(
        self,
        model: Any,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: Any = None,
        method: str = "fit",
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> _LRFinder | None:
        """Learning-rate range test; see :class:`~phalanx.callbacks.lr_finder.LearningRateFinder`.

        Returns:
            The result (``.results``, ``.suggestion()``, ``.plot()``), or None in a ``fast_dev_run``.
            With ``update_attr`` the suggestion is written to ``model.lr`` / ``model.learning_rate``.

        Raises:
            MisconfigurationError: ``method`` is not ``"fit"``, the Trainer already has a
                LearningRateFinder, or the finder's own checks fail.
        """
        if method != "fit":
            msg = f"Tuner.lr_find(method={method!r}) is invalid: the LR finder trains, so only method='fit' works."
            raise MisconfigurationError(msg)
        _check_loaders(method, train_dataloaders, val_dataloaders, dataloaders)
        self._check_no_callback(LearningRateFinder, "lr_find")
        finder = LearningRateFinder(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=update_attr,
            attr_name=attr_name,
            exit_after_search=True,
        )
        self._search(finder, model, train_dataloaders, val_dataloaders, datamodule)
        return finder.optimal_lr

    def scale_batch_size(
        self,
        model: Any,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: Any = None,
        method: str = "fit",
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
    ) -> int | None:
        """Largest batch size that trains without an out-of-memory error; see
        :class:`~phalanx.callbacks.batch_size_finder.BatchSizeFinder`.

        Returns:
            The size found (also written to ``batch_arg_name``), or None in a ``fast_dev_run``.

        Raises:
            MisconfigurationError: ``method`` is not ``"fit"`` (the only one phalanx supports), the
                Trainer already has a BatchSizeFinder, or the finder's own checks fail.
        """
        if method != "fit":
            valid = "'fit'" if method in _METHODS else f"'fit' (Lightning's choices are {list(_METHODS)})"
            msg = (
                f"Tuner.scale_batch_size(method={method!r}) is not supported; valid: {valid}. Fix: search with "
                "method='fit'; a size that trains also fits evaluation, which needs less memory."
            )
            raise MisconfigurationError(msg)
        _check_loaders(method, train_dataloaders, val_dataloaders, dataloaders)
        self._check_no_callback(BatchSizeFinder, "scale_batch_size")
        finder = BatchSizeFinder(
            mode=mode,
            steps_per_trial=steps_per_trial,
            init_val=init_val,
            max_trials=max_trials,
            batch_arg_name=batch_arg_name,
            exit_after_search=True,
        )
        self._search(finder, model, train_dataloaders, val_dataloaders, datamodule)
        return finder.optimal_batch_size

    # ------------------------------------------------------------------ helpers
    def _check_no_callback(self, kind: type[Callback], action: str) -> None:
        if any(isinstance(callback, kind) for callback in self.trainer.callbacks):
            msg = (
                f"The Trainer already has a {kind.__name__} callback, which runs the same search at fit start. "
                f"Fix: remove it from Trainer(callbacks=...) to use Tuner.{action}, or drop the Tuner call."
            )
            raise MisconfigurationError(msg)

    def _search(self, finder: Callback, model: Any, train: Any, val: Any, datamodule: Any) -> None:
        """Run ``finder`` in a search Trainer; it ends the stage with an exception once done."""
        search = _search_trainer(self.trainer, finder)
        try:
            search.fit(model, train, val, datamodule)
        except _TunerExitException:
            pass
        finally:
            model.trainer = self.trainer


def _search_trainer(trainer: Trainer, finder: Callback) -> Trainer:
    """A Trainer like ``trainer`` for the search: same hardware and loop arguments, nothing written."""
    config = trainer.config
    return Trainer(
        accelerator=trainer.accelerator,
        strategy=trainer.strategy,
        devices=trainer.num_devices,
        num_nodes=config.num_nodes,
        callbacks=[finder],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        fast_dev_run=config.fast_dev_run,
        max_epochs=config.max_epochs,
        limit_train_batches=config.limit_train_batches,
        overfit_batches=config.overfit_batches,
        accumulate_grad_batches=config.accumulate_grad_batches,
        gradient_clip_val=config.gradient_clip_val,
        gradient_clip_algorithm=config.gradient_clip_algorithm,
        deterministic=config.deterministic,
        use_distributed_sampler=config.use_distributed_sampler,
        inference_mode=config.inference_mode,
        default_root_dir=config.default_root_dir,
    )


def _check_loaders(method: str, train: Any, val: Any, dataloaders: Any) -> None:
    if method == "fit" and dataloaders is not None:
        msg = (
            "Tuner with method='fit' got dataloaders=...; pass train_dataloaders= and val_dataloaders= instead "
            "(dataloaders= is for validate/test/predict)."
        )
        raise MisconfigurationError(msg)
