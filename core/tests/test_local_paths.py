"""Path arguments: local paths and ``file://`` stay local; URLs go to fsspec, or fail naming the package.

A URL whose file system is not installed must fail where it is given, never become a local
folder named after the scheme (``gs:``). ``gcsfs`` and ``adlfs`` are not installed in the test
environments, which is what these tests rely on.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.checkpoint_io.storage import is_remote, join, parent_and_name
from phalanx.errors import MisconfigurationError
from phalanx.loggers import CSVLogger
from phalanx.utilities.paths import check_path, url_scheme

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gcsfs") is not None or importlib.util.find_spec("adlfs") is not None,
    reason="needs an environment without gcsfs and adlfs, to see the missing-package errors",
)


def test_plain_paths_file_urls_and_memory_urls(tmp_path: Path) -> None:
    assert check_path(tmp_path / "a", argument="x") == str(tmp_path / "a")
    assert check_path(f"file://{tmp_path}/b", argument="x") == f"{tmp_path}/b"
    assert check_path("memory://bucket/run/", argument="x") == "memory://bucket/run"
    assert url_scheme("s3://bucket/key") == "s3" and url_scheme("runs/s3:x") is None and url_scheme(3) is None
    assert is_remote("s3://b/k") and not is_remote("file:///x") and not is_remote("runs")
    assert join("s3://b/run/", "ckpts", "last.ckpt") == "s3://b/run/ckpts/last.ckpt"
    assert parent_and_name("s3://b/run/last.ckpt/") == ("s3://b/run", "last.ckpt")


@pytest.mark.parametrize(
    ("make", "shown", "package"),
    [
        (lambda: Trainer(default_root_dir="gs://bucket/run", logger=False), "Trainer(default_root_dir=...)", "gcsfs"),
        (lambda: ModelCheckpoint(dirpath="gs://bucket/ckpt"), "ModelCheckpoint(dirpath=...)", "gcsfs"),
        (lambda: CSVLogger("abfs://container/logs"), "CSVLogger(save_dir=...)", "adlfs"),
    ],
)
def test_a_url_without_its_filesystem_names_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: object, shown: str, package: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MisconfigurationError, match=f"pip install {package}") as error:
        make()  # type: ignore[operator]
    assert shown in str(error.value)
    assert os.listdir(tmp_path) == []  # no local folder named after the scheme


def test_an_unknown_scheme_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MisconfigurationError, match=r"'nosuchfs://b/run'.*no file system for nosuchfs://"):
        Trainer(default_root_dir="nosuchfs://b/run", logger=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_loggers_with_their_own_stores_refuse_a_url_save_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logger: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    name = {"wandb": "WandbLogger", "mlflow": "MLFlowLogger"}[logger]
    pytest.importorskip({"wandb": "wandb", "mlflow": "mlflow"}[logger])
    import phalanx.loggers

    with pytest.raises(MisconfigurationError, match=r"'memory://b/run'.*local folder"):
        getattr(phalanx.loggers, name)(save_dir="memory://b/run")
    assert os.listdir(tmp_path) == []
