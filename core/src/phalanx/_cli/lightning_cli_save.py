"""SaveConfigCallback: write the config a CLI run resolved into the run's log directory.

A run is reproducible only if the exact settings it used, defaults included, sit next to its logs
and checkpoints. The callback dumps the resolved config (every key, ``null`` values too) as
``<trainer.log_dir>/config.yaml`` when the first stage sets up, from global rank 0 only, and
refuses to overwrite the config of an earlier run in the same directory (Lightning's rule: a
second run there would otherwise make the first one's logs lie about how they were made).

It is a callback like any other: it sees the Trainer through the public TrainerView alone.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from phalanx.callbacks.callback import Callback
from phalanx.utilities.model_helpers import is_overridden

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["SaveConfigCallback"]


def _filesystem(path: str) -> Any:
    """The fsspec filesystem of ``path`` (paths are URLs); fsspec comes with torch."""
    from fsspec.core import url_to_fs

    return url_to_fs(path)[0]


class SaveConfigCallback(Callback):
    """Save a LightningCLI config to the log directory when the first stage starts.

    Args:
        parser: The parser that produced ``config`` (it knows how to dump it).
        config: The parsed configuration to save.
        config_filename: The file name inside ``trainer.log_dir``.
        overwrite: Replace an existing file instead of failing.
        multifile: When the input came from several config files, keep that structure.
        save_to_log_dir: Write to the log directory; ``False`` only makes sense in a subclass that
            implements :meth:`save_config` to save elsewhere.

    Raises:
        ValueError: ``save_to_log_dir=False`` on a class that does not override :meth:`save_config`.
        RuntimeError: (in ``setup``) the file exists and ``overwrite`` is False.
    """

    def __init__(
        self,
        parser: Any,
        config: Any,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and not is_overridden("save_config", self, SaveConfigCallback):
            msg = (
                "SaveConfigCallback(save_to_log_dir=False) saves nothing: the class does not override "
                "`save_config`. Fix: subclass SaveConfigCallback and implement `save_config`, or pass "
                "`save_config_callback=None` to LightningCLI to save no config at all."
            )
            raise ValueError(msg)

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Write the config once per run (fit then test in one run writes it once)."""
        if self.already_saved:
            return
        if self.save_to_log_dir:
            self._save_to_log_dir(trainer)
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        # Every rank must agree, or a later setup() would have rank 0 skip a broadcast the others make.
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def _save_to_log_dir(self, trainer: TrainerView) -> None:
        log_dir = trainer.log_dir
        config_path = os.path.join(log_dir, self.config_filename)
        filesystem = _filesystem(log_dir)
        if not self.overwrite:
            exists = filesystem.isfile(config_path) if trainer.is_global_zero else False
            if trainer.strategy.broadcast(exists):  # every rank fails together, none hangs
                msg = (
                    f"{type(self).__name__} expected {config_path} to NOT exist: aborting so as not to "
                    "overwrite the config of a previous run. Fix: delete that file, use another "
                    "`trainer.default_root_dir` / logger version, pass `save_config_callback=None` to "
                    'LightningCLI to save no config, or `save_config_kwargs={"overwrite": True}` to overwrite it.'
                )
                raise RuntimeError(msg)
        if trainer.is_global_zero:
            # Rank 0 alone writes; the logger may not have created the directory yet.
            filesystem.makedirs(log_dir, exist_ok=True)
            from phalanx._cli.lightning_cli_parser import keep_none

            keep = keep_none()
            self.parser.save(self.config, config_path, overwrite=self.overwrite, multifile=self.multifile, **keep)

    def save_config(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Override to save the config somewhere else too (a logger's hyperparameters, say).

        Called on global rank 0 only, so it must make no collective call (the other ranks would
        never join it); do collective work in ``setup`` instead.
        """
