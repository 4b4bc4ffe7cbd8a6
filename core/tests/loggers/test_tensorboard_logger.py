"""TensorBoardLogger on real fits, read back with TensorBoard's own EventAccumulator.

The two-process test runs this file as a script (``python test_tensorboard_logger.py OUT``) under
the core's own ParallelStrategy: both ranks build the logger, only rank 0 may write, and the
values written are the rank-averaged ``sync_dist=True`` ones.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from logger_helpers import Recorder, data, plain_losses, trainer_kwargs
from torch import nn
from torch.utils.data import DataLoader

from phalanx.loggers._backends import MissingBackendError
from phalanx.loggers.csv_logs import CSVLogger
from phalanx.loggers.tensorboard import TensorBoardLogger
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer


def _read(log_dir: str) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(log_dir)
    accumulator.Reload()
    return accumulator


def _scalars(accumulator: Any, tag: str) -> list[tuple[int, float]]:
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def _hparams(accumulator: Any) -> dict[str, Any]:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = accumulator.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    values = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    return {key: getattr(value, value.WhichOneof("kind")) for key, value in values.items()}


def test_fit_writes_scalars_hparams_graph_and_a_second_logger(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Recorder(lr=0.1, hidden=4)
    initial = {key: value.clone() for key, value in model.state_dict().items()}
    tensorboard = TensorBoardLogger(tmp_path, log_graph=True)
    csv_logger = CSVLogger(tmp_path / "csv")
    trainer = Trainer(default_root_dir=tmp_path, logger=[tensorboard, csv_logger], **trainer_kwargs())
    train = DataLoader(data(16), batch_size=4)
    trainer.fit(model, train, DataLoader(data(4, seed=1), batch_size=4))

    log_dir = tmp_path / "lightning_logs" / "version_0"
    assert trainer.log_dir == tensorboard.log_dir == str(log_dir)  # the first logger decides
    events = _read(str(log_dir))
    # every step's loss, at the step the Module saw, equal to what it computed and to plain SGD
    assert _scalars(events, "train_loss") == model.train_log
    assert [loss for _, loss in model.train_log] == plain_losses(model, initial, train, epochs=2)
    assert _scalars(events, "val_loss") == [(3, model.val_log[0]), (7, model.val_log[1])]
    assert _scalars(events, "hp_metric") == [(0, -1.0)]
    assert _hparams(events) == {"lr": 0.1, "hidden": 4.0, "sync_dist": False}
    assert yaml.safe_load((log_dir / "hparams.yaml").read_text()) == {"lr": 0.1, "hidden": 4, "sync_dist": False}
    graph = events.Graph()  # traced on example_input_array at the start of fit
    assert any("layer" in node.name for node in graph.node), [node.name for node in graph.node]
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    # the second logger got the same numbers
    with open(csv_logger.metrics_file_path) as handle:
        rows = [row for row in csv.DictReader(handle) if row["train_loss"]]
    assert [(int(row["step"]), float(row["train_loss"])) for row in rows] == model.train_log


def test_versions_names_sub_dir_and_prefix(tmp_path: Path) -> None:
    first = TensorBoardLogger(tmp_path, name="exp")
    first.log_metrics({"loss": 0.5}, step=2)
    first.finalize("success")
    assert first.log_dir == str(tmp_path / "exp" / "version_0")
    second = TensorBoardLogger(tmp_path, name="exp", prefix="p", sub_dir="fold_1")
    assert second.version == 1 and second.log_dir == str(tmp_path / "exp" / "version_1" / "fold_1")
    second.log_metrics({"loss": torch.tensor(0.25), "lr": {"a": 1.0, "b": 2.0}}, step=4)
    second.finalize("success")
    assert _scalars(_read(second.log_dir), "p-loss") == [(4, 0.25)]
    assert TensorBoardLogger(tmp_path, name="", version="mine").log_dir == str(tmp_path / "mine")
    assert TensorBoardLogger(tmp_path, name="exp", version=7).log_dir == str(tmp_path / "exp" / "version_7")
    with pytest.raises(ValueError, match="only numbers"):
        TensorBoardLogger(tmp_path, name="bad").log_metrics({"text": "not a number"}, step=0)


def test_log_graph_needs_an_input_and_is_off_by_default(tmp_path: Path) -> None:
    off = TensorBoardLogger(tmp_path, name="off")
    off.log_graph(nn.Linear(3, 1), torch.zeros(1, 3))
    off.log_metrics({"loss": 1.0}, step=0)
    off.finalize("success")
    assert not _read(off.log_dir).Tags()["graph"]
    on = TensorBoardLogger(tmp_path, name="on", log_graph=True)
    with pytest.warns(UserWarning, match="example_input_array"):
        on.log_graph(nn.Linear(3, 1))
    with pytest.warns(UserWarning, match="tensor or a tuple"):
        on.log_graph(nn.Linear(3, 1), [1, 2, 3])
    on.log_graph(nn.Linear(3, 1), torch.zeros(1, 3))
    on.finalize("success")
    assert _read(on.log_dir).Tags()["graph"]


def test_missing_tensorboard_is_one_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(MissingBackendError, match=r"pip install 'phalanx-core\[tensorboard\]'") as caught:
        TensorBoardLogger(tmp_path)
    assert isinstance(caught.value, ModuleNotFoundError) and caught.value.name == "tensorboard"


def test_importing_the_loggers_imports_no_backend() -> None:
    code = (
        "import sys, phalanx.loggers, phalanx.loggers.tensorboard, phalanx.loggers.mlflow, phalanx.loggers.wandb\n"
        "print([m for m in ('tensorboard', 'mlflow', 'wandb', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


# ------------------------------------------------------------------ two processes
@pytest.mark.timeout(150)
def test_two_ranks_only_rank_zero_writes_the_synced_values(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[1]["experiment"] == "DummyExperiment" and ranks[0]["experiment"] == "SummaryWriter"
    versions = sorted(p.name for p in (tmp_path / "lightning_logs").iterdir())
    assert versions == ["version_0"]  # rank 1 created no folder of its own
    log_dir = tmp_path / "lightning_logs" / "version_0"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    written = _scalars(_read(str(log_dir)), "train_loss")
    (steps0, losses0), (steps1, losses1) = (zip(*rank["train"]) for rank in ranks)
    assert list(steps0) == list(steps1) == [step for step, _ in written]
    means = [float((torch.tensor(a) + torch.tensor(b)) / 2) for a, b in zip(losses0, losses1)]
    assert [value for _, value in written] == means
    assert losses0 != losses1  # the ranks saw different data: a mean differs from either


def _rank_main(out: str) -> None:
    from phalanx.strategies import ParallelStrategy

    torch.manual_seed(0)
    model = Recorder(sync_dist=True)
    logger = TensorBoardLogger(out)
    trainer = Trainer(
        devices=2, strategy=ParallelStrategy(), logger=logger, default_root_dir=out, **trainer_kwargs(max_epochs=1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(data(16), batch_size=4))
    record = {"train": model.train_log, "experiment": type(logger.experiment).__name__}
    (Path(out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank_main(sys.argv[1])
