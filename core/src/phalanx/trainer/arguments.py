"""Up-front validation of every ``Trainer(...)`` argument (entry points' inputs: :mod:`.entry_points`).

A typo in an argument should fail in ``Trainer(...)``, not hours later when the value is first
used; a wrong model class, a Module without ``training_step``, data that is not iterable or a
checkpoint path that does not exist should fail in the calling process, before any process starts.
Each check raises one :class:`MisconfigurationError` naming the argument, the bad value, what is
accepted and a concrete fix, and returns the normalised value.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

from phalanx.errors import MisconfigurationError
from phalanx.trainer.config import TrainerConfig
from phalanx.utilities.paths import check_path

__all__ = [
    "argument_error",
    "as_list",
    "check_barebones",
    "check_fast_dev_run",
    "check_hang_report_after",
    "check_max_time",
    "check_model_registry",
    "check_overfit",
    "check_sanity_steps",
    "check_bool",
    "check_clip",
    "check_deterministic",
    "check_int",
    "check_limit",
    "check_max_epochs",
    "check_root_dir",
    "check_val_check_interval",
    "defaults_from_env",
    "env_defaults",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def argument_error(name: str, value: Any, expected: str, fix: str) -> MisconfigurationError:
    shown = f"{value!r} (type {type(value).__name__})"
    return MisconfigurationError(f"Trainer({name}={shown}) is invalid: expected {expected}. Fix: {fix}.")


def env_defaults(signature: inspect.Signature, prefix: str = "PL_TRAINER_") -> dict[str, Any]:
    """The arguments set through the environment: ``PL_TRAINER_MAX_STEPS=7`` gives ``{"max_steps": 7}``.

    Lightning's variable names, so a job script written for Lightning configures phalanx the same
    way. Values are Python literals (``7``, ``False``, ``"cpu"``, ``[0, 1]``); anything that is not
    one is taken as a string (``PL_TRAINER_ACCELERATOR=cpu``). Empty variables are ignored.
    """
    found: dict[str, Any] = {}
    for name in signature.parameters:
        text = os.environ.get(f"{prefix}{name.upper()}")
        if not text:
            continue
        try:
            found[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            found[name] = text
    return found


def defaults_from_env(init: _F) -> _F:
    """Decorate ``Trainer.__init__``: ``PL_TRAINER_<ARGUMENT>`` variables give defaults, arguments passed win."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return init(self, *args, **{**env_defaults(signature), **kwargs})

    return wrapped  # type: ignore[return-value]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_bool(name: str, value: Any) -> bool:
    """``value`` must be a real bool (``1`` or ``"yes"`` are typos, not flags)."""
    if not isinstance(value, bool):
        raise argument_error(name, value, "True or False", f"pass {name}=True or {name}=False")
    return value


def check_int(name: str, value: Any, *, minimum: int, allow_none: bool = False, example: int = 1) -> int | None:
    """An int >= ``minimum`` (or None when allowed)."""
    if value is None and allow_none:
        return None
    if not _is_int(value) or value < minimum:
        expected = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise argument_error(name, value, expected, f"pass e.g. {name}={example}")
    return int(value)


def check_max_epochs(value: Any) -> int | None:
    """None (decided with max_steps), -1 (no limit) or an int >= 0."""
    if value is None:
        return None
    if not _is_int(value) or value < -1:
        raise argument_error("max_epochs", value, "an int >= 0, -1 (no limit) or None", "pass e.g. max_epochs=10")
    return int(value)


def check_limit(name: str, value: Any) -> int | float:
    """``limit_*_batches``: a fraction in [0, 1] of the batches or an absolute int count."""
    if value is None:
        return 1.0
    if _is_int(value):
        if value < 0:
            raise argument_error(name, value, "a float in [0.0, 1.0] or an int >= 0", f"pass e.g. {name}=0.25 or {name}=10")
        return int(value)
    if isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            raise argument_error(
                name, value, "a float in [0.0, 1.0] (a fraction) or an int >= 0 (a count)", f"pass e.g. {name}=0.5"
            )
        return value
    raise argument_error(name, value, "a float in [0.0, 1.0] or an int >= 0", f"pass e.g. {name}=1.0")


def _as_duration(value: str | dict[str, Any] | timedelta) -> timedelta | None:
    """``"DD:HH:MM:SS"``, timedelta keyword arguments, or a timedelta, as a positive timedelta (None: not one)."""
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, dict):
        try:
            duration = timedelta(**value)
        except TypeError:
            return None
    else:
        parts = value.split(":")
        if len(parts) != 4 or not all(part.strip().isdigit() for part in parts):
            return None
        days, hours, minutes, seconds = (int(part) for part in parts)
        duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return duration if duration.total_seconds() > 0 else None


def check_val_check_interval(value: Any) -> int | float | timedelta:
    """A fraction of the epoch in (0, 1], an int number of training batches > 0, or a wall-clock
    duration (``"DD:HH:MM:SS"``, a ``timedelta``, or its keyword arguments as a dict)."""
    if value is None:
        return 1.0
    if _is_int(value) and value > 0:
        return int(value)
    if isinstance(value, float) and 0.0 < value <= 1.0:
        return value
    if isinstance(value, (str, dict, timedelta)):
        duration = _as_duration(value)
        if duration is not None:
            return duration
    raise argument_error(
        "val_check_interval",
        value,
        "a float in (0.0, 1.0] (fraction of an epoch), an int > 0 (training batches) or a positive duration "
        "('DD:HH:MM:SS', a datetime.timedelta, or a dict of timedelta arguments)",
        "pass e.g. val_check_interval=0.25, val_check_interval=100 or val_check_interval='00:00:30:00'; "
        "to disable validation use limit_val_batches=0",
    )


def check_clip(value: Any, algorithm: Any) -> tuple[float | None, str]:
    """``gradient_clip_val`` >= 0 (None/0 disable) and ``gradient_clip_algorithm`` in norm/value."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise argument_error("gradient_clip_val", value, "a number >= 0 or None", "pass e.g. gradient_clip_val=1.0")
    algorithm_name = getattr(algorithm, "value", algorithm)
    if not isinstance(algorithm_name, str) or algorithm_name.lower() not in ("norm", "value"):
        raise argument_error(
            "gradient_clip_algorithm", algorithm, "'norm' or 'value'", "pass gradient_clip_algorithm='norm' or 'value'"
        )
    return (float(value) if value is not None else None), algorithm_name.lower()


def check_root_dir(value: Any) -> str:
    """A path; None means the current directory (as in Lightning)."""
    if value is None:
        return os.getcwd()
    if not isinstance(value, (str, os.PathLike)):
        raise argument_error("default_root_dir", value, "a path (str or os.PathLike) or None", "pass default_root_dir='runs'")
    return check_path(value, argument="Trainer(default_root_dir=...)")


def check_deterministic(value: Any) -> bool | str:
    """True, False or ``"warn"`` (deterministic algorithms that only warn when unavailable)."""
    if isinstance(value, bool) or value == "warn":
        return value  # type: ignore[no-any-return]
    raise argument_error("deterministic", value, "True, False or 'warn'", "pass deterministic=True")


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def check_positive_int(name: str, value: Any) -> int:
    """An int >= 1 (``check_int`` returns None only when None is allowed, which it is not here)."""
    checked = check_int(name, value, minimum=1)
    assert checked is not None
    return int(checked)


def check_plugins(value: Any) -> list[Any]:
    """None, one plugin or a list; each item is checked by the connector against the registries."""
    items = as_list(value)
    if not isinstance(value, (list, tuple)) and isinstance(value, Iterable) and not isinstance(value, str):
        raise argument_error("plugins", value, "a plugin, a registered plugin name, or a list of them", "pass plugins=[...]")
    return items


def check_model_registry(value: Any) -> None:
    """``model_registry`` is a hosted-service upload in Lightning; phalanx has no such service."""
    if value is not None:
        raise argument_error(
            "model_registry",
            value,
            "None (phalanx uploads nowhere)",
            "drop model_registry and copy the checkpoint files (ModelCheckpoint.best_model_path) where you keep models",
        )


def check_fast_dev_run(value: Any) -> int:
    """``fast_dev_run``: False/0 (off), True (1 batch) or an int number of batches per loop."""
    if value is True:
        return 1
    if value is False:
        return 0
    if not _is_int(value) or value < 0:
        raise argument_error("fast_dev_run", value, "True, False or an int >= 0", "pass fast_dev_run=True or fast_dev_run=5")
    return int(value)


def check_sanity_steps(value: Any, *, off: bool) -> int | float:
    """``num_sanity_val_steps``: validation batches before training (-1: all; None: 2, or 0 when ``off``)."""
    if value is None:
        return 0 if off else 2
    if not _is_int(value) or value < -1:
        raise argument_error(
            "num_sanity_val_steps", value, "an int >= 0, -1 (all batches) or None", "pass e.g. num_sanity_val_steps=0"
        )
    return float("inf") if value == -1 else int(value)


def check_overfit(value: Any) -> int | float:
    """``overfit_batches``: 0 (off), a fraction in (0, 1] or an int count of training batches."""
    if _is_int(value) and value >= 0:
        return int(value)
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        return value
    raise argument_error("overfit_batches", value, "a float in [0.0, 1.0] or an int >= 0", "pass e.g. overfit_batches=10")


def check_max_time(value: Any) -> Any:
    """``max_time``: None, ``"DD:HH:MM:SS"``, a dict of ``timedelta`` keywords or a ``timedelta``."""
    if value is None:
        return None
    from phalanx.callbacks.timer import parse_duration

    try:
        return parse_duration(value)
    except MisconfigurationError as error:
        raise argument_error(
            "max_time",
            value,
            "'DD:HH:MM:SS', a dict such as {'hours': 1}, or a datetime.timedelta",
            "pass e.g. max_time='00:12:00:00' (12 hours)",
        ) from error


def check_hang_report_after(value: Any) -> float | None:
    """``hang_report_after``: seconds (or a ``timedelta``) without progress before the hang report; None: off."""
    import datetime

    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
        return float(seconds)
    raise argument_error(
        "hang_report_after", value, "seconds > 0, a datetime.timedelta, or None (no report)", "pass e.g. hang_report_after=60"
    )


def check_barebones(barebones: Any, flags: dict[str, Any]) -> bool:
    """``barebones=True`` turns off everything that costs time; asking for one of those again is an error."""
    barebones = check_bool("barebones", barebones)
    if barebones:
        for name, value in flags.items():
            if value not in (None, False, 0):
                msg = (
                    f"Trainer(barebones=True) turns {name} off, but {name}={value!r} was passed. Fix: drop "
                    f"{name}, or pass barebones=False."
                )
                raise MisconfigurationError(msg)
    return barebones


def build_config(
    *,
    num_nodes: Any,
    max_epochs: Any,
    max_steps: Any,
    limits: dict[str, Any],
    val_check_interval: Any,
    check_val_every_n_epoch: Any,
    accumulate_grad_batches: Any,
    gradient_clip_val: Any,
    gradient_clip_algorithm: Any,
    log_every_n_steps: Any,
    use_distributed_sampler: Any,
    sync_batchnorm: Any,
    deterministic: Any,
    default_root_dir: Any,
    min_epochs: Any = None,
    min_steps: Any = None,
    max_time: Any = None,
    num_sanity_val_steps: Any = None,
    fast_dev_run: Any = False,
    overfit_batches: Any = 0.0,
    reload_dataloaders_every_n_epochs: Any = 0,
    inference_mode: Any = True,
    detect_anomaly: Any = False,
    benchmark: Any = None,
    barebones: bool = False,
    enable_model_summary: bool = True,
    enable_autolog_hparams: Any = True,
    hang_report_after: Any = 50.0,
) -> TrainerConfig:
    """Validate the loop-shaping ``Trainer(...)`` arguments into a :class:`TrainerConfig`.

    ``fast_dev_run=n`` runs n batches of every loop once (limits n, one epoch, ``max_steps=n``, no
    sanity check); ``overfit_batches`` trains and validates on the same first batches, unshuffled.

    Raises:
        MisconfigurationError: The first invalid argument, with the fix.
    """
    dev_run = check_fast_dev_run(fast_dev_run)
    steps = int(check_int("max_steps", max_steps, minimum=-1, example=1000))  # type: ignore[arg-type]
    epochs = check_max_epochs(max_epochs)
    duration = check_max_time(max_time)
    clip_val, clip_algorithm = check_clip(
        gradient_clip_val, "norm" if gradient_clip_algorithm is None else gradient_clip_algorithm
    )
    batch_limits = {f"limit_{stage}_batches": check_limit(f"limit_{stage}_batches", limits[stage]) for stage in limits}
    overfit = check_overfit(overfit_batches)
    if overfit > 0:
        batch_limits["limit_train_batches"] = batch_limits["limit_val_batches"] = overfit
    epochs_set = epochs is not None or dev_run > 0
    if epochs is None:
        epochs = 1000 if steps == -1 and duration is None else -1
    interval = check_val_check_interval(val_check_interval)
    every_n = check_int("check_val_every_n_epoch", check_val_every_n_epoch, minimum=1, allow_none=True)
    if every_n is None and isinstance(interval, float):
        msg = (
            f"Trainer(val_check_interval={interval}, check_val_every_n_epoch=None) is invalid: "
            "`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
            "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`. "
            "Fix: pass a number of batches (val_check_interval=100), or check_val_every_n_epoch=1 for a fraction of an epoch."
        )
        raise MisconfigurationError(msg)
    sanity = check_sanity_steps(num_sanity_val_steps, off=barebones or dev_run > 0)
    if dev_run:
        batch_limits = {name: dev_run for name in batch_limits}
        steps, epochs, sanity, interval, every_n = dev_run, 1, 0, 1.0, 1
    return TrainerConfig(
        num_nodes=int(check_int("num_nodes", num_nodes, minimum=1)),  # type: ignore[arg-type]
        max_epochs=epochs,
        max_epochs_set=epochs_set,
        max_steps=steps,
        **batch_limits,
        val_check_interval=interval,
        check_val_every_n_epoch=every_n,
        accumulate_grad_batches=int(check_int("accumulate_grad_batches", accumulate_grad_batches, minimum=1)),  # type: ignore[arg-type]
        gradient_clip_val=clip_val,
        gradient_clip_algorithm=clip_algorithm,
        log_every_n_steps=check_positive_int("log_every_n_steps", 50 if log_every_n_steps is None else log_every_n_steps),
        use_distributed_sampler=check_bool("use_distributed_sampler", use_distributed_sampler),
        sync_batchnorm=check_bool("sync_batchnorm", sync_batchnorm),
        deterministic=check_deterministic(False if deterministic is None else deterministic),
        default_root_dir=check_root_dir(default_root_dir),
        min_epochs=check_int("min_epochs", min_epochs, minimum=0, allow_none=True),
        min_steps=check_int("min_steps", min_steps, minimum=0, allow_none=True),
        max_time=duration,
        num_sanity_val_steps=sanity,  # type: ignore[arg-type]
        fast_dev_run=dev_run,
        overfit_batches=overfit,
        reload_dataloaders_every_n_epochs=int(
            check_int("reload_dataloaders_every_n_epochs", reload_dataloaders_every_n_epochs, minimum=0, example=1)  # type: ignore[arg-type]
        ),
        inference_mode=check_bool("inference_mode", inference_mode),
        detect_anomaly=check_bool("detect_anomaly", detect_anomaly),
        benchmark=None if benchmark is None else check_bool("benchmark", benchmark),
        barebones=barebones,
        enable_model_summary=enable_model_summary,
        enable_autolog_hparams=check_bool("enable_autolog_hparams", enable_autolog_hparams),
        hang_report_after=check_hang_report_after(hang_report_after),
    )
