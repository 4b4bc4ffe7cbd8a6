"""A full checkpoint written by ddp resumes on 2 fsdp ranks exactly like plain PyTorch continues it.

ddp (2 ranks) trains the fsdp tests' model for one epoch and saves an ordinary full file;
fsdp (2 ranks) resumes it for the second epoch. The expected losses are plain PyTorch's second
epoch from the file's weights and AdamW state, on the same two ranks' batches (the fsdp suite's
``plain_two_rank``). Needs both plugins: this runs in the integration session.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from phalanx.testing.processes import run_command

ROOT = Path(__file__).resolve().parents[1]
FSDP_TESTS = ROOT / "packages" / "strategy-fsdp" / "tests"
for _path in (FSDP_TESTS, FSDP_TESTS / "scripts"):  # fsdp's test helpers and their shared model (common.py)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

pytest.importorskip("phalanx_strategy_ddp", reason="the integration session installs every plugin")
pytest.importorskip("phalanx_strategy_fsdp", reason="the integration session installs every plugin")

pytestmark = pytest.mark.timeout(400)


def test_a_ddp_full_checkpoint_resumes_exactly_under_fsdp(tmp_path: Path) -> None:
    from common import make_net, make_optimizer
    from fsdp_testing import RUN_TIMEOUT, SCRIPTS, read_ranks, run_phalanx
    from test_fsdp_variants import plain_two_rank

    ckpt = tmp_path / "ddp_full.ckpt"
    command = [sys.executable, str(ROOT / "tests" / "scripts" / "ddp_full_checkpoint.py"), str(SCRIPTS), str(ckpt)]
    done = run_command(command, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"}, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    done.check_leftovers()
    full = torch.load(ckpt, weights_only=True)
    assert full["global_step"] == 3 and full["state_dict"]  # 6 batches per rank, accumulate 2

    run = {"tag": "fromddp", "resume": ckpt.name, "strategy": {"auto_wrap_policy": "Block"}}
    run_phalanx("variants.py", str(tmp_path), json.dumps([run]))

    model = make_net()
    model.load_state_dict({k.removeprefix("net."): v for k, v in full["state_dict"].items()})
    optimizer = make_optimizer(model.parameters())
    optimizer.load_state_dict(full["optimizer_states"][0])
    expected = plain_two_rank(model, optimizer, (0.5, "norm"))
    for rank, results in enumerate(read_ranks(tmp_path, "variants")):
        got = results["fromddp"]
        assert got["global_step"] == 6 and got["sharded"] == ["", "net.0", "net.1"]
        assert len(got["losses"]) == len(expected[rank]) == 6
        worst = max(abs(a - b) for a, b in zip(got["losses"], expected[rank]))
        assert worst <= 1e-5, f"rank {rank}: {got['losses']} vs plain {expected[rank]}"
