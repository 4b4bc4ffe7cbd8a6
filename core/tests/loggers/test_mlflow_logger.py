"""MLFlowLogger on a real fit, read back with MLflow's own client from the local file store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from logger_helpers import Recorder, data, plain_losses, trainer_kwargs
from torch.utils.data import DataLoader

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.loggers._backends import MissingBackendError
from phalanx.loggers.mlflow import MLFlowLogger
from phalanx.trainer.trainer import Trainer


@pytest.fixture
def file_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh ``file:`` store; newer MLflow opens one only with MLFLOW_ALLOW_FILE_STORE=true."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return str(tmp_path / "mlruns")


def _client(save_dir: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"file:{save_dir}")


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(metric.step, metric.value) for metric in client.get_metric_history(run_id, key)]


def test_fit_logs_metrics_params_tags_and_checkpoints(file_store: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Recorder(lr=0.1, hidden=4)
    initial = {key: value.clone() for key, value in model.state_dict().items()}
    logger = MLFlowLogger("exp", "first-run", save_dir=file_store, tags={"team": "a"}, log_model="all")
    checkpoint = ModelCheckpoint(monitor="val_loss")
    trainer = Trainer(
        default_root_dir=tmp_path, logger=logger, callbacks=[checkpoint], **trainer_kwargs(enable_checkpointing=True)
    )
    train = DataLoader(data(16), batch_size=4)
    trainer.fit(model, train, DataLoader(data(4, seed=1), batch_size=4))

    client = _client(file_store)
    run = client.get_run(logger.run_id)
    assert run.info.experiment_id == logger.experiment_id == client.get_experiment_by_name("exp").experiment_id
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "hidden": "4", "sync_dist": "False"}
    assert run.data.tags["mlflow.runName"] == "first-run" and run.data.tags["team"] == "a"
    assert _history(client, logger.run_id, "train_loss") == model.train_log
    assert [loss for _, loss in model.train_log] == plain_losses(model, initial, train, epochs=2)
    assert _history(client, logger.run_id, "val_loss") == [(3, model.val_log[0]), (7, model.val_log[1])]
    # the run's folder is trainer.log_dir, so checkpoints sit beside the run, where Lightning puts them
    run_dir = Path(file_store) / logger.experiment_id / logger.run_id
    assert trainer.log_dir == logger.log_dir == str(run_dir)
    assert Path(checkpoint.best_model_path).parent == run_dir / "checkpoints"

    # what ModelCheckpoint reports after a save (Lightning calls this hook for each logger)
    logger.after_save_checkpoint(checkpoint)
    stem = Path(checkpoint.best_model_path).stem
    listed = {Path(item.path).name for item in client.list_artifacts(logger.run_id, stem)}
    assert listed == {f"{stem}.ckpt", "metadata.yaml", "aliases.txt"}
    uploaded = Path(run.info.artifact_uri.removeprefix("file://").removeprefix("file:")) / stem / f"{stem}.ckpt"
    assert uploaded.read_bytes() == Path(checkpoint.best_model_path).read_bytes()
    assert "best" in (uploaded.parent / "aliases.txt").read_text()


def test_an_existing_run_is_continued_and_names_are_cleaned(file_store: str) -> None:
    first = MLFlowLogger(save_dir=file_store, prefix="p")
    first.log_metrics({"loss": 1.5}, step=1)
    second = MLFlowLogger(save_dir=file_store, run_id=first.run_id)
    with pytest.warns(RuntimeWarning, match="'a\\(b\\)' as 'ab'"):
        second.log_metrics({"loss": torch.tensor(0.5), "a(b)": 2.0, "note": "text is discarded"}, step=None)
    second.finalize("failed")
    client = _client(file_store)
    assert _history(client, first.run_id, "p-loss") == [(1, 1.5)]
    assert _history(client, first.run_id, "loss") == [(0, 0.5)]
    assert _history(client, first.run_id, "ab") == [(0, 2.0)]
    assert client.get_run(first.run_id).info.status == "FAILED"
    assert client.get_experiment(first.experiment_id).name == "lightning_logs"
    with pytest.raises(MisconfigurationError, match="log_model='best'"):
        MLFlowLogger(save_dir=file_store, log_model="best")  # type: ignore[arg-type]


def test_a_refused_file_store_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import mlflow.environment_variables

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    if not hasattr(mlflow.environment_variables, "MLFLOW_ALLOW_FILE_STORE"):  # MLflow < 3.7 opens it freely
        MLFlowLogger(save_dir=str(tmp_path / "old"))
        return
    with pytest.raises(MisconfigurationError, match="MLFLOW_ALLOW_FILE_STORE=true") as caught:
        MLFlowLogger(save_dir=str(tmp_path / "refused"))
    assert "sqlite:///" in str(caught.value) and "file:" in str(caught.value)


def test_missing_mlflow_is_one_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(MissingBackendError, match=r"pip install 'phalanx-core\[mlflow\]'.*mlflow-skinny"):
        MLFlowLogger()


def test_log_model_true_uploads_when_the_stage_ends(file_store: str, tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val_loss", save_top_k=1)
    best = tmp_path / "ckpts" / "epoch=0-step=4.ckpt"
    best.parent.mkdir()
    best.write_bytes(b"weights")
    checkpoint.best_model_path, checkpoint.best_model_score = str(best), torch.tensor(0.25)
    checkpoint.best_k_models = {str(best): torch.tensor(0.25)}
    logger = MLFlowLogger(save_dir=file_store, log_model=True, checkpoint_path_prefix="models")
    logger.after_save_checkpoint(checkpoint)
    client = _client(file_store)
    assert client.list_artifacts(logger.run_id) == []  # True: kept for the end of the stage
    logger.finalize("success")
    folder = "models/epoch=0-step=4"
    listed = {Path(item.path).name for item in client.list_artifacts(logger.run_id, folder)}
    assert listed == {best.name, "metadata.yaml", "aliases.txt"}
    local = Path(client.get_run(logger.run_id).info.artifact_uri.removeprefix("file://").removeprefix("file:"))
    assert (local / folder / best.name).read_bytes() == b"weights"
    import yaml  # mlflow's own dependency

    metadata = yaml.safe_load((local / folder / "metadata.yaml").read_text())
    assert metadata["score"] == 0.25 and metadata["original_filename"] == best.name
    assert metadata["Checkpoint"]["monitor"] == "val_loss" and "every_n_epochs" in metadata["Checkpoint"]
    assert (local / folder / "aliases.txt").read_text() == "['latest', 'best']"
