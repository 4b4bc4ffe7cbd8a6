"""``trainer.fit(torch.compile(model))`` under ddp: the compiled fit trains like the eager one.

One 2-rank job (scripts/compile_fit.py) runs an eager ddp fit, a compiled one (``aot_eager``:
dynamo and AOT autograd, DDP's graph handling included, without generating C++, so it stays
fast; the inductor path is covered in core/tests/test_compile.py) and plain data-parallel
training by hand (gradients all-reduced after ``backward``), in the same processes. The strategy must take the Module out of
the ``OptimizedModule``, wrap it in DDP and compile its ``forward`` again; compiling before
wrapping, or not at all, would show in the facts below.
"""

from __future__ import annotations

from typing import Any

import pytest
from ddp_helpers import load_json, start_job

pytestmark = pytest.mark.timeout(240)

REPORT = "torch.compile under strategy='ddp'"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], str]:
    """Each rank's facts, and the job's whole output (both ranks write to it)."""
    out = tmp_path_factory.mktemp("ddp_compile")
    job = start_job(out, "compile", "compile_fit.py", str(out))
    code = job.wait(180)
    assert not job.leftovers()
    assert code == 0, job.output()
    return [load_json(out / f"compile_rank{rank}.json") for rank in (0, 1)], job.output()


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == 12  # 48 samples / 2 ranks / batch 4, 2 epochs
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_compiled_fit_loses_like_the_eager_fit_and_plain_ddp(job: tuple[list[dict[str, Any]], str]) -> None:
    ranks, _ = job
    for result in ranks:
        eager, compiled, plain = (result[tag]["losses"] for tag in ("eager", "compiled", "plain"))
        assert _max_diff(compiled, eager) < 1e-4
        assert _max_diff(eager, plain) < 1e-6  # and the eager fit is plain data parallel
        assert compiled[-1] < compiled[0]
    assert ranks[0]["compiled"]["losses"] != ranks[1]["compiled"]["losses"]  # each rank saw its own shard


def test_the_module_itself_was_compiled_after_wrapping(job: tuple[list[dict[str, Any]], str]) -> None:
    ranks, _ = job
    for result in ranks:
        assert result["compiled"]["forward_compiled"]  # compiled on the Module, inside the DDP wrapper
        assert result["compiled"]["graphs"] >= 1  # dynamo really traced something


def test_the_compile_is_reported_once(job: tuple[list[dict[str, Any]], str]) -> None:
    ranks, output = job
    reports = ranks[0]["compiled"]["reports"]
    assert len(reports) == 1 and "first call of forward took" in reports[0], reports
    assert ranks[1]["compiled"]["reports"] == []  # rank 0 alone reports
    assert output.count(REPORT) == 1, output
