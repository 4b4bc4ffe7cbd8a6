"""The rename rule (tests/lightning/rename.py) does exactly what phalanx promises Lightning users, no more."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from rename import code_tokens, to_phalanx

SCRIPTS = sorted((Path(__file__).parent / "scripts").glob("*.py"))


@pytest.mark.parametrize(
    ("lightning", "phalanx"),
    [
        ("import lightning as L\n", "import phalanx as L\n"),
        ("import lightning.pytorch as pl\n", "import phalanx as pl\n"),
        ("import lightning.pytorch\n", "import phalanx\n"),
        ("from lightning.pytorch import LightningModule, Trainer\n", "from phalanx import Module, Trainer\n"),
        (
            "from lightning.pytorch.callbacks import ModelCheckpoint\n",
            "from phalanx.callbacks import ModelCheckpoint\n",
        ),
        (
            "from lightning.pytorch.strategies import ModelParallelStrategy\n",
            "from phalanx.strategies import ModelParallelStrategy\n",
        ),
        ("from lightning.pytorch.loggers import CSVLogger\n", "from phalanx.loggers import CSVLogger\n"),
        ("from lightning.pytorch.utilities import rank_zero_only\n", "from phalanx.utilities import rank_zero_only\n"),
        ("from lightning import LightningDataModule\n", "from phalanx import DataModule\n"),
        ("import os, lightning as L\n", "import os, phalanx as L\n"),
        ("x = 1; import lightning as L\n", "x = 1; import phalanx as L\n"),
        (
            "from lightning.pytorch.callbacks import (\n    EarlyStopping,\n    ModelCheckpoint,\n)\n",
            "from phalanx.callbacks import (\n    EarlyStopping,\n    ModelCheckpoint,\n)\n",
        ),
        ("class Net(L.LightningModule):\n    pass\n", "class Net(L.Module):\n    pass\n"),
        ("class Data(pl.LightningDataModule):\n    pass\n", "class Data(pl.DataModule):\n    pass\n"),
        ("trainer = lightning.pytorch.Trainer()\n", "trainer = phalanx.Trainer()\n"),
    ],
    ids=lambda text: text.splitlines()[0][:48],
)
def test_each_form_of_the_rule(lightning: str, phalanx: str) -> None:
    assert to_phalanx(lightning) == phalanx


@pytest.mark.parametrize(
    "source",
    [
        # outside the rule: other packages and names that merely contain the words
        "import pytorch_lightning as pl\n",
        "from lightning.fabric import Fabric\n",
        "import lightning\n",
        "from mypkg import lightning as L\n",
        "x = my.lightning.pytorch\n",
        "class MyLightningModuleMixin:\n    pass\n",
        "lightning_module = LightningModuleFactory()\n",
        "trainer.lightning_module.log('x', 1)\n",
        # comments and strings are not code
        "# from lightning.pytorch import LightningModule\n",
        "doc = 'import lightning as L; LightningModule'\n",
        '"""\nimport lightning as L\nfrom lightning import LightningModule\n"""\n',
    ],
    ids=lambda text: text.splitlines()[0][:48] or text.splitlines()[1][:48],
)
def test_everything_else_is_left_alone(source: str) -> None:
    assert to_phalanx(source) == source


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_the_renamed_scripts_name_no_lightning(script: Path) -> None:
    source = script.read_text(encoding="utf-8")
    assert "lightning" in code_tokens(source)  # the script really is written against Lightning
    renamed = to_phalanx(source)
    ast.parse(renamed)
    assert not [token for token in code_tokens(renamed) if "lightning" in token.lower()]
    # only the import lines and the two class names changed: same number of lines, same statements
    assert len(renamed.splitlines()) == len(source.splitlines())
    changed = [(a, b) for a, b in zip(source.splitlines(), renamed.splitlines()) if a != b]
    for before, after in changed:
        class_names_only = before.replace("LightningDataModule", "DataModule").replace("LightningModule", "Module")
        an_import = before.lstrip().startswith(("import ", "from ")) and "phalanx" in after
        assert after == class_names_only or an_import, (before, after)


def test_the_rule_is_idempotent() -> None:
    for script in SCRIPTS:
        once = to_phalanx(script.read_text(encoding="utf-8"))
        assert to_phalanx(once) == once
