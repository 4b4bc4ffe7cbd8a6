"""``phalanx fit | validate | test | predict``: LightningCLI as a command, for models that have no ``main.py``.

``phalanx fit --config config.yaml --model mypkg.Net --data mypkg.Data`` is
``LightningCLI(model_class=None, datamodule_class=None)`` run from the ``phalanx`` command: the
Module and the DataModule are given by class path (subclass mode), everything else is
LightningCLI's (``--trainer.*``, ``--print_config``, several ``--config`` files, config.yaml in the
log directory). The current directory is put on the import path, as ``python -m`` does, so
``--model models.Net`` finds ``./models.py`` from the console script too.

Exit status: 0 after the run, 2 for bad arguments or a bad config (one error naming the key and
the fix, printed before anything is built, so nothing is trained or written), 2 as well when
jsonargparse is not installed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from phalanx._cli.messages import print_error

__all__ = ["TRAINING_COMMANDS", "run_training_command"]

#: The subcommands LightningCLI adds, in the order ``phalanx --help`` lists them.
TRAINING_COMMANDS = {
    "fit": "train a Module: LightningCLI with --config files, --model / --data class paths, --trainer.*",
    "validate": "run one validation epoch of a Module (same arguments as fit)",
    "test": "run one test epoch of a Module (same arguments as fit)",
    "predict": "run predict_step over a Module's data (same arguments as fit)",
}


def _put_cwd_on_path() -> None:
    """Make ``--model pkg.Class`` resolve from the current directory, as under ``python -m``."""
    cwd = os.getcwd()
    if not any(entry in ("", ".", cwd) for entry in sys.path):
        sys.path.insert(0, cwd)


def run_training_command(argv: Sequence[str] | None) -> int:
    """Run LightningCLI in subclass mode on ``argv`` (``sys.argv[1:]`` when None); returns the exit status."""
    _put_cwd_on_path()
    try:
        from phalanx._cli.lightning_cli import LightningCLI
    except ModuleNotFoundError as missing:
        if missing.name != "jsonargparse":
            raise
        command = (list(argv) if argv is not None else sys.argv[1:2]) or ["fit"]
        print_error(f"phalanx {command[0]}: error", str(missing))
        return 2
    parser_kwargs = {
        "prog": "phalanx",
        "description": "Train, validate, test or predict with phalanx: LightningCLI with the Module and DataModule given by class path.",
    }
    try:
        LightningCLI(args=None if argv is None else list(argv), parser_kwargs=parser_kwargs)
    except SystemExit as stop:  # --help, --print_config and parse errors end here
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
