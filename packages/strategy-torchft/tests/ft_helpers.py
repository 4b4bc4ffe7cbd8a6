"""Helpers shared by the torchft test modules (a uniquely named module: several packages' tests run together)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from phalanx.testing.processes import Job

__all__ = ["SCRIPTS", "assert_same", "committed_steps", "diloco_replay", "load_json", "replay", "start_fit", "weights"]

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from ft_common import diloco_replay, replay  # noqa: E402 - the scripts' own module, importable once its folder is on the path


def start_fit(out: Path, epochs: int, *, env: dict[str, str] | None = None, name: str = "", **options: Any) -> Job:
    """Start ``ft_fit.py``: a local ft_ddp (ft_hsdp, ft_diloco) run (it starts the lighthouse and every group itself),
    or, with ``PHALANX_FT_REPLICA_GROUP`` in ``env``, one group of a job whose groups start apart."""
    command = [sys.executable, str(SCRIPTS / "ft_fit.py"), str(out), str(epochs), json.dumps(options)]
    job_env = {"OMP_NUM_THREADS": "1", "RUST_LOG": "warn", **(env or {})}
    return Job(command, out, env=job_env, name=name or f"ft_fit-{out.name}", warm=True)


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def weights(result: dict[str, Any], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v).reshape(like[k].shape) for k, v in result["state"].items()}


def committed_steps(log: list[dict[str, Any]], groups: dict[int, list[int]]) -> list[tuple[int, int, list[int]]]:
    """(epoch, batch, ranks) of every committed step; ``groups`` maps a participant count to the ranks
    whose batches the step averaged (which groups were in the quorum)."""
    return [(e["epoch"], e["batch_idx"], groups[e["participants"]]) for e in log if e["committed"]]


def assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=1e-6, rtol=0)
