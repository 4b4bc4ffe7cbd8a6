"""The DataModule: the data of a run (download, splits, dataloaders) in one reusable object.

``trainer.fit(model, datamodule=dm)`` takes the dataloaders from ``dm`` instead of the Module, and
runs its hooks where Lightning runs them: ``prepare_data`` once per machine (local rank 0; once in
the whole job with ``prepare_data_per_node = False``) before the ranks wait at a barrier, then
``setup(stage)`` and, at the end, ``teardown(stage)`` on every rank. Its ``state_dict`` is saved in
checkpoints and given back to ``load_state_dict`` on resume; ``save_hyperparameters`` records its
``__init__`` arguments in checkpoints, as for a Module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError
from phalanx.hparams import HyperparametersMixin
from phalanx.saving import restricted_classmethod

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["DataModule"]

#: The dataloader methods, by the entry point that reads them.
DATALOADER_METHODS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")


class DataModule(HyperparametersMixin):
    """Base class for the data of a run; override the dataloader methods the stages need.

    Attributes:
        prepare_data_per_node: ``True`` (default): ``prepare_data`` runs on local rank 0 of every
            machine (each has its own disk); ``False``: only on global rank 0 (a shared filesystem).
        trainer: The Trainer the DataModule is attached to (None outside a stage).
    """

    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    name: str | None = None
    prepare_data_per_node: bool = True
    allow_zero_length_dataloader_with_multiple_devices: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.trainer: TrainerView | None = None

    # ------------------------------------------------------------------ hooks
    def prepare_data(self) -> None:
        """Download or write data to disk; runs in one process per machine, before :meth:`setup`."""

    def setup(self, stage: str) -> None:
        """Build datasets and splits; runs on every rank at the start of ``"fit"``/``"validate"``/``"test"``/``"predict"``."""

    def teardown(self, stage: str) -> None:
        """Release what :meth:`setup` made; runs on every rank at the end of a stage."""

    def train_dataloader(self) -> Any:
        """The training data (a DataLoader or an iterable of batches)."""
        raise _undefined(self, "train_dataloader", "fit")

    def val_dataloader(self) -> Any:
        """The validation data: one dataloader or a list of them."""
        raise _undefined(self, "val_dataloader", "validate")

    def test_dataloader(self) -> Any:
        """The test data: one dataloader or a list of them."""
        raise _undefined(self, "test_dataloader", "test")

    def predict_dataloader(self) -> Any:
        """The data to predict on: one dataloader or a list of them."""
        raise _undefined(self, "predict_dataloader", "predict")

    def on_exception(self, exception: BaseException) -> None:
        """Called on every rank when the stage raised."""

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Extra state to save in checkpoints (e.g. a data pipeline's position); empty by default."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (called when a run resumes from a checkpoint)."""

    # ------------------------------------------------------------------ construction
    @restricted_classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: Any,
        map_location: Any = None,
        hparams_file: Any = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Rebuild the DataModule from the hyperparameters a checkpoint saved (and its ``state_dict``).

        Args:
            checkpoint_path: A checkpoint file or a checkpoint directory of any installed strategy.
            map_location: Where tensors in its state go, as for ``torch.load``.
            hparams_file: A ``.yaml``/``.csv`` file whose hyperparameters replace the checkpoint's.
            weights_only: Load with ``torch.load(weights_only=...)`` (default True).
            **kwargs: ``__init__`` arguments that override (or complete) the saved ones.

        Raises:
            CheckpointError: The checkpoint is missing, corrupt or unrecognised.
            MisconfigurationError: An ``__init__`` argument is neither saved nor given.
        """
        from phalanx.saving import load_from_checkpoint

        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, None, weights_only, **kwargs)

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Any = None,
        val_dataset: Any = None,
        test_dataset: Any = None,
        predict_dataset: Any = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **dataloader_kwargs: Any,
    ) -> DataModule:
        """A DataModule over ready datasets (each may be one dataset or a list of them).

        The training data is shuffled; the others are not. ``dataloader_kwargs`` go to every
        ``torch.utils.data.DataLoader``.
        """
        from torch.utils.data import DataLoader

        def loaders(dataset: Any, shuffle: bool) -> Any:
            make = lambda d: DataLoader(d, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, **dataloader_kwargs)  # noqa: E731
            return [make(d) for d in dataset] if isinstance(dataset, (list, tuple)) else make(dataset)

        datamodule = cls()
        given = {
            "train_dataloader": (train_dataset, True),
            "val_dataloader": (val_dataset, False),
            "test_dataloader": (test_dataset, False),
            "predict_dataloader": (predict_dataset, False),
        }
        for method, (dataset, shuffle) in given.items():
            if dataset is not None:
                setattr(datamodule, method, lambda dataset=dataset, shuffle=shuffle: loaders(dataset, shuffle))
        return datamodule


def _undefined(datamodule: DataModule, method: str, stage: str) -> MisconfigurationError:
    return MisconfigurationError(
        f"{type(datamodule).__qualname__}.{method}() is not defined, and {stage}() needs it; define "
        f"`def {method}(self)` returning a DataLoader, or pass the dataloader to trainer.{stage}()."
    )
