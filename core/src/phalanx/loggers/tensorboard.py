"""TensorBoardLogger: scalars, hyperparameters and the model graph in TensorBoard event files.

Lightning's default logger, with its arguments and layout: files go to
``<save_dir>/<name>/version_<N>[/<sub_dir>]`` (``N`` the next free number), the Module's saved
hyperparameters go to the hparams plugin with a placeholder ``hp_metric`` (so the HPARAMS tab
shows the run) and to ``hparams.yaml`` beside the event file, and ``log_graph=True`` traces
``forward`` on ``Module.example_input_array`` once at the start of fit.

Writing uses ``torch.utils.tensorboard.SummaryWriter`` (which needs the ``tensorboard`` package:
``pip install 'phalanx-core[tensorboard]'``); anything ``tensorboard`` can read reads the files.
"""

from __future__ import annotations

import logging
import os
import re
from argparse import Namespace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError
from phalanx.loggers._backends import import_backend
from phalanx.loggers._params import add_prefix, convert_params, flatten_dict, sanitize_params
from phalanx.loggers.csv_logs import write_hparams_yaml
from phalanx.loggers.logger import Logger, rank_zero_experiment
from phalanx.utilities.rank_zero import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["TensorBoardLogger"]

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"^version_(\d+)$")


class TensorBoardLogger(Logger):
    r"""Log to TensorBoard event files under ``<save_dir>/<name>/version_<N>``.

    Args:
        save_dir: Root directory (a local path or an fsspec URL TensorBoard can write to).
        name: Experiment folder; default ``"lightning_logs"``. ``""`` or None puts versions directly
            in ``save_dir``.
        version: A fixed version: an int gives ``version_<int>``, a string is the folder name itself.
            None picks the next free ``version_N``.
        log_graph: Trace ``forward`` on ``Module.example_input_array`` and write the graph.
        default_hp_metric: Write the placeholder metric ``hp_metric = -1`` with the hyperparameters
            (TensorBoard's HPARAMS tab lists only runs with a metric); without it,
            ``log_hyperparams`` without ``metrics`` writes only ``hparams.yaml``.
        prefix: Put ``<prefix>-`` in front of every metric name.
        sub_dir: Extra folder below the version folder (``.../version_0/<sub_dir>``).
        **kwargs: Passed to ``SummaryWriter`` (``max_queue``, ``flush_secs``, ...).

    Raises:
        MissingBackendError: ``tensorboard`` is not installed (the message says what to install).
        MisconfigurationError: ``save_dir`` is not a path.
    """

    NAME_HPARAMS_FILE = "hparams.yaml"
    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        *,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        import_backend("tensorboard", logger="TensorBoardLogger", extra="tensorboard", distribution="tensorboard")
        if not isinstance(save_dir, (str, os.PathLike)):
            msg = f"TensorBoardLogger(save_dir={save_dir!r}) must be a path (str or os.PathLike); pass a folder."
            raise MisconfigurationError(msg)
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version
        self._log_graph = bool(log_graph)
        self._default_hp_metric = default_hp_metric
        self._prefix = prefix
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs
        self._experiment: SummaryWriter | None = None
        self._hparams_written: dict[str, Any] | None = None
        self.hparams: dict[str, Any] = {}

    # ------------------------------------------------------------------ where
    @property
    def name(self) -> str:
        """Experiment folder name."""
        return self._name

    @property
    def version(self) -> int | str:
        """This run's version; the next free integer, fixed on first access."""
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @property
    def save_dir(self) -> str:
        """The root directory given to the constructor."""
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``: where the ``version_N`` folders are."""
        return os.path.join(self._save_dir, self._name)

    @property
    def sub_dir(self) -> str | None:
        """The folder below the version folder, if any."""
        return self._sub_dir

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<name>/version_<N>[/<sub_dir>]`` (``~`` and ``$VARS`` expanded)."""
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        path = os.path.join(self.root_dir, folder)
        if self._sub_dir:
            path = os.path.join(path, self._sub_dir)
        return os.path.expanduser(os.path.expandvars(path))

    def _filesystem(self) -> Any:
        from fsspec.core import url_to_fs  # a torch dependency; paths are URLs

        return url_to_fs(self.root_dir)

    def _next_version(self) -> int:
        filesystem, root = self._filesystem()
        try:
            entries = filesystem.listdir(root, detail=True)
        except OSError:
            return 0
        found = [
            int(match.group(1))
            for entry in entries
            if entry.get("type") == "directory"
            and (match := _VERSION_DIR.match(os.path.basename(entry["name"].rstrip("/"))))
        ]
        return max(found) + 1 if found else 0

    # ------------------------------------------------------------------ the backend object
    @property
    @rank_zero_experiment
    def experiment(self) -> SummaryWriter:
        """The ``SummaryWriter`` (created on first use; a no-op stand-in on ranks other than 0).

        Use it for anything TensorBoard supports: ``logger.experiment.add_image(...)``.
        """
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            filesystem, root = self._filesystem()
            filesystem.makedirs(root, exist_ok=True)
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._kwargs)
        return self._experiment

    # ------------------------------------------------------------------ writing
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Write each value as a scalar at ``step`` (a dict value becomes one ``add_scalars`` group).

        Raises:
            ValueError: A value is neither a number, a one-element tensor nor a dict of them.
        """
        import torch

        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            number = value.item() if isinstance(value, torch.Tensor) else value
            if isinstance(number, Mapping):
                self.experiment.add_scalars(key, dict(number), step)
                continue
            try:
                self.experiment.add_scalar(key, number, step)
            except Exception as error:
                msg = (
                    f"TensorBoardLogger cannot write {key}={number!r}: only numbers, one-element tensors "
                    "or a dict of them are scalars. Fix: log a number, or use logger.experiment.add_* for other data."
                )
                raise ValueError(msg) from error

    @rank_zero_only
    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace | None, metrics: Mapping[str, Any] | float | None = None
    ) -> None:
        """Write ``params`` to the hparams plugin (with ``metrics``, or ``hp_metric=-1``) and ``hparams.yaml``.

        Args:
            params: The hyperparameters; nested dicts are flattened with ``/`` for TensorBoard,
                kept nested in ``hparams.yaml``.
            metrics: The metrics to show next to them in the HPARAMS tab; a number means
                ``{"hp_metric": number}``.
        """
        params = convert_params(params)
        self.hparams.update(params)
        flat = sanitize_params(flatten_dict(params))
        flat = {key: str(v) if getattr(v, "ndim", 0) > 1 else v for key, v in flat.items()}
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else {}
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if not metrics:
            return
        self.log_metrics(metrics, 0)
        from torch.utils.tensorboard.summary import hparams

        experiment, start, end = hparams(flat, dict(metrics))
        writer = self.experiment.file_writer  # open: log_metrics above wrote through it
        for summary in (experiment, start, end):
            writer.add_summary(summary)

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Write ``model``'s graph, traced on ``input_array`` (default ``model.example_input_array``).

        Does nothing unless the logger was made with ``log_graph=True``; warns and writes nothing
        when there is no input, or when it is neither a tensor nor a tuple of ``forward`` arguments.
        """
        if not self._log_graph:
            return
        import torch

        example = getattr(model, "example_input_array", None) if input_array is None else input_array
        if example is None:
            rank_zero_warn(
                "Could not log the computational graph to TensorBoard: set `model.example_input_array` "
                "or pass `input_array` to log_graph."
            )
            return
        if not isinstance(example, (torch.Tensor, tuple)):
            rank_zero_warn(
                f"Could not log the computational graph to TensorBoard: the input has type {type(example).__name__}, "
                "which TensorBoard cannot trace. Fix: make it a tensor or a tuple of forward()'s positional arguments."
            )
            return
        if callable(getattr(model, "transfer_batch_to_device", None)):  # a Module: put it where forward expects it
            example = model.on_before_batch_transfer(example, 0)
            example = model.transfer_batch_to_device(example, model.device, 0)
            example = model.on_after_batch_transfer(example, 0)
        self.experiment.add_graph(model, example)

    @rank_zero_only
    def save(self) -> None:
        """Flush the event file and write ``hparams.yaml`` beside it when the hyperparameters changed."""
        self.experiment.flush()
        filesystem, log_dir = self._filesystem()[0], self.log_dir
        if not filesystem.isdir(log_dir):
            return
        path = os.path.join(log_dir, self.NAME_HPARAMS_FILE)
        if self._hparams_written != self.hparams or not filesystem.isfile(path):
            write_hparams_yaml(path, self.hparams)
            self._hparams_written = dict(self.hparams)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Flush and close the event file (writing again, in a later stage, opens a new one in the same folder)."""
        if self._experiment is not None:
            self.save()
            self._experiment.close()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Nothing to do: TensorBoard does not store checkpoints."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_experiment"] = None  # a SummaryWriter holds a thread and an open file
        return state
