"""MLFlowLogger: metrics, parameters, tags and (optionally) checkpoints in an MLflow run.

Lightning's arguments and behaviour: the run is created in experiment ``experiment_name``
(made if missing) on first use, or an existing run is continued with ``run_id``; metrics are
logged with their step, hyperparameters as run params (flattened with ``/``, values as strings
cut to MLflow's length limit), and ``log_model`` uploads ModelCheckpoint files as artifacts.
Without ``tracking_uri`` (or ``MLFLOW_TRACKING_URI``) the run goes to the local file store
``file:<save_dir>``, readable with ``MlflowClient("file:<save_dir>")`` or ``mlflow ui``.

Needs ``mlflow`` or ``mlflow-skinny``: ``pip install 'phalanx-core[mlflow]'``.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from phalanx.errors import MisconfigurationError
from phalanx.loggers._backends import import_backend
from phalanx.loggers._checkpoint_uploads import CheckpointUploads
from phalanx.loggers._params import add_prefix, convert_params, flatten_dict
from phalanx.loggers.logger import Logger, rank_zero_experiment
from phalanx.utilities.paths import is_remote
from phalanx.utilities.rank_zero import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = ["MLFlowLogger"]

log = logging.getLogger(__name__)
LOCAL_FILE_URI_PREFIX = "file:"
_RUN_NAME_TAG = "mlflow.runName"


class MLFlowLogger(CheckpointUploads, Logger):
    """Log to MLflow.

    Args:
        experiment_name: The MLflow experiment (created when missing); default ``"lightning_logs"``.
        run_name: The run's display name (the ``mlflow.runName`` tag; overrides one in ``tags``).
        tracking_uri: The tracking store or server; default ``MLFLOW_TRACKING_URI`` or ``file:<save_dir>``.
        tags: Tags of the new run.
        save_dir: Local folder of the default file store (ignored when ``tracking_uri`` is given).
        log_model: Upload ModelCheckpoint files as artifacts: ``"all"`` after every save, True at
            the end of fit (after every save with ``save_top_k=-1``), False never.
        checkpoint_path_prefix: Artifact folder prefix for uploaded checkpoints.
        prefix: Put ``<prefix>-`` in front of every metric name.
        artifact_location: Where a newly created experiment stores artifacts (default: the server's choice).
        run_id: Continue this existing run instead of creating one.
        synchronous: Passed to MLflow's ``log_batch`` (None: MLflow's default).

    Raises:
        MissingBackendError: Neither ``mlflow`` nor ``mlflow-skinny`` is installed.
        MisconfigurationError: An invalid ``log_model``, or a ``file:`` store that this MLflow
            refuses to open (the message says how to allow it or which store to use instead).
    """

    checkpoint_setting_names = (*CheckpointUploads.checkpoint_setting_names, "every_n_epochs")
    checkpoint_settings_key = "Checkpoint"

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        *,
        tags: dict[str, Any] | None = None,
        save_dir: str | os.PathLike[str] | None = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        checkpoint_path_prefix: str = "",
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
    ) -> None:
        import_backend("mlflow", logger="MLFlowLogger", extra="mlflow", distribution="mlflow-skinny")
        if log_model not in (True, False, "all"):
            msg = f"MLFlowLogger(log_model={log_model!r}) is invalid; choose True, False or 'all'."
            raise MisconfigurationError(msg)
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            if save_dir is not None and is_remote(save_dir):
                msg = (
                    f"MLFlowLogger(save_dir={os.fspath(save_dir)!r}): save_dir is the folder of MLflow's local file "
                    "store, so it cannot be a URL. Fix: pass a local folder, or tracking_uri= for a tracking server "
                    "(whose artifact store may be a bucket)."
                )
                raise MisconfigurationError(msg)
            tracking_uri = f"{LOCAL_FILE_URI_PREFIX}{os.fspath(save_dir or './mlruns')}"
        self._experiment_name = experiment_name
        self._experiment_id: str | None = None
        self._tracking_uri = tracking_uri
        self._run_name = run_name
        self._run_id = run_id
        self.tags = dict(tags) if tags else None
        self._log_model = log_model
        self._logged_model_time: dict[str, float] = {}
        self._checkpoint_callbacks: dict[int, Any] = {}
        self._checkpoint_path_prefix = checkpoint_path_prefix
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._log_batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._initialized = False
        self._mlflow_client = _client(tracking_uri)

    # ------------------------------------------------------------------ the backend object
    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        """The ``MlflowClient``; the experiment and the run exist once this returns (rank 0 only).

        Use it for anything MLflow supports: ``logger.experiment.log_text(logger.run_id, ...)``.
        """
        if self._initialized:
            return self._mlflow_client
        client = self._mlflow_client
        if self._run_id is not None:
            self._experiment_id = client.get_run(self._run_id).info.experiment_id
            self._initialized = True
            return client
        if self._experiment_id is None:
            found = client.get_experiment_by_name(self._experiment_name)
            if found is not None:
                self._experiment_id = found.experiment_id
            else:
                log.info("MLflow experiment %r not found; creating it.", self._experiment_name)
                self._experiment_id = client.create_experiment(
                    name=self._experiment_name, artifact_location=self._artifact_location
                )
        tags = dict(self.tags or {})
        if self._run_name is not None:
            if _RUN_NAME_TAG in tags:
                log.warning("The tag %s in `tags` is overridden by run_name=%r.", _RUN_NAME_TAG, self._run_name)
            tags[_RUN_NAME_TAG] = self._run_name
        from mlflow.tracking.context.registry import resolve_tags

        run = client.create_run(experiment_id=self._experiment_id, tags=resolve_tags(tags))
        self._run_id = run.info.run_id
        self.tags = tags
        self._initialized = True
        return client

    @property
    def run_id(self) -> str | None:
        """The run's id (creates the run on first access)."""
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id (creates the experiment and the run on first access)."""
        _ = self.experiment
        return self._experiment_id

    @property
    def name(self) -> str | None:  # type: ignore[override]
        """The experiment id (as in Lightning)."""
        return self.experiment_id

    @property
    def version(self) -> str | None:  # type: ignore[override]
        """The run id (as in Lightning)."""
        return self.run_id

    @property
    def save_dir(self) -> str | None:
        """The file store's root folder when the tracking URI is local (``file:...``), else None."""
        if self._tracking_uri.startswith(LOCAL_FILE_URI_PREFIX):
            return self._tracking_uri[len(LOCAL_FILE_URI_PREFIX) :]
        return None

    @property
    def log_dir(self) -> str | None:
        """``<save_dir>/<experiment id>/<run id>``: the run's folder in a local file store, else None.

        ``trainer.log_dir`` follows it, so checkpoints go to ``<run folder>/checkpoints``, where
        Lightning puts them for this logger.
        """
        root = self.save_dir
        if root is None or self.name is None or self.version is None:
            return None
        return os.path.join(root, str(self.name), str(self.version))

    # ------------------------------------------------------------------ writing
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None, *args: Any, **kwargs: Any) -> None:
        """Record ``params`` as run params: flattened with ``/``, values as strings (100 per request)."""
        from mlflow.entities import Param

        flat = flatten_dict(convert_params(params))
        limit = _max_param_length()
        batch = [Param(key=key, value=str(value)[:limit]) for key, value in flat.items()]
        for start in range(0, len(batch), 100):
            self.experiment.log_batch(run_id=self.run_id, params=batch[start : start + 100], **self._log_batch_kwargs)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Record ``metrics`` at ``step`` (0 when None); characters MLflow rejects are removed from names."""
        import torch
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        batch: list[Metric] = []
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, str):
                log.warning("Discarding metric with string value %s=%s.", key, value)
                continue
            clean = re.sub(r"[^a-zA-Z0-9_/. -]+", "", key)
            if clean != key:
                rank_zero_warn(
                    f"MLflow allows only '_', '/', '.', '-' and ' ' besides letters and digits in metric names; "
                    f"logging {key!r} as {clean!r}.",
                    category=RuntimeWarning,
                )
            number = value.item() if isinstance(value, torch.Tensor) else value
            batch.append(Metric(key=clean, value=number, timestamp=timestamp_ms, step=step or 0))
        self.experiment.log_batch(run_id=self.run_id, metrics=batch, **self._log_batch_kwargs)

    @rank_zero_only
    def save(self) -> None:
        """Create the experiment and the run now, so ``log_dir`` and ``version`` are known before fit."""
        _ = self.experiment

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """Upload pending checkpoints (``log_model=True``) and mark the run FINISHED or FAILED."""
        if not self._initialized:
            return
        mlflow_status = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}.get(status, status)
        self._upload_pending_checkpoints()
        if self.experiment.get_run(self.run_id):
            self.experiment.set_terminated(self.run_id, mlflow_status)

    def _upload_checkpoint(self, path: str, metadata: dict[str, Any], aliases: list[str]) -> None:
        import yaml

        artifact_path = (Path(self._checkpoint_path_prefix) / Path(path).stem).as_posix()
        self.experiment.log_artifact(self.run_id, path, artifact_path)
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "metadata.yaml").write_text(yaml.safe_dump(metadata, default_flow_style=False))
            (Path(folder) / "aliases.txt").write_text(str(aliases))
            self.experiment.log_artifacts(self.run_id, folder, artifact_path)


def _client(tracking_uri: str) -> MlflowClient:
    """An ``MlflowClient`` for ``tracking_uri``; a ``file:`` store this MLflow refuses becomes a clear error."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient(tracking_uri)
    except MlflowException as error:
        if "MLFLOW_ALLOW_FILE_STORE" not in str(error):
            raise
        msg = (
            f"MLFlowLogger(tracking_uri={tracking_uri!r}): this MLflow keeps its file store in maintenance "
            "mode and opens it only with MLFLOW_ALLOW_FILE_STORE=true. Fix: export MLFLOW_ALLOW_FILE_STORE=true "
            "to keep the local folder, or pass tracking_uri='sqlite:///mlflow.db' (pip install mlflow for "
            "SQLAlchemy) or the URL of a tracking server ('http://host:5000')."
        )
        raise MisconfigurationError(msg) from error


def _max_param_length() -> int:
    """The longest param value MLflow stores (250 on old versions without the constant)."""
    from mlflow.utils import validation

    return int(getattr(validation, "MAX_PARAM_VAL_LENGTH", 250))
