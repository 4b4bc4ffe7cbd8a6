"""Bad input fails at ``Trainer(...)`` (or at the strategy's construction), with one clear error each.

torchft missing is checked in a real environment without it: a fresh interpreter whose only
site directory is a copy of this one's (links) minus torchft, so both the import and the
installed-metadata check see it absent, as on a machine where it was never installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from phalanx_strategy_torchft import FTDDPStrategy, FTDiLoCoStrategy, FTHSDPStrategy

import phalanx
from phalanx.environments.local import find_free_port
from phalanx.errors import MisconfigurationError
from phalanx.strategies import StrategyRegistry

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]


def test_fewer_groups_than_min_replicas_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match=r"min_replicas=3.*replica_groups=2.*Fix: lower min_replicas"):
        phalanx.Trainer(strategy=StrategyRegistry.get("ft_ddp", replica_groups=2, min_replicas=3), accelerator="cpu")
    with pytest.raises(MisconfigurationError, match=r"replica_group_id=2.*0\.\.1"):
        FTDDPStrategy(replica_groups=2, replica_group_id=2)
    with pytest.raises(MisconfigurationError, match=r"quorum_timeout=-1"):
        FTDDPStrategy(quorum_timeout=-1)
    with pytest.raises(MisconfigurationError, match=r"start_method='spawn'.*popen"):
        FTDDPStrategy(start_method="spawn")
    with pytest.raises(MisconfigurationError, match=r"FTHSDPStrategy\(min_replicas=3\).*replica_groups=2"):
        phalanx.Trainer(strategy=StrategyRegistry.get("ft_hsdp", replica_groups=2, min_replicas=3), accelerator="cpu")
    with pytest.raises(MisconfigurationError, match=r"auto_wrap_policy=\['Linear'\].*nn.Module subclasses"):
        FTHSDPStrategy(auto_wrap_policy=["Linear"])  # type: ignore[list-item]


def test_bad_diloco_options_are_refused_naming_the_fix() -> None:
    import functools

    import torch

    cases = [
        (
            {"sync_every": 6, "num_fragments": 4},
            r"sync_every=6\) is not a multiple of num_fragments=4.*Fix: sync_every=4 or 8",
        ),
        ({"sync_every": 3, "num_fragments": 4}, r"sync_every=3\) is not a multiple.*Fix: sync_every=4"),
        (
            {"sync_every": 4, "num_fragments": 2, "fragment_sync_delay": 2},
            r"fragment_sync_delay=2\).*0\.\.1.*Fix: fragment_sync_delay=1",
        ),
        ({"sync_every": 0}, r"sync_every=0\) must be an integer >= 1"),
        ({"num_fragments": True}, r"num_fragments=True\) must be an integer >= 1"),
        ({"fragment_update_alpha": 1.5}, r"fragment_update_alpha=1\.5\) must be a number in \[0, 1\]"),
        (
            {"outer_optimizer": "sgd"},
            r"outer_optimizer=\.\.\.\) got 'sgd'.*Fix: e\.g\. outer_optimizer=functools\.partial",
        ),
        ({"sync_evry": 3}, r"unknown option sync_evry=3\. Did you mean 'sync_every'\?"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(MisconfigurationError, match=pattern):
            FTDiLoCoStrategy(**kwargs)
    instance = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.7)
    with pytest.raises(MisconfigurationError, match=r"got a SGD instance: it must be a callable"):
        FTDiLoCoStrategy(outer_optimizer=instance)  # type: ignore[arg-type]
    with pytest.raises(MisconfigurationError, match=r"FTDiLoCoStrategy\(min_replicas=3\).*replica_groups=2"):
        phalanx.Trainer(strategy=StrategyRegistry.get("ft_diloco", min_replicas=3), accelerator="cpu")
    strategy = FTDiLoCoStrategy(
        sync_every=8, num_fragments=4, fragment_sync_delay=1, outer_optimizer=functools.partial(torch.optim.SGD, lr=0.5)
    )
    assert (strategy.sync_interval, strategy.fragment_sync_delay) == (2, 1)


def test_fragments_and_checkpoint_state_are_checked() -> None:
    """The fragment split (contiguous, balanced by size, none empty) and the resume checks, without a fit."""
    import torch
    from phalanx_strategy_torchft.diloco import check_diloco_state, split_fragments

    from phalanx.errors import CheckpointError

    def names(sizes: list[int], n: int) -> list[list[str]]:
        named = [(f"p{i}", torch.nn.Parameter(torch.zeros(size))) for i, size in enumerate(sizes)]
        return [[name for name, _ in run] for run in split_fragments(named, n)]

    assert names([128, 16, 16, 1], 2) == [["p0"], ["p1", "p2", "p3"]]
    assert names([128, 16, 16, 1], 3) == [["p0"], ["p1"], ["p2", "p3"]]
    assert names([10, 10, 10, 10], 2) == [["p0", "p1"], ["p2", "p3"]]
    assert names([1, 1, 100], 3) == [["p0"], ["p1"], ["p2"]]
    fragments = [["p0"], ["p1"]]
    state = {"sync_every": 8, "num_fragments": 2, "fragments": fragments, "fragment_sync_delay": 1, "local_step": 0}
    check_diloco_state(state, sync_every=8, num_fragments=2, fragments=fragments)
    with pytest.raises(CheckpointError, match=r"sync_every=8, num_fragments=2.*this run has sync_every=4.*Fix: resume"):
        check_diloco_state(state, sync_every=4, num_fragments=2, fragments=fragments)
    with pytest.raises(
        CheckpointError, match=r"saved 3 inner steps after a sync.*steps 3\.\.3 of each 4.*multiple of 4"
    ):
        check_diloco_state({**state, "local_step": 3}, sync_every=8, num_fragments=2, fragments=fragments)


def test_unreachable_lighthouse_fails_at_trainer_construction() -> None:
    address = f"http://127.0.0.1:{find_free_port()}"
    started = time.monotonic()
    with pytest.raises(MisconfigurationError, match=r"lighthouse at 'http://127\.0\.0\.1:\d+' is unreachable"):
        phalanx.Trainer(strategy=FTDDPStrategy(lighthouse=address), accelerator="cpu", devices=1, logger=False)
    assert time.monotonic() - started < 15
    with pytest.raises(MisconfigurationError, match=r"lighthouse='not an address' is not a lighthouse address"):
        FTDDPStrategy(lighthouse="not an address")


def _site_without_torchft(root: Path) -> Path:
    site = Path(sysconfig.get_paths()["purelib"])
    copy = root / "site"
    copy.mkdir()
    for entry in site.iterdir():
        if entry.name.lower().startswith("torchft"):
            continue
        (copy / entry.name).symlink_to(entry)
    return copy


def test_torchft_missing_is_listed_unavailable_with_the_pip_command(tmp_path: Path) -> None:
    site = _site_without_torchft(tmp_path)
    code = (
        f"import site, sys, json; site.addsitedir({str(site)!r})\n"
        "import importlib.util; assert importlib.util.find_spec('torchft') is None\n"
        "from phalanx.cli import main\n"
        "sys.exit(main(['strategies', '--json']))\n"
    )
    listed = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=90)
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout) if r["name"] in ("ft_ddp", "ft_hsdp", "ft_diloco")}
    assert rows.keys() == {"ft_ddp", "ft_hsdp", "ft_diloco"}
    for row in rows.values():
        assert row["available"] is False
        assert "pip install 'torchft>=0.2'" in row["reason"]
    code = (
        f"import site, sys; site.addsitedir({str(site)!r})\n"
        "import phalanx\n"
        "phalanx.Trainer(strategy='ft_ddp', accelerator='cpu', devices=1)\n"
    )
    selected = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=90)
    assert selected.returncode != 0
    assert "pip install 'torchft>=0.2'" in selected.stderr, selected.stderr[-2000:]
