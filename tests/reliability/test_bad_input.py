"""Bad input, table-driven: every case raises one error naming the value, the choices and the fix.

The cases are in ``bad_input_cases.py`` (Trainer arguments, strategy and DeepSpeed options,
checkpoints, spawn pickling) and below (plugin faults, with real installed distributions). Each
failing call must leave every file as it was: nothing written, moved or deleted; in particular a
checkpoint's pickle payload never runs.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bad_input_cases import _REGISTER, CASES, install_plugin

from phalanx import Trainer, discovery

_FIX = re.compile(
    r"\b(fix|pass|use|choose|install|set|define|subclass|upgrade|resume|pick|check|load|make|leave|delete|unset|"
    r"uninstall|block|convert|reinstall)\b",
    re.IGNORECASE,
)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root`` with its size and modification time."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            stat = path.stat()
            found[str(path.relative_to(root))] = (0 if path.is_dir() else stat.st_size, stat.st_mtime_ns)
    return found


def _check_error(error: BaseException, expected: Any, must: tuple[str, ...]) -> None:
    names = {cls.__name__ for cls in type(error).__mro__}
    wanted = expected if isinstance(expected, tuple) else (expected,)
    assert any((w in names) if isinstance(w, str) else isinstance(error, w) for w in wanted), repr(error)
    text = str(error)
    for part in must:
        assert part in text, f"{part!r} missing from: {text}"
    assert _FIX.search(text), f"no fix in: {text}"
    assert error.__context__ is None or error.__cause__ is not None, "a second error escaped while handling the first"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("setup", "expected", "must"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: Any, expected: Any, must: tuple[str, ...]
) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # so a stray relative write shows up in the snapshot
    call = setup(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(BaseException) as info:
        call()
    _check_error(info.value, expected, must)
    _stop_spawn_helpers()
    assert _snapshot(tmp_path) == before, "the failing call wrote, moved or deleted files"
    assert not (tmp_path / "pwned").exists()


def _stop_spawn_helpers() -> None:
    """Stop multiprocessing's resource tracker, which a refused spawn start leaves in this process.

    It is not a worker (no rank ever started: the pickling failed first) but a helper that would
    otherwise live as long as pytest.
    """
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_pid", None) is not None:
        tracker._stop()


# ---------------------------------------------------------------- plugin faults
@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    discovery._reset_for_tests()
    yield root
    discovery._reset_for_tests()
    for key in [k for k in sys.modules if k.startswith("phalanx_fake")]:
        del sys.modules[key]


PLUGIN_CASES = {
    # id: (entry point, module source, requires, strategy asked for, error type, substrings)
    "plugin-broken-import": (
        "fakebroken",
        "raise ImportError('no module named fakelib')\n",
        ("phalanx-core",),
        "fakebroken",
        "UnknownNameError",
        ("'fakebroken'", "ImportError", "PHALANX_DISABLE_PLUGINS=fakebroken"),
    ),
    "plugin-incompatible-core": (
        "fakeold",
        _REGISTER.format(name="fakeold"),
        ("phalanx-core<0.0.1",),
        "fakeold",
        "UnknownNameError",
        ("'fakeold'", "phalanx-core<0.0.1", "upgrade phalanx-core"),
    ),
    "plugin-duplicate-name": (
        "fakedup",
        _REGISTER.format(name="ddp"),
        ("phalanx-core",),
        "ddp",
        "PluginUnavailableError",
        ("'ddp'", "fakedup", "PHALANX_DISABLE_PLUGINS="),
    ),
    "plugin-wrong-hook-signature": (
        "fakesig",
        "from phalanx import hookimpl\n\n@hookimpl\ndef phalanx_register_strategies(registry, extra):\n    pass\n",
        ("phalanx-core",),
        "fakesig_strategy",
        "UnknownNameError",
        ("'fakesig_strategy'",),
    ),
}


@pytest.mark.parametrize("case", list(PLUGIN_CASES))
def test_plugin_fault(site: Path, tmp_path: Path, case: str) -> None:
    entry, source, requires, strategy, expected, must = PLUGIN_CASES[case]
    install_plugin(site, entry, source, requires=requires)
    discovery._reset_for_tests()
    before = _snapshot(tmp_path)
    with pytest.raises(BaseException) as info:
        Trainer(accelerator="cpu", logger=False, strategy=strategy, default_root_dir=str(tmp_path / "root"))
    _check_error(info.value, expected, must)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_name_of_a_blocked_plugin_says_which_and_how_to_unblock(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, strategy: str
) -> None:
    monkeypatch.setenv(discovery.DISABLE_ENV, "ddp")
    discovery._reset_for_tests()
    try:
        with pytest.raises(BaseException) as info:
            Trainer(accelerator="cpu", logger=False, strategy=strategy, default_root_dir=str(tmp_path / "root"))
    finally:
        monkeypatch.delenv(discovery.DISABLE_ENV)
        discovery._reset_for_tests()
    _check_error(
        info.value,
        "UnknownNameError",
        (f"'{strategy}'", "plugin 'ddp'", "blocked by PHALANX_DISABLE_PLUGINS=ddp", f"unset {discovery.DISABLE_ENV}"),
    )
    assert not (tmp_path / "root").exists()


def test_the_table_is_large_enough() -> None:
    assert len(CASES) + len(PLUGIN_CASES) + 2 >= 50
