"""The ``phalanx`` command: what is installed, whether it works, what a run would cost, checkpoint tools.

``phalanx strategies``, ``phalanx plugins`` and ``phalanx env`` read entry points, distribution
metadata and a few files, never importing torch, so they answer in a fraction of a second even
where importing torch takes seconds. ``phalanx doctor`` runs real processes and takes longer;
``phalanx plan`` imports torch to build the model on the meta device. ``phalanx new`` writes
a plugin package from the templates in ``phalanx/_cli/scaffold``; ``phalanx plugins --verified``
reads the conformance reports packages ship (neither imports torch). ``phalanx fit`` (and
``validate``, ``test``, ``predict``) is :class:`LightningCLI` with the Module and DataModule given
by class path; it needs the ``phalanx-core[cli]`` extra (jsonargparse).

The module also exposes Lightning's ``lightning.pytorch.cli`` names (``LightningCLI``,
``SaveConfigCallback``, ``LightningArgumentParser``, ``ArgsType``, ...), resolved on first access,
so ``from phalanx.cli import LightningCLI`` works while ``phalanx strategies`` imports neither
torch nor jsonargparse.
Bad input (an unknown command, option or strategy name) prints the usage line, the closest match
and exits with status 2, like any argparse program.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from phalanx._cli.messages import format_error, print_error, terminal_width

__all__ = [
    "ArgsType",
    "LRSchedulerCallable",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "LightningArgumentParser",
    "LightningCLI",
    "OptimizerCallable",
    "ReduceLROnPlateau",
    "SaveConfigCallback",
    "instantiate_class",
    "instantiate_module",
    "main",
]

# Lightning's ``lightning.pytorch.cli`` names, imported on first access: they need torch and jsonargparse.
_PARSER = "phalanx._cli.lightning_cli_parser"
_LAZY = {
    "LightningCLI": "phalanx._cli.lightning_cli",
    "SaveConfigCallback": "phalanx._cli.lightning_cli_save",
    **dict.fromkeys(
        [
            "ArgsType",
            "LRSchedulerCallable",
            "LRSchedulerType",
            "LRSchedulerTypeTuple",
            "LRSchedulerTypeUnion",
            "LightningArgumentParser",
            "OptimizerCallable",
            "ReduceLROnPlateau",
            "instantiate_class",
            "instantiate_module",
        ],
        _PARSER,
    ),
}

TYPE_CHECKING = False  # typing's own flag, without a second import (mypy reads this name as True)
if TYPE_CHECKING:
    from phalanx._cli.lightning_cli import LightningCLI
    from phalanx._cli.lightning_cli_parser import (
        ArgsType,
        LightningArgumentParser,
        LRSchedulerCallable,
        LRSchedulerType,
        LRSchedulerTypeTuple,
        LRSchedulerTypeUnion,
        OptimizerCallable,
        ReduceLROnPlateau,
        instantiate_class,
        instantiate_module,
    )
    from phalanx._cli.lightning_cli_save import SaveConfigCallback


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        msg = f"module 'phalanx.cli' has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    # The parser module raises one ModuleNotFoundError naming `pip install 'phalanx-core[cli]'`.
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def _nearest(value: str, choices: Iterable[str]) -> str | None:
    """The choice most like ``value``: a close match if there is one, else the least distant."""
    options = list(choices)
    for cutoff in (0.6, 0.0):
        found = difflib.get_close_matches(value, options, n=1, cutoff=cutoff)
        if found:
            return found[0]
    return None


class _Parser(argparse.ArgumentParser):
    """argparse, plus the closest valid command or option and a fix in every error.

    Errors and help are wrapped to the terminal (at most 100 columns) here, once, so no message
    has to be written short and none runs off a narrow terminal.
    """

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse sizes help to the whole terminal; cap it like every other line the command prints.
        formatter: Callable[..., argparse.HelpFormatter] = self.formatter_class  # every HelpFormatter takes width
        return formatter(prog=self.prog, width=terminal_width() - 2)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        fix = f"see `{self.prog} --help`."
        self.exit(2, format_error(f"{self.prog}: error", f"{message}{self._hint(message)}", fix=fix) + "\n")

    def _hint(self, message: str) -> str:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2)) or [c.strip() for c in choice.group(2).split(",")]
            nearest = _nearest(choice.group(1), options)
            return f"; closest match: {nearest!r}. Fix: use {nearest!r}." if nearest else ""
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown:
            options = [opt for action in self._actions for opt in action.option_strings]
            nearest = _nearest(unknown.group(1), options)
            if nearest:
                return f"; closest match: {nearest!r}. Fix: use {nearest!r} (see `{self.prog} --help`)."
        return ""


def _cmd_strategies(args: argparse.Namespace) -> int:
    from phalanx._cli.listing import print_strategies

    return print_strategies(show_all=args.all, as_json=args.json)


def _cmd_plugins(args: argparse.Namespace) -> int:
    from phalanx._cli.listing import print_plugins, print_verified

    if args.verified:
        return print_verified(as_json=args.json)
    return print_plugins(as_json=args.json, verbose=args.verbose)


def _cmd_new(args: argparse.Namespace) -> int:
    from pathlib import Path

    from phalanx._cli.new import NewPackageError, write_package

    directory = Path(args.directory)
    try:
        written = write_package(args.kind, args.name, directory)
    except NewPackageError as err:
        print_error("phalanx new: error", str(err))
        return 2
    for path in written:
        print(f"wrote {path}")
    print(
        f"\nNext: pip install -e '{directory}[test]', then `phalanx plugins` lists {args.name!r} and "
        f"`pytest {directory}` runs the conformance kit. The method to write is marked FILL IN."
    )
    return 0


def _add_new(sub: argparse._SubParsersAction[_Parser]) -> None:
    from phalanx._cli.new import available_kinds

    new = sub.add_parser(
        "new",
        help="write a new plugin package (pyproject, entry point, class, conformance tests, README)",
        description=(
            "Write a complete plugin package into DIR: pyproject with the 'phalanx' entry point and this core's "
            "phalanx-core range, _plugin.py, the class from the public base with the one method to write marked "
            "FILL IN, tests that run the conformance kit, and a README. As generated it installs, is listed and "
            "passes its tests. NAME must be a lowercase identifier no installed plugin uses; DIR must be new or "
            "empty (nothing is overwritten)."
        ),
    )
    new.add_argument("kind", metavar="KIND", choices=available_kinds(), help=f"one of: {', '.join(available_kinds())}")
    new.add_argument(
        "name", metavar="NAME", help="the plugin's name: entry point, registered name, module phalanx_NAME"
    )
    new.add_argument("directory", metavar="DIR", help="folder to create the package in (new or empty)")
    new.set_defaults(func=_cmd_new)


def _cmd_env(args: argparse.Namespace) -> int:
    from phalanx._cli.env import print_env

    return print_env(import_torch=args.torch)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from phalanx._cli.doctor import doctor_names, run_doctor
    from phalanx.registry import StrategyRegistry

    names = args.strategy or doctor_names(include_variants=args.all)
    for name in names:
        if name not in StrategyRegistry:
            nearest = _nearest(name, StrategyRegistry.names())
            args.parser.error(
                f"argument --strategy: unknown strategy {name!r}; closest match: {nearest!r}. "
                "Choose a name from `phalanx strategies --all`."
            )
    return run_doctor(names, accelerator=args.accelerator, timeout=args.timeout)


def _cmd_checkpoint_convert(args: argparse.Namespace) -> int:
    from phalanx.discovery import convert_checkpoint
    from phalanx.errors import PhalanxError

    try:
        convert_checkpoint(args.source, args.destination)
    except PhalanxError as err:
        message = str(err)
        if not os.path.exists(args.source):
            # Checked only after the plugins had their say: one may read a path that is not a local file.
            where = "" if os.path.isabs(args.source) else f" (relative paths start at {os.getcwd()!r})"
            message = (
                f"checkpoint {args.source!r} does not exist{where}. "
                "Fix: pass the checkpoint file or sharded directory a run saved, e.g. from its ModelCheckpoint."
            )
        print_error("phalanx checkpoint convert: error", message, fix="see `phalanx checkpoint convert --help`.")
        return 2
    print(f"wrote {args.destination}")
    return 0


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        msg = f"{value!r} is not a positive number of seconds; pass e.g. --timeout 120"
        raise argparse.ArgumentTypeError(msg)
    return seconds


def _add_doctor(sub: argparse._SubParsersAction[_Parser]) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check that this machine can train: a 2-process gloo all-reduce and a tiny fit per strategy",
        description=(
            "Run a real 2-process gloo all-reduce, then a tiny fit (12 SGD steps of linear regression; 2 processes "
            "for parallel strategies) under each installed strategy, and print pass / fail / skipped (with the "
            "reason) per check. Exits 1 if any check failed. Every check runs in fresh processes with a timeout "
            "and leaves none behind."
        ),
    )
    doctor.add_argument(
        "--strategy",
        action="append",
        metavar="NAME",
        help="check only this strategy (repeatable); default: every base name `phalanx strategies` lists",
    )
    doctor.add_argument(
        "--all", action="store_true", help="also check every variant (e.g. ddp_find_unused_parameters_true)"
    )
    doctor.add_argument(
        "--accelerator", default="cpu", help='accelerator for the fits: "cpu" (default), "cuda", "mps" or "auto"'
    )
    doctor.add_argument(
        "--timeout", type=_positive_seconds, default=180.0, help="seconds allowed per check (default 180)"
    )
    doctor.set_defaults(func=_cmd_doctor, parser=doctor)


def _add_training_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """List fit / validate / test / predict in ``phalanx --help``; :func:`main` hands them to LightningCLI."""
    from phalanx._cli.lightning_cli_command import TRAINING_COMMANDS

    for name, summary in TRAINING_COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)


def _build_parser() -> tuple[_Parser, dict[str, _Parser]]:
    from phalanx.version import __version__

    parser = _Parser(
        prog="phalanx",
        description=(
            "Inspect phalanx's installed strategies and plugins (and whether their conformance reports verify "
            "them), check the machine, estimate per-rank memory, convert checkpoints, and start a new plugin package."
        ),
        epilog="Plugins are packages exposing an entry point in the 'phalanx' group; block one with PHALANX_DISABLE_PLUGINS=name.",
    )
    parser.add_argument("--version", action="version", version=f"phalanx-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    strategies = sub.add_parser(
        "strategies",
        help="list registered strategy names, where they come from and whether they can be used",
        description=(
            "List the registered strategies: name, whether it can be used here (and why not), the plugin that "
            "registers it and a one-line description. Variants of a name (same class, extra settings, e.g. "
            "ddp_find_unused_parameters_true) are folded under it; --all lists every name. Does not import torch."
        ),
    )
    strategies.add_argument("--all", action="store_true", help="list every name, variants included")
    strategies.add_argument(
        "--json",
        action="store_true",
        help="print every name as JSON objects with keys name, description, plugin, distribution, version, target, available, reason",
    )
    strategies.set_defaults(func=_cmd_strategies)
    plugins = sub.add_parser(
        "plugins",
        help="list discovered plugins with their status and what they provide",
        description="List every entry point of the 'phalanx' group: distribution, version, what it registers and its status (loaded, blocked, incompatible, failed) with the reason.",
    )
    plugins.add_argument(
        "--json",
        action="store_true",
        help="print JSON objects with keys entry_point, value, distribution, version, status, reason, hooks, provides "
        "(and verified, with --verified)",
    )
    plugins.add_argument(
        "--verbose",
        action="store_true",
        help="also build each registered strategy and print the capabilities it declares beyond its base class's "
        "defaults (imports torch and the plugins)",
    )
    plugins.add_argument(
        "--verified",
        action="store_true",
        help="show per plugin whether the conformance report it ships (phalanx-report.json) passed under this "
        "phalanx-core and torch minor: verified, failed, stale or unverified",
    )
    plugins.set_defaults(func=_cmd_plugins)
    env = sub.add_parser(
        "env",
        help="show versions, devices, distributed backends and plugin health",
        description=(
            "Show Python, torch and phalanx versions, visible devices, the torch.distributed backends and the health "
            "of every plugin, from metadata and files without importing torch (well under a second). --torch imports "
            "torch and asks it instead."
        ),
    )
    env.add_argument(
        "--torch",
        action="store_true",
        help="import torch to check devices and backends (takes as long as importing torch)",
    )
    env.set_defaults(func=_cmd_env)
    _add_new(sub)
    _add_doctor(sub)
    from phalanx._cli.plan import add_plan_parser

    add_plan_parser(sub)
    _add_training_commands(sub)
    checkpoint = sub.add_parser("checkpoint", help="checkpoint tools (convert)", description="Checkpoint tools.")
    checkpoint_sub = checkpoint.add_subparsers(
        dest="checkpoint_command", metavar="COMMAND", required=True, parser_class=_Parser
    )
    convert = checkpoint_sub.add_parser(
        "convert",
        help="turn any strategy's checkpoint into one portable file",
        description=(
            "Convert a checkpoint written by any installed strategy (a torch file, or a sharded directory from "
            "fsdp / deepspeed) into one torch file with the full fp32 'state_dict', loadable by single_device and ddp."
        ),
    )
    convert.add_argument("source", help="checkpoint file or directory to read")
    convert.add_argument("destination", help="path of the portable file to write (written atomically)")
    convert.set_defaults(func=_cmd_checkpoint_convert)
    commands = {name: p for name, p in sub.choices.items()} | {"checkpoint convert": convert}
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``phalanx`` console script; returns the exit status."""
    from phalanx._cli.lightning_cli_command import TRAINING_COMMANDS, run_training_command

    given = sys.argv[1:] if argv is None else list(argv)
    if given and given[0] in TRAINING_COMMANDS:
        # jsonargparse parses these (configs, --trainer.*, class paths), not argparse.
        return run_training_command(None if argv is None else given)
    parser, commands = _build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = " ".join(part for part in (args.command, getattr(args, "checkpoint_command", None)) if part)
        commands.get(command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # `phalanx env | head`: the reader left; stop quietly, as other command-line tools do,
        # with stdout pointed at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, the status a shell reports for it


if __name__ == "__main__":
    sys.exit(main())
