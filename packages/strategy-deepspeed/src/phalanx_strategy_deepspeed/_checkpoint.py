"""Checkpoints of DeepSpeedStrategy: DeepSpeed's sharded directory, with the Trainer's state beside it.

Every rank writes its own shard through ``engine.save_checkpoint`` (so every rank must call
:meth:`save_checkpoint`); rank 0 adds ``trainer_state.pt`` (loops, callbacks, schedulers: the
Trainer's checkpoint dict without weights and optimizer state, loadable with
``weights_only=True``) and the manifest. Loading happens in two steps because the Trainer reads a
checkpoint before the engine exists: :meth:`load_checkpoint` checks the directory against this
model and world and returns the Trainer's state; :meth:`load_model_state_dict`, after setup, lets
the engine load the shards (or loads consolidated full weights when the world changed).

A URL (``s3://...``) target is staged locally and then uploaded: DeepSpeed writes only to local
files, so every rank saves into a local temporary directory, uploads its files into the target's
staging prefix, and rank 0 publishes it with the commit marker of ``phalanx.checkpoint_io.atomic``.
Loading from a URL downloads the committed directory into a temporary directory first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Any

import torch
from torch import nn

from phalanx.checkpoint_io.atomic import prepare_staging, publish_directory, remove_published, staging_directory
from phalanx.checkpoint_io.checkpoint_io import PathLike
from phalanx.checkpoint_io.storage import is_remote, remote_error
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx_strategy_deepspeed._layout import (
    TAG,
    CheckpointManifest,
    compare_parameters,
    is_deepspeed_checkpoint,
    read_manifest,
    write_manifest,
)
from phalanx_strategy_deepspeed._remote import download, upload

__all__ = ["TRAINER_STATE", "DeepSpeedCheckpointing", "parameter_shapes"]

#: The Trainer's part of a checkpoint, beside DeepSpeed's files.
TRAINER_STATE = "trainer_state.pt"
_WEIGHT_KEYS = ("state_dict", "optimizer_states")


def parameter_shapes(module: nn.Module) -> dict[str, list[int]]:
    """Full shape of every parameter; ZeRO-3 partitioned parameters report ``ds_shape``."""
    return {name: list(getattr(param, "ds_shape", param.shape)) for name, param in module.named_parameters()}


def convert_hint(path: str) -> str:
    """The command that turns a checkpoint directory into one portable file."""
    return f"`phalanx checkpoint convert {path} {path.rstrip(os.sep)}.fp32.ckpt`"


class DeepSpeedCheckpointing:
    """Checkpoint methods of :class:`~phalanx_strategy_deepspeed.strategy.DeepSpeedStrategy`."""

    # Provided by the strategy.
    checkpoint_io: Any
    optimizers: list[Any]
    lr_scheduler_configs: list[Any]
    load_full_weights: bool
    exclude_frozen_parameters: bool
    _pending_load: tuple[str, str] | None = None
    _downloaded: str | None = None

    # ------------------------------------------------------------------ state
    def module_state_dict(self) -> dict[str, Any]:
        """The Module's weights; empty under stage 3 while the engine holds them sharded (it saves them).

        After a run the engine is gone and (with ``gather_on_teardown``) the Module holds its
        full weights again, so they are returned like any other strategy's.
        """
        if self.zero_stage_3 and self.deepspeed_engine is not None:  # type: ignore[attr-defined]
            return {}
        return self.require_module().state_dict()  # type: ignore[attr-defined,no-any-return]

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """Empty: each rank's optimizer shard is saved by the engine, not gathered into one dict."""
        return {}

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        """Nothing to do: the engine restored its shards in :meth:`load_model_state_dict`."""

    # ------------------------------------------------------------------ saving
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: PathLike, storage_options: Any | None = None
    ) -> None:
        """Write the engine's shards (every rank), then the Trainer's state and the manifest (rank 0).

        Raises:
            MisconfigurationError: Called before setup, or with ``storage_options``.
            CheckpointError: ``filepath`` is an existing file (DeepSpeed writes a directory).
        """
        engine = self.deepspeed_engine  # type: ignore[attr-defined]
        path = os.fspath(filepath)
        if engine is None:
            self._save_after_run(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            msg = f"DeepSpeedStrategy.save_checkpoint got storage_options={storage_options!r}; it supports none. Pass None."
            raise MisconfigurationError(msg)
        if is_remote(path):
            self._save_remote(checkpoint, path)
            return
        if os.path.isfile(path):
            msg = (
                f"Cannot save a DeepSpeed checkpoint to {path!r}: a file exists there, and DeepSpeed writes a "
                "directory. Fix: delete it or choose another path."
            )
            raise CheckpointError(msg)
        # Written into a staging directory and published whole by rank 0 (phalanx.checkpoint_io.atomic):
        # a rank killed mid-save leaves the previous checkpoint at `path` complete and loadable.
        staging = os.fspath(staging_directory(path))
        if self.is_global_zero:  # type: ignore[attr-defined]
            prepare_staging(path)
        self.barrier("DeepSpeedStrategy.save_checkpoint: staging")  # type: ignore[attr-defined]
        engine.save_checkpoint(
            staging, client_state={}, tag=TAG, exclude_frozen_parameters=self.exclude_frozen_parameters
        )
        self.barrier("DeepSpeedStrategy.save_checkpoint: shards")  # type: ignore[attr-defined]
        if self.is_global_zero:  # type: ignore[attr-defined]
            self._write_trainer_files(checkpoint, staging)
            publish_directory(staging, path)
        self.barrier("DeepSpeedStrategy.save_checkpoint")  # type: ignore[attr-defined]

    def _write_trainer_files(self, checkpoint: dict[str, Any], directory: str) -> None:
        """Rank 0: the Trainer's state and the manifest, beside the engine's shards in ``directory``."""
        state = {key: value for key, value in checkpoint.items() if key not in _WEIGHT_KEYS}
        self.checkpoint_io.save_checkpoint(state, os.path.join(directory, TRAINER_STATE))
        from phalanx import __version__

        manifest = CheckpointManifest(
            world_size=self.world_size,  # type: ignore[attr-defined]
            zero_stage=self.zero_stage,  # type: ignore[attr-defined]
            parameters=parameter_shapes(self.require_module()),  # type: ignore[attr-defined]
            phalanx_version=__version__,
        )
        write_manifest(directory, manifest)

    def _save_remote(self, checkpoint: dict[str, Any], url: str) -> None:
        """Stage locally, upload every rank's files into the staging prefix, publish (rank 0).

        Every rank saves into its own local temporary directory (ranks on other machines share no
        disk) and uploads what it wrote; rank 0 commits once every upload finished. Any failure
        leaves the previously published checkpoint as it was.
        """
        engine = self.deepspeed_engine  # type: ignore[attr-defined]
        staging = os.fspath(staging_directory(url))
        error: BaseException | None = None
        if self.is_global_zero:  # type: ignore[attr-defined]
            try:
                prepare_staging(url)
            except Exception as caught:  # the store's own errors (endpoint, credentials) vary by backend
                error = caught
        failed = self.broadcast(error is not None)  # type: ignore[attr-defined]
        if failed:
            raise CheckpointError(
                remote_error(url, error or RuntimeError("rank 0 failed"), action="write the checkpoint")
            )
        with tempfile.TemporaryDirectory(prefix="phalanx-deepspeed-") as local:
            engine.save_checkpoint(
                local, client_state={}, tag=TAG, exclude_frozen_parameters=self.exclude_frozen_parameters
            )
            if self.is_global_zero:  # type: ignore[attr-defined]
                self._write_trainer_files(checkpoint, local)
            try:
                upload(local, staging)
            except Exception as caught:
                error = caught
        failed = self.reduce_boolean_decision(error is not None, all=False)  # type: ignore[attr-defined]
        if not failed and self.is_global_zero:  # type: ignore[attr-defined]
            try:
                publish_directory(staging, url)
            except Exception as caught:
                error = caught
        failed = self.broadcast(failed or error is not None)  # type: ignore[attr-defined]
        if failed:
            raise CheckpointError(
                remote_error(url, error or RuntimeError("another rank failed"), action="write the checkpoint")
            )

    def _save_after_run(self, checkpoint: dict[str, Any], path: str, storage_options: Any | None) -> None:
        """After fit/validate/test/predict: rank 0 writes one portable file with the full weights.

        The engine and its process group end with the run, so the per-rank ZeRO shards can no
        longer be written; the Module holds the trained weights (ZeRO-3 gathers them back at
        teardown), which is what a save after ``fit`` is for. The file loads under any strategy;
        resuming ``fit`` from it restarts the optimizer state (it lived in the engine's shards).

        Raises:
            MisconfigurationError: Nothing ran yet, or ZeRO-3 weights were left partitioned
                (``gather_on_teardown=False``).
        """
        module = self.module  # type: ignore[attr-defined]
        from phalanx_strategy_deepspeed._engine import stale_partitions

        if module is None or stale_partitions(module):
            what = (
                "no Module is connected yet" if module is None else "the Module's ZeRO-3 weights are still partitioned"
            )
            msg = (
                f"Cannot save {path!r} outside a run: {what}. Fix: run fit/validate/test/predict first and keep "
                "DeepSpeedStrategy(gather_on_teardown=True) (the default), or save during the run "
                "(ModelCheckpoint, or self.trainer.save_checkpoint(...) in a hook such as on_train_end)."
            )
            raise MisconfigurationError(msg)
        if os.path.isdir(path):
            msg = (
                f"Cannot save {path!r} after the run: a directory exists there, and outside a run DeepSpeedStrategy "
                "writes one portable file. Fix: choose another path, or delete the directory."
            )
            raise CheckpointError(msg)
        if self.is_global_zero:  # type: ignore[attr-defined]
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def remove_checkpoint(self, filepath: PathLike) -> None:
        """Delete a checkpoint directory (or file); only rank 0 deletes."""
        if not self.is_global_zero:  # type: ignore[attr-defined]
            return
        path = os.fspath(filepath)
        if is_remote(path):
            remove_published(path)
        elif os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            self.checkpoint_io.remove_checkpoint(path)

    # ------------------------------------------------------------------ loading
    def load_checkpoint(self, checkpoint_path: PathLike, *, weights_only: bool = True) -> dict[str, Any]:
        """Check a checkpoint against this model and world; return the Trainer's part of it.

        A directory's weights and optimizer shards are loaded later, into the engine, by
        :meth:`load_model_state_dict`. A *file* (a converted checkpoint, or one from ddp /
        single_device) is read whole; its weights are loaded the same way.

        Raises:
            CheckpointError: Not a DeepSpeed checkpoint, another model's, or (when fitting) another
                world size or ZeRO stage; the message names the convert command.
        """
        path = os.fspath(checkpoint_path)
        if is_remote(path):
            path = download(path)
            if os.path.isdir(path):
                self._downloaded = path
        if os.path.isfile(path):
            checkpoint: dict[str, Any] = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
            self._pending_load = (path, "file")
            return checkpoint
        if not is_deepspeed_checkpoint(path):
            listing = sorted(os.listdir(path))[:8] if os.path.isdir(path) else "missing"
            msg = (
                f"{path!r} is not a DeepSpeed checkpoint directory (contents: {listing}); DeepSpeedStrategy resumes "
                "from directories written by Trainer.save_checkpoint with strategy='deepspeed*'. Pass one of those, "
                "or a single-file checkpoint."
            )
            raise CheckpointError(msg)
        manifest = read_manifest(path)
        module = self.require_module()  # type: ignore[attr-defined]
        mode = "engine"
        if manifest is not None:
            difference = compare_parameters(manifest.parameters, parameter_shapes(module))
            if difference:
                msg = (
                    f"DeepSpeed checkpoint {path!r} belongs to another model ({difference}). Fix: pass a checkpoint "
                    f"saved from {type(module).__qualname__} with these layers."
                )
                raise CheckpointError(msg)
            mode = self._check_world(path, manifest)
        state_file = os.path.join(path, TRAINER_STATE)
        state: dict[str, Any] = {}
        if os.path.isfile(state_file):
            state = self.checkpoint_io.load_checkpoint(state_file, weights_only=weights_only)
        state["state_dict"] = {}  # the weights are in the shards; see load_model_state_dict
        if "loops" in state:
            state["optimizer_states"] = []
        self._pending_load = (path, mode)
        return state

    def _check_world(self, path: str, manifest: CheckpointManifest) -> str:
        """ "engine" when the shards fit this run; "consolidate" (evaluation only) when they do not."""
        world, stage = self.world_size, self.zero_stage  # type: ignore[attr-defined]
        if manifest.world_size == world and manifest.zero_stage == stage:
            return "engine"
        if not self._fitting():
            return "consolidate"
        msg = (
            f"DeepSpeed checkpoint {path!r} was saved by {manifest.world_size} rank(s) with ZeRO stage "
            f"{manifest.zero_stage}; this run has {world} rank(s) with stage {stage}, and ZeRO's per-rank optimizer "
            f"shards cannot be re-split. Fix: resume with devices*num_nodes={manifest.world_size} and stage "
            f"{manifest.zero_stage}, or convert it with {convert_hint(path)} and start a new fit from those "
            "weights (module.load_state_dict(torch.load(DST)['state_dict']); the optimizer state restarts)."
        )
        raise CheckpointError(msg)

    def _fitting(self) -> bool:
        module = self.require_module()  # type: ignore[attr-defined]
        try:
            trainer = module.trainer  # a Module outside a Trainer raises: then this is a plain load
        except RuntimeError:
            trainer = None
        fn = getattr(getattr(trainer, "state", None), "fn", None)
        return fn is None or str(getattr(fn, "value", fn)) == "fit"

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        """Load the weights (and, when fitting, the optimizer shards) into the engine.

        Raises:
            CheckpointError: DeepSpeed could not load the directory, or the weights do not fit.
        """
        pending, self._pending_load = self._pending_load, None
        try:
            self._load_pending(checkpoint, pending, strict=strict)
        finally:
            downloaded, self._downloaded = self._downloaded, None
            if downloaded is not None:
                shutil.rmtree(os.path.dirname(downloaded), ignore_errors=True)

    def _load_pending(self, checkpoint: Any, pending: tuple[str, str] | None, *, strict: bool) -> None:
        if pending is None or pending[1] == "file":
            if "state_dict" not in checkpoint or not checkpoint["state_dict"]:
                msg = "The checkpoint has no weights ('state_dict'); pass a checkpoint saved by a phalanx Trainer."
                raise CheckpointError(msg)
            if pending is not None and "optimizer_states" in checkpoint and self._fitting():
                warnings.warn(
                    f"{pending[0]!r} is a single-file checkpoint: DeepSpeedStrategy loads its weights and loop "
                    "position, but the optimizer state restarts (ZeRO keeps it in per-rank shards).",
                    stacklevel=2,
                )
            self.load_full_state_dict(checkpoint["state_dict"], strict=strict)
            return
        path, mode = pending
        if mode == "consolidate":
            from phalanx_strategy_deepspeed._convert import consolidate

            self.load_full_state_dict(consolidate(path), strict=strict)
            return
        engine = self.deepspeed_engine  # type: ignore[attr-defined]
        fitting = self._fitting() and bool(self.optimizers)
        try:
            load_path, _ = engine.load_checkpoint(
                path,
                load_module_strict=strict,
                load_optimizer_states=fitting,
                load_lr_scheduler_states=False,
                load_module_only=not fitting,
            )
        except (RuntimeError, KeyError, ValueError, AssertionError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            msg = f"DeepSpeed could not load {path!r}: {first}. Pass a checkpoint saved from this model and configuration."
            raise CheckpointError(msg) from error
        if load_path is None:
            msg = f"DeepSpeed found no checkpoint in {path!r} (no 'latest' tag file); pass the directory Trainer.save_checkpoint wrote."
            raise CheckpointError(msg)
        if fitting:
            for config, state in zip(self.lr_scheduler_configs, checkpoint.get("lr_schedulers", [])):
                config.scheduler.load_state_dict(state)

    def load_full_state_dict(self, state_dict: dict[str, Any], *, strict: bool = True) -> None:
        """Load full (unsharded) weights into the engine's module and its fp32 master copy.

        Under stage 3 the parameters are gathered, rank 0 loads, and DeepSpeed re-partitions its
        values on exit. ZeRO optimizers keep an fp32 master copy of the weights; it is refreshed,
        or the next step would write the old weights back.
        """
        module = self.require_module()  # type: ignore[attr-defined]
        if self.zero_stage_3:  # type: ignore[attr-defined]
            from phalanx_strategy_deepspeed._runtime import import_deepspeed

            deepspeed = import_deepspeed()
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
                if self.is_global_zero:  # type: ignore[attr-defined]
                    module.load_state_dict(state_dict, strict=strict)
        else:
            with torch.no_grad():
                module.load_state_dict(state_dict, strict=strict)
        engine = self.deepspeed_engine  # type: ignore[attr-defined]
        optimizer = getattr(engine, "optimizer", None)
        refresh = getattr(optimizer, "refresh_fp32_params", None) or getattr(
            optimizer, "_restore_from_bit16_weights", None
        )
        if callable(refresh):
            refresh()
