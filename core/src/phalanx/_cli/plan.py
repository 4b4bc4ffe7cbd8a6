"""``phalanx plan MODULE:FACTORY``: what one rank would hold under each strategy, before launching.

The factory is imported and called with the meta device as default, so no weight gets storage
and a 70B-parameter configuration plans in seconds. Each strategy's plugin answers the
``phalanx_estimate_memory`` hook; a strategy without an answer is shown as "no estimate". Every
bad input (factory, model, strategy name, device memory, input shape) is one error naming the
value and the fix, with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from phalanx._cli.messages import print_error
from phalanx.errors import MisconfigurationError, PhalanxError, closest_match

__all__ = ["load_factory", "run_plan"]

_SPEC_FIX = "Pass MODULE:FACTORY, e.g. examples/plan_models.py:build_1_3b or mypkg.models:build."


def load_factory(spec: str) -> Callable[[], Any]:
    """Import ``module.path:name`` or ``path/to/file.py:name`` and return the callable.

    Raises:
        MisconfigurationError: Malformed spec, unimportable module or missing / non-callable name.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        msg = f"{spec!r} names no factory. {_SPEC_FIX}"
        raise MisconfigurationError(msg)
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            if not os.path.isfile(module_name):
                msg = f"factory file {module_name!r} does not exist (from {spec!r}). {_SPEC_FIX}"
                raise MisconfigurationError(msg)
            loaded = importlib.util.spec_from_file_location("_phalanx_plan_factory", module_name)
            assert loaded is not None and loaded.loader is not None
            module = importlib.util.module_from_spec(loaded)
            sys.modules[loaded.name] = module
            loaded.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except MisconfigurationError:
        raise
    except Exception as err:
        msg = (
            f"cannot import {module_name!r} (from {spec!r}): {type(err).__name__}: {err}. Fix: check the module path "
            f"(run from the directory it is relative to, or install its package). {_SPEC_FIX}"
        )
        raise MisconfigurationError(msg) from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        public = [name for name in vars(module) if callable(vars(module)[name]) and not name.startswith("_")]
        hint = closest_match(attr, public)
        msg = (
            f"{module_name!r} has no callable {attr!r}"
            f"{f'; closest: {hint!r}' if hint else ''}. Fix: name a function that returns the nn.Module. {_SPEC_FIX}"
        )
        raise MisconfigurationError(msg)
    return factory  # type: ignore[no-any-return]


def _positive_count(value: str) -> int:
    """``--devices`` / ``--num-nodes``: argparse's own "invalid int value" names no fix."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        msg = f"{value!r} is not a count >= 1; pass e.g. --devices 8 --num-nodes 2"
        raise argparse.ArgumentTypeError(msg)
    return count


def _input_shape(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        shape = tuple(int(part) for part in value.replace("x", ",").split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or any(size < 1 for size in shape):
        msg = f"--input-shape {value!r} is not a shape. Pass positive sizes, e.g. --input-shape 1,2048 (batch, tokens)."
        raise MisconfigurationError(msg)
    return shape


def _params(pairs: list[str] | None, checkpointing: str | None) -> dict[str, Any]:
    """``--param KEY=VALUE`` (a Python literal, else the text) and ``--activation-checkpointing``
    as strategy init params for every planned name.

    Raises:
        MisconfigurationError: A pair without ``=`` or with an empty key; names an example.
    """
    import ast

    params: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            msg = (
                f"--param {pair!r} is not KEY=VALUE with KEY an argument name. "
                "Fix: e.g. --param context_parallel_size=2 --param data_parallel_replicate_size=2."
            )
            raise MisconfigurationError(msg)
        try:
            params[key.strip()] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            params[key.strip()] = text
    if checkpointing is not None:
        params["activation_checkpointing_policy"] = checkpointing
    return params


def _names(args: argparse.Namespace) -> list[str]:
    from phalanx.registry import StrategyRegistry

    known = StrategyRegistry.names()
    for name in args.strategy or ():
        if name not in known:
            msg = (
                f"unknown strategy {name!r}; closest match: {closest_match(name, known)!r}. "
                "Choose a name from `phalanx strategies --all`, or pass --all."
            )
            raise MisconfigurationError(msg)
    return list(dict.fromkeys(args.strategy)) if args.strategy else known


def _fold(report: Any) -> Any:
    """Rows with the same estimate as an earlier row (launch-method twins) folded into it."""
    from phalanx.planning import PlanReport, PlanRow

    kept: list[PlanRow] = []
    twins: dict[str, int] = {}
    for row in report.rows:
        same = next((k for k in kept if k.estimate is not None and k.estimate == row.estimate), None)
        if same is None:
            kept.append(row)
        else:
            twins[same.strategy] = twins.get(same.strategy, 0) + 1
    rows = tuple(
        PlanRow(
            f"{r.strategy} (+{twins[r.strategy]})" if r.strategy in twins else r.strategy,
            r.estimate,
            r.fits,
            r.available,
            r.reason,
        )
        for r in kept
    )
    return PlanReport(**{**report.__dict__, "rows": rows})


def run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` command; returns the exit status (2 on bad input)."""
    from phalanx.memory import PRECISION_BYTES, optimizer_state_bytes, parse_bytes, precision_bytes
    from phalanx.precision._aliases import normalize_precision

    try:
        if args.devices < 1 or args.num_nodes < 1:
            msg = (
                f"--devices {args.devices} --num-nodes {args.num_nodes}: both must be >= 1. "
                "Fix: pass a positive count, e.g. --devices 8 --num-nodes 1."
            )
            raise MisconfigurationError(msg)
        device_memory = None if args.device_memory is None else parse_bytes(args.device_memory)
        precision = normalize_precision(args.precision, extra_choices=list(PRECISION_BYTES))  # xla-bf16-*, float8
        precision_bytes(precision)
        optimizer_state_bytes(args.optimizer, 0)
        shape = _input_shape(args.input_shape)
        names = _names(args)
        params = _params(args.param, args.activation_checkpointing)
        from phalanx.model_shapes import build_on_meta, summarize_model
        from phalanx.planning import plan_strategies

        factory = load_factory(args.factory)
        model = build_on_meta(factory, where=f"factory {args.factory!r}")
        summary = summarize_model(model, input_shape=shape, input_dtype=args.input_dtype)
        report = plan_strategies(
            summary,
            names,
            devices=args.devices,
            num_nodes=args.num_nodes,
            precision=precision,
            optimizer=args.optimizer,
            device_memory=device_memory,
            init_params=dict.fromkeys(names, params) if params else None,
        )
    except PhalanxError as err:
        print_error("phalanx plan: error", str(err), fix="see `phalanx plan --help`.")
        return 2
    if args.json:  # every name, never folded: a program reading it looks rows up by name
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report if args.strategy or args.all else _fold(report))
    return 0


def add_plan_parser(sub: Any) -> None:
    """Add ``plan`` to the ``phalanx`` command's subparsers."""
    plan = sub.add_parser(
        "plan",
        help="estimate per-rank memory of a model under each strategy, without allocating it",
        description=(
            "Build the model returned by MODULE:FACTORY on the meta device (no weights allocated) and print, per "
            "strategy, the bytes one rank would hold: parameters, gradients, optimizer state, activations (with "
            "--input-shape) and library buffers, what lives on CPU/NVMe when offloading, and whether it fits "
            "--device-memory. Strategies whose plugin gives no estimate are listed as 'no estimate'. Without "
            "--strategy or --all, names with identical estimates are folded into the first: 'ddp (+N)' stands for "
            "ddp and N more names with the same estimate (--all lists them)."
        ),
    )
    plan.add_argument(
        "factory", metavar="MODULE:FACTORY", help="module path or .py file, and a function returning an nn.Module"
    )
    plan.add_argument("--devices", type=_positive_count, default=1, help="devices (processes) per node (default 1)")
    plan.add_argument("--num-nodes", type=_positive_count, default=1, help="nodes (default 1)")
    plan.add_argument("--precision", default="32-true", help="a Trainer precision, e.g. bf16-mixed or float8 (default 32-true)")
    plan.add_argument(
        "--optimizer", default="adamw", help="adamw (default), adam, sgd, sgd_momentum, rmsprop, adagrad, lion"
    )
    plan.add_argument("--strategy", action="append", metavar="NAME", help="plan only this strategy (repeatable)")
    plan.add_argument("--all", action="store_true", help="every registered name, none folded")
    plan.add_argument("--device-memory", metavar="SIZE", help="memory of one device, e.g. 80GiB or 24GB: adds FITS")
    plan.add_argument("--input-shape", metavar="SHAPE", help="one micro-batch per rank, e.g. 1,2048: adds activations")
    plan.add_argument(
        "--input-dtype", metavar="DTYPE", help="dtype of that input (default int64 after an Embedding, else float32)"
    )
    plan.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="a strategy argument for every planned name, e.g. context_parallel_size=2 (repeatable)",
    )
    plan.add_argument(
        "--activation-checkpointing",
        choices=["full", "selective"],
        metavar="MODE",
        help="full or selective: plan with activation checkpointing of the repeated blocks (needs --input-shape)",
    )
    plan.add_argument(
        "--json", action="store_true", help="print the plan as one JSON object (model, strategies, advice)"
    )
    plan.set_defaults(func=run_plan)
