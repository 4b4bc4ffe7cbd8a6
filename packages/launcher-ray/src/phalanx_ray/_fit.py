"""``phalanx_ray.fit``: a phalanx ``fit`` on a Ray cluster without writing the Ray Train boilerplate.

What it writes for you is what a Ray Train user writes by hand: a training function that builds
the Module, the data and the Trainer on every worker, reports checkpoints, and resumes from Ray's
latest checkpoint after a restart; and the ``TorchTrainer`` with its scaling, failure and
checkpoint configuration that runs it. The Module and the data are built on the workers, from
the functions you pass (Ray ships them there with cloudpickle), because a Module built in the
driver would be copied to every worker anyway and a DataLoader may hold open files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from phalanx.errors import MisconfigurationError
from phalanx_ray.checkpoints import latest_checkpoint, require_ray_train

__all__ = ["fit"]


def fit(
    build_module: Callable[[], Any],
    build_data: Callable[[], Any] | None = None,
    trainer_kwargs: Mapping[str, Any] | None = None,
    *,
    num_workers: int,
    max_failures: int = 0,
    use_gpu: bool = False,
    resources_per_worker: dict[str, float] | None = None,
    storage_path: str | None = None,
    name: str | None = None,
    num_to_keep: int | None = None,
) -> Any:
    """Train on ``num_workers`` Ray Train workers: ``Trainer(**trainer_kwargs).fit(build_module(), build_data())``.

    Call it where you would call ``trainer.fit`` (the driver: a script connected to the cluster
    with ``ray.init(address=...)``, or any process, which then starts a local Ray). Every worker
    builds the Module and the data and runs one rank of the Trainer; the ranks, the process group
    and ``devices`` / ``num_nodes`` come from Ray Train (``devices`` defaults to the workers on each
    node, ``num_nodes`` to the number of nodes). Each checkpoint the Trainer writes is reported to
    Ray (a :class:`~phalanx_ray.callback.RayTrainReportCallback` is added), and when a worker dies
    Ray restarts the group up to ``max_failures`` times, each restart resuming exactly from Ray's
    latest checkpoint. Checkpoints are written as the Trainer is configured: pass a
    ``ModelCheckpoint(every_n_train_steps=...)`` in ``trainer_kwargs["callbacks"]`` to bound what a
    restart repeats.

    Args:
        build_module: Returns the ``Module`` to train; called on every worker.
        build_data: Returns what ``fit`` takes after the Module: a DataLoader or a DataModule, or a
            mapping of ``fit``'s keyword arguments (``train_dataloaders``, ``val_dataloaders``,
            ``datamodule``). None: the Module's own ``train_dataloader()``.
        trainer_kwargs: ``Trainer`` arguments (``strategy="fsdp"``, ``max_steps=...``, ...).
        num_workers: Ray Train workers, one phalanx process (rank) each.
        max_failures: How many times Ray restarts the workers after a failure (-1: always).
        use_gpu: One GPU per worker (``accelerator="auto"`` then selects CUDA).
        resources_per_worker: Ray resources of each worker, e.g. ``{"CPU": 4, "GPU": 1}``.
        storage_path: Where Ray keeps the run and its checkpoints (a folder every node reaches, or
            a bucket URL); Ray's default is ``~/ray_results``.
        name: The run's name under ``storage_path``: running again with the same name resumes it.
        num_to_keep: How many reported checkpoints Ray keeps (None: all).

    Returns:
        Ray Train's ``Result``: ``metrics`` (the last report's), ``checkpoint`` (the last reported;
        :func:`phalanx_ray.checkpoint_path` finds the phalanx checkpoint in it) and ``path``.

    Raises:
        MisconfigurationError: A bad argument (before anything starts on the cluster).
        ImportError: Ray Train is not installed; the message has the pip command.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        msg = f"phalanx_ray.fit(num_workers={num_workers!r}) must be a positive int: one Ray Train worker per rank. Fix: pass e.g. num_workers=2."
        raise MisconfigurationError(msg)
    if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < -1:
        msg = (
            f"phalanx_ray.fit(max_failures={max_failures!r}) must be an int >= -1 (0: no restart, K: up to K "
            "restarts, -1: restart always). Fix: pass e.g. max_failures=2."
        )
        raise MisconfigurationError(msg)
    for argument, value in (("build_module", build_module), ("build_data", build_data)):
        if value is not None and not callable(value):
            msg = (
                f"phalanx_ray.fit({argument}={value!r}) must be a function that builds it on each worker, not the "
                f"object itself. Fix: pass e.g. {argument}=lambda: ... (or a function defined at module level)."
            )
            raise MisconfigurationError(msg)
    if build_module is None:
        msg = "phalanx_ray.fit(build_module=None): pass a function returning the Module to train."
        raise MisconfigurationError(msg)
    ray_train = require_ray_train()
    from ray.train.torch import TorchTrainer

    run_config = ray_train.RunConfig(
        name=name,
        storage_path=storage_path,
        failure_config=ray_train.FailureConfig(max_failures=max_failures),
        checkpoint_config=ray_train.CheckpointConfig(num_to_keep=num_to_keep),
    )
    scaling = ray_train.ScalingConfig(
        num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=resources_per_worker
    )
    config = {"build_module": build_module, "build_data": build_data, "trainer_kwargs": dict(trainer_kwargs or {})}
    trainer = TorchTrainer(train_on_worker, train_loop_config=config, scaling_config=scaling, run_config=run_config)
    return trainer.fit()


def train_on_worker(config: dict[str, Any]) -> None:
    """The training function every Ray Train worker runs (one rank): build, then ``fit`` or resume."""
    from phalanx import Trainer
    from phalanx_ray.callback import RayTrainReportCallback

    context = require_ray_train().get_context()
    kwargs = dict(config["trainer_kwargs"])
    per_node = context.get_local_world_size()
    kwargs.setdefault("devices", per_node)
    kwargs.setdefault("num_nodes", max(1, context.get_world_size() // per_node))
    callbacks = kwargs.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if not any(isinstance(cb, RayTrainReportCallback) or cb == "ray_train_report" for cb in callbacks):
        callbacks.append(RayTrainReportCallback())
    kwargs["callbacks"] = callbacks
    module = config["build_module"]()
    data = config["build_data"]() if config["build_data"] is not None else None
    trainer = Trainer(**kwargs)
    resume = latest_checkpoint()
    if isinstance(data, Mapping):
        trainer.fit(module, **data, ckpt_path=resume)
    elif data is None:
        trainer.fit(module, ckpt_path=resume)
    else:
        trainer.fit(module, data, ckpt_path=resume)
