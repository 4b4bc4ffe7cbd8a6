"""Running the 2-rank script of the callback and logger kits once per class, and reading what it recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from phalanx.testing.kits._common import ConformanceKit, import_paths, target_spec
from phalanx.testing.kits._rank_script import PHASES, render_rank_script
from phalanx.testing.processes import ScriptResult, run_script

__all__ = ["RankRunKit", "Runs"]


@dataclass
class Runs:
    """The outcome of one script: its result and, per phase and rank, the record it wrote."""

    out: Path
    result: ScriptResult
    records: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    #: rank -> paths it wrote under the run's folder (``event path`` strings).
    writes: dict[int, list[str]] = field(default_factory=dict)

    def record(self, phase: str, rank: int) -> dict[str, Any]:
        if (phase, rank) not in self.records:
            pytest.fail(f"rank {rank} wrote no record for the {phase!r} fit\n{self.result.output()}")
        return self.records[(phase, rank)]


def _load(out: Path, result: ScriptResult) -> Runs:
    import torch

    runs = Runs(out=out, result=result)
    for phase in PHASES:
        for path in sorted((out / "kit").glob(f"{phase}-rank*.pt")):
            rank = int(path.stem.rsplit("rank", 1)[1])
            runs.records[(phase, rank)] = torch.load(path, weights_only=False)  # written by the kit's own script
    for path in sorted((out / "kit").glob("writes-*.txt")):
        for line in path.read_text().splitlines():
            writer, event, written = line.split("\t", 2)
            runs.writes.setdefault(int(writer), []).append(f"{event} {Path(written).relative_to(out)}")
    return runs


class RankRunKit(ConformanceKit):
    """What the callback and logger kits share: the plugin attribute, the run settings, the run fixture."""

    _kind: ClassVar[str] = ""
    #: A registered strategy name for the runs; None uses a DDP-wrapping ParallelStrategy from the core.
    strategy: ClassVar[str | None] = None
    #: How that core strategy starts its ranks (fork is the cheapest on CPU; see ParallelStrategy).
    start_method: ClassVar[str] = "fork"
    steps: ClassVar[int] = 6
    #: The first fit of the resume check stops here, mid-epoch (4 batches per rank and epoch).
    resume_at: ClassVar[int] = 3
    #: True when the plugin documents writing files on every rank (each rank its own file).
    writes_on_every_rank: ClassVar[bool] = False
    timeout: ClassVar[float] = 180.0

    @classmethod
    def _plugin_value(cls) -> Any:
        raise NotImplementedError

    @classmethod
    def _plugin_params(cls) -> dict[str, Any]:
        raise NotImplementedError

    #: The checks that read the resumed fit; when none of them is selected, it is not run.
    _RESUME_CHECKS: ClassVar[frozenset[str]] = frozenset()

    @pytest.fixture(scope="class")
    @classmethod
    def runs(cls, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Runs:
        """The fits (full, then resumed) in one fresh process, shared by the checks that read them."""
        out = tmp_path_factory.mktemp(cls._kind)
        resume = any(
            getattr(item, "cls", None) is cls and getattr(item, "originalname", item.name) in cls._RESUME_CHECKS
            for item in request.session.items
        )
        script = render_rank_script(
            out / f"{cls._kind}_kit_run.py",
            out=out,
            kind=cls._kind,
            spec=target_spec(cls._plugin_value()),
            params=cls._plugin_params(),
            strategy=cls.strategy,
            start_method=cls.start_method,
            steps=cls.steps,
            resume_at=cls.resume_at,
            resume=resume,
            paths=import_paths(),
        )
        return _load(out, run_script(script, timeout=cls.timeout))

    def _check_ran(self, runs: Runs) -> None:
        """The run exited 0 and left nothing behind."""
        runs.result.check()

    def _check_no_writes_off_rank_zero(self, runs: Runs) -> None:
        if self.writes_on_every_rank:
            runs.result.check()
            return
        off_zero = {rank: paths for rank, paths in runs.writes.items() if rank != 0}
        assert not off_zero, (
            f"ranks other than 0 wrote files: {off_zero}. Write from global rank 0 only (phalanx.utilities.rank_zero_only), "
            "or set writes_on_every_rank = True when every rank documentedly writes its own file"
        )
        runs.result.check()
