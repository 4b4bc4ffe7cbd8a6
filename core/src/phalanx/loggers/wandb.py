"""WandbLogger: metrics, config and (optionally) checkpoints in a Weights & Biases run.

Lightning's arguments and behaviour: the run starts on first use (``wandb.init`` with
``project``/``name``/``id``/``dir`` and any extra keyword), metrics are logged against the
custom x-axis ``trainer/global_step`` (so ``step`` can repeat or go back, which W&B's own step
may not), hyperparameters go to ``run.config``, and ``log_model`` uploads ModelCheckpoint files
as ``model`` artifacts with ``latest``/``best`` aliases. ``offline=True`` writes the run under
``<save_dir>/wandb/offline-run-*`` for a later ``wandb sync``, with no network.

Needs ``wandb``: ``pip install 'phalanx-core[wandb]'``.
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from phalanx.errors import MisconfigurationError
from phalanx.loggers._backends import import_backend
from phalanx.loggers._checkpoint_uploads import CheckpointUploads
from phalanx.loggers._params import add_prefix, convert_params, sanitize_callables
from phalanx.loggers.logger import Logger, rank_zero_experiment
from phalanx.utilities.paths import is_remote
from phalanx.utilities.rank_zero import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from torch import nn

__all__ = ["WandbLogger"]

_STEP_KEY = "trainer/global_step"


class WandbLogger(CheckpointUploads, Logger):
    r"""Log to Weights & Biases.

    Args:
        name: The run's display name.
        save_dir: Folder for W&B's local files (``<save_dir>/wandb/...``); default ``"."``.
        version: The run id, to resume or name a run (same as ``id``).
        offline: Write the run locally only (``wandb sync`` uploads it later).
        dir: Same as ``save_dir`` (used when ``save_dir`` is None).
        id: Same as ``version``.
        anonymous: Allow anonymous logging.
        project: The W&B project; default ``WANDB_PROJECT`` or ``"lightning_logs"``.
        log_model: Upload ModelCheckpoint files as artifacts: ``"all"`` after every save, True at
            the end of fit (after every save with ``save_top_k=-1``), False never.
        experiment: An existing run to log to instead of starting one.
        prefix: Put ``<prefix>-`` in front of every metric name.
        checkpoint_name: Artifact name for checkpoints; default ``model-<run id>``.
        **kwargs: Passed to ``wandb.init`` (``entity``, ``group``, ``tags``, ``settings``, ...).

    Raises:
        MissingBackendError: ``wandb`` is not installed.
        MisconfigurationError: ``offline=True`` with ``log_model`` (checkpoints cannot be uploaded
            offline), or an invalid ``log_model``.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike[str] | None = ".",
        version: str | None = None,
        offline: bool = False,
        *,
        dir: str | os.PathLike[str] | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Literal["all"] | bool = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        import_backend("wandb", logger="WandbLogger", extra="wandb", distribution="wandb")
        if log_model not in (True, False, "all"):
            msg = f"WandbLogger(log_model={log_model!r}) is invalid; choose True, False or 'all'."
            raise MisconfigurationError(msg)
        if offline and log_model:
            msg = (
                f"WandbLogger(log_model={log_model!r}, offline=True) cannot work: checkpoints cannot be uploaded "
                "in offline mode. Fix: pass offline=False to log your model, or log_model=False."
            )
            raise MisconfigurationError(msg)
        self._offline = offline
        self._log_model = log_model
        self._prefix = prefix
        self._experiment = experiment
        self._logged_model_time: dict[str, float] = {}
        self._checkpoint_callbacks: dict[int, Any] = {}
        folder = save_dir if save_dir is not None else dir
        if folder is not None and is_remote(folder):
            msg = (
                f"WandbLogger(save_dir={os.fspath(folder)!r}): W&B keeps its run files in a local folder and the run "
                "on its server, so a URL cannot be its save_dir. Fix: pass a local folder (save_dir='wandb_runs'); "
                "checkpoints can still go to the store with ModelCheckpoint(dirpath=...)."
            )
            raise MisconfigurationError(msg)
        self._wandb_init: dict[str, Any] = {
            "name": name,
            "project": project or os.environ.get("WANDB_PROJECT", "lightning_logs"),
            "dir": None if folder is None else os.fspath(folder),
            "id": version or id,
            "resume": "allow",
        }
        if anonymous is not None:  # wandb warns about the setting whenever it is passed
            self._wandb_init["anonymous"] = "allow" if anonymous else None
        if offline:
            self._wandb_init["mode"] = "offline"  # per run: no process-wide WANDB_MODE change
        self._wandb_init.update(kwargs)
        self._project: str | None = self._wandb_init.get("project")
        self._save_dir: str | None = self._wandb_init.get("dir")
        self._name: str | None = self._wandb_init.get("name")
        self._id: str | None = self._wandb_init.get("id")
        self._checkpoint_name = checkpoint_name

    # ------------------------------------------------------------------ the backend object
    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``wandb`` Run (started on first use; a no-op stand-in on ranks other than 0).

        An active run (``wandb.run``, started before) is reused, with a warning, as Lightning does.
        """
        if self._experiment is None:
            import wandb

            if wandb.run is not None:
                rank_zero_warn(
                    "There is a wandb run already in progress and newly created instances of `WandbLogger` will "
                    "reuse this run. If this is not desired, call `wandb.finish()` before instantiating `WandbLogger`."
                )
                self._experiment = wandb.run
            else:
                if self._save_dir is not None:
                    os.makedirs(self._save_dir, exist_ok=True)  # wandb falls back to a temp folder otherwise
                self._experiment = wandb.init(**self._wandb_init)
                if callable(getattr(self._experiment, "define_metric", None)):
                    self._experiment.define_metric(_STEP_KEY)
                    self._experiment.define_metric("*", step_metric=_STEP_KEY, step_sync=True)
        return self._experiment

    def watch(
        self, model: nn.Module, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True
    ) -> None:
        """Let W&B record gradients (``log="all"``: also parameters) and the graph of ``model``."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    @property
    def save_dir(self) -> str | None:
        """The folder of W&B's local files."""
        return self._save_dir

    @property
    def name(self) -> str | None:  # type: ignore[override]
        """The project name (the run's own name is ``logger.experiment.name``), as in Lightning."""
        return self._project

    @property
    def version(self) -> str | None:  # type: ignore[override]
        """The run id (without starting a run: the id given to the constructor until one runs)."""
        return self._experiment.id if self._experiment is not None else self._id

    @property
    def log_dir(self) -> str | None:
        """``<save_dir>/<project>/<run id>`` once the run exists: where Lightning puts its checkpoints."""
        if self._save_dir is None or self.version is None:
            return None
        return os.path.join(self._save_dir, str(self._project), str(self.version))

    # ------------------------------------------------------------------ writing
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None, *args: Any, **kwargs: Any) -> None:
        """Add ``params`` to ``run.config`` (classes and callables by name, as in Lightning)."""
        self.experiment.config.update(sanitize_callables(convert_params(params)), allow_val_change=True)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log ``metrics``, with ``trainer/global_step = step`` as their x-axis when ``step`` is given."""
        row = add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        if step is not None:
            row[_STEP_KEY] = step
        self.experiment.log(row)

    @rank_zero_only
    def log_table(
        self,
        key: str,
        columns: list[Any] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log a ``wandb.Table`` from ``columns`` and ``data``, or from a pandas ``dataframe``."""
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    @rank_zero_only
    def log_text(
        self,
        key: str,
        columns: list[Any] | None = None,
        data: list[list[str]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log text as a table (see :meth:`log_table`)."""
        self.log_table(key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log images (tensors, arrays, PIL images or paths); each keyword is a list with one entry per image.

        Raises:
            TypeError: ``images`` is not a list.
            ValueError: A keyword's list has a different length than ``images``.
        """
        import wandb

        if not isinstance(images, list):
            msg = f'WandbLogger.log_image expects a list as "images", found {type(images).__name__}; wrap it in [...].'
            raise TypeError(msg)
        for name, values in kwargs.items():
            if len(values) != len(images):
                msg = f"WandbLogger.log_image: expected {len(images)} items for {name!r}, found {len(values)}."
                raise ValueError(msg)
        per_image = [{name: values[i] for name, values in kwargs.items()} for i in range(len(images))]
        self.log_metrics({key: [wandb.Image(image, **extra) for image, extra in zip(images, per_image)]}, step)

    @rank_zero_only
    def save(self) -> None:
        """Start the run now, so ``version`` and ``log_dir`` are known before fit (as Lightning does)."""
        _ = self.experiment

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Upload pending checkpoints (``log_model=True``) after a successful stage; the run stays open."""
        if status != "success" or self._experiment is None:
            return
        self._upload_pending_checkpoints()

    def _upload_checkpoint(self, path: str, metadata: dict[str, Any], aliases: list[str]) -> None:
        import wandb

        if not self._checkpoint_name:
            self._checkpoint_name = f"model-{self.experiment.id}"
        artifact = wandb.Artifact(name=self._checkpoint_name, type="model", metadata=metadata)
        artifact.add_file(path, name="model.ckpt")
        self.experiment.log_artifact(artifact, aliases=aliases)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._experiment is not None:  # a spawned worker attaches to the same run by id
            state["_id"] = getattr(self._experiment, "id", None)
            state["_wandb_init"] = {**self._wandb_init, "id": state["_id"]}
        state["_experiment"] = None
        return state
