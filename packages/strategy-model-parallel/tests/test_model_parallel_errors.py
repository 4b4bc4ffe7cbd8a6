"""Bad input inside a run fails on every rank with the fix, and a failing rank stops the job fast."""

from __future__ import annotations

from pathlib import Path

import pytest
from mp_testing import read_ranks, run_script

pytestmark = [pytest.mark.timeout(300), pytest.mark.timing]


@pytest.mark.parametrize(
    ("fixture", "tag", "fragments"),
    [
        ("mesh_1x2", "badtp", ["tensor_parallel_size=2 does not divide", "net.0.w1.weight (15, 8) dim 0", "Fix:"]),
        ("mesh_1x2", "noconf", ["needs NoConfigureModel.configure_model()", "Fix:"]),
        ("pipeline_2", "nostages", ["NoStages has no pipeline_stages()", "Fix:"]),
        ("pipeline_2", "uncovered", ["does not cover the model", "['net.2.weight', 'net.2.bias']", "Fix:"]),
        (
            "pipeline_schedules_2",
            "fewblocks",
            ["returned 3 block(s)", "'zbv_zero_bubble'", "runs 4 stages", "rank r runs stages r and 3 - r", "Fix:"],
        ),
        ("pipeline_schedules_2", "fewmicro", ["num_microbatches=2", "'dualpipe_v'", "one of [4]", "Fix:"]),
    ],
)
def test_bad_input_is_refused_on_every_rank(request: pytest.FixtureRequest, fixture: str, tag: str, fragments: list[str]) -> None:
    out = request.getfixturevalue(fixture)
    for result in read_ranks(out, tag, 2):
        assert result["error"].startswith("MisconfigurationError")
        for fragment in fragments:
            assert fragment in result["error"], result["error"]
    assert not list(out.glob(f"{tag}_weights_*"))  # nothing written


def test_a_failing_rank_stops_all_four_processes_fast(tmp_path: Path) -> None:
    code, out, seconds = run_script("fail.py", str(tmp_path), timeout=120, check=False)
    assert code != 0
    assert "injected failure on rank 2" in out and "stopping all ranks" in out
    assert seconds < 90, f"the job took {seconds:.0f}s to stop"
