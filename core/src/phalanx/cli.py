"""The ``phalanx`` command: what is installed, whether it works, and checkpoint tools.

``phalanx strategies`` and ``phalanx plugins`` read only entry points and distribution metadata,
never torch, so they answer instantly even on a machine where importing torch takes seconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _strategy_rows() -> list[dict[str, Any]]:
    from phalanx.registry import StrategyRegistry

    rows = []
    for entry in StrategyRegistry.entries():
        reason = entry.unavailable_reason()
        rows.append(
            {
                "name": entry.name,
                "description": entry.description,
                "plugin": entry.source.plugin,
                "distribution": entry.source.distribution,
                "version": entry.source.version,
                "target": entry.target_path,
                "available": reason is None,
                "reason": reason,
            }
        )
    return rows


def _print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


def _cmd_strategies(args: argparse.Namespace) -> int:
    rows = _strategy_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [
        [r["name"], "yes" if r["available"] else "no", f"{r['distribution'] or r['plugin']} {r['version'] or ''}".strip(), r["description"]]
        for r in rows
    ]
    _print_table(table, ["NAME", "AVAILABLE", "FROM", "DESCRIPTION"])
    for row in rows:
        if not row["available"]:
            print(f"\n{row['name']}: {row['reason']}")
    _print_plugin_problems()
    return 0


def _print_plugin_problems() -> None:
    from phalanx.plugins import plugin_records

    bad = [r for r in plugin_records() if r.status != "loaded"]
    for record in bad:
        print(f"\nplugin {record.name!r} ({record.distribution or 'unknown distribution'}) {record.status}: {record.reason}")


def _cmd_plugins(args: argparse.Namespace) -> int:
    from phalanx.plugins import plugin_records

    records = plugin_records()
    if args.json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return 0
    table = []
    for record in records:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in record.provides.items())
        table.append([record.name, f"{record.distribution or '?'} {record.version or ''}".strip(), record.status, provides or "-"])
    _print_table(table, ["ENTRY POINT", "DISTRIBUTION", "STATUS", "PROVIDES"])
    for record in records:
        if record.reason:
            print(f"\n{record.name}: {record.reason}")
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    del args
    from phalanx import __version__
    from phalanx.plugins import plugin_records

    print(f"phalanx-core   {__version__}")
    print(f"python         {platform.python_version()} ({sys.executable})".replace(sys.prefix, "<prefix>"))
    print(f"platform       {platform.platform()}")
    try:
        import torch
        import torch.distributed as dist
    except ImportError as err:
        print(f"torch          not importable: {err}")
    else:
        print(f"torch          {torch.__version__}")
        cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        print(f"cuda devices   {cuda}" + (f" ({torch.cuda.get_device_name(0)})" if cuda else ""))
        mps = getattr(torch.backends, "mps", None)
        print(f"mps            {'available' if mps is not None and mps.is_available() else 'not available'}")
        backends = [name for name, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()), ("mpi", dist.is_mpi_available())) if ok]
        print(f"backends       {', '.join(backends) or 'none'}")
    print("plugins")
    for record in plugin_records():
        line = f"  {record.name:<14} {record.status:<12} {record.distribution or '?'} {record.version or ''}"
        print(line.rstrip() + (f" - {record.reason}" if record.reason else ""))
    return 0


def _cmd_checkpoint_convert(args: argparse.Namespace) -> int:
    from phalanx.errors import PhalanxError
    from phalanx.plugins import convert_checkpoint

    try:
        convert_checkpoint(args.source, args.destination)
    except PhalanxError as err:
        print(f"phalanx checkpoint convert: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.destination}")
    return 0


def _build_parser() -> argparse.ArgumentParser:
    from phalanx import __version__

    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Inspect phalanx's installed strategies and plugins, and convert checkpoints.",
        epilog="Plugins are packages exposing an entry point in the 'phalanx' group; block one with PHALANX_DISABLE_PLUGINS=name.",
    )
    parser.add_argument("--version", action="version", version=f"phalanx-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    strategies = sub.add_parser(
        "strategies",
        help="list registered strategy names, where they come from and whether they can be used",
        description="List every registered strategy: name, availability (and why not), plugin, distribution and description. Does not import torch.",
    )
    strategies.add_argument("--json", action="store_true", help="print JSON objects with keys name, description, plugin, distribution, version, target, available, reason")
    strategies.set_defaults(func=_cmd_strategies)
    plugins = sub.add_parser(
        "plugins",
        help="list discovered plugins with their status and what they provide",
        description="List every entry point of the 'phalanx' group: distribution, version, hooks, what it registers and its status (loaded, blocked, incompatible, failed) with the reason.",
    )
    plugins.add_argument("--json", action="store_true", help="print JSON objects with keys entry_point, value, distribution, version, status, reason, hooks, provides")
    plugins.set_defaults(func=_cmd_plugins)
    env = sub.add_parser(
        "env",
        help="show versions, devices, distributed backends and plugin health",
        description="Show Python, torch and phalanx versions, visible devices, available torch.distributed backends and the health of every plugin. Imports torch.",
    )
    env.set_defaults(func=_cmd_env)
    checkpoint = sub.add_parser("checkpoint", help="checkpoint tools (convert)", description="Checkpoint tools.")
    checkpoint_sub = checkpoint.add_subparsers(dest="checkpoint_command", metavar="COMMAND", required=True)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``phalanx`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
