"""URLs where phalanx writes: refused with the ways that work, never turned into a local folder "s3:"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.loggers import CSVLogger
from phalanx.utilities.paths import local_path, url_scheme


def test_plain_paths_and_file_urls_are_local(tmp_path: Path) -> None:
    assert local_path(tmp_path / "a", argument="x") == str(tmp_path / "a")
    assert local_path(f"file://{tmp_path}/b", argument="x") == f"{tmp_path}/b"
    assert url_scheme("s3://bucket/key") == "s3" and url_scheme("runs/s3:x") is None and url_scheme(3) is None


@pytest.mark.parametrize(
    ("make", "shown"),
    [
        (lambda: Trainer(default_root_dir="s3://bucket/run", logger=False), "Trainer(default_root_dir=...)"),
        (lambda: ModelCheckpoint(dirpath="gs://bucket/ckpt"), "ModelCheckpoint(dirpath=...)"),
        (lambda: CSVLogger("hdfs://namenode/logs"), "CSVLogger(save_dir=...)"),
    ],
)
def test_urls_are_refused_where_phalanx_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: object, shown: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MisconfigurationError, match=r"URL.*mount") as error:
        make()  # type: ignore[operator]
    assert shown in str(error.value)
    assert os.listdir(tmp_path) == []  # no local folder named after the scheme
