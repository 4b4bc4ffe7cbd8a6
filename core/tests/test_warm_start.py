"""A job forked from the warm parent is what ``python script.py`` would have been.

Each check runs the same script both ways (a new interpreter, and a fork of the pre-warmed parent
process) and compares what the script saw and how it ended: arguments, import path, working
directory, environment, ``__main__``, thread count, exit status for every way a script ends, its
own session, and a spawned multiprocessing child (which re-imports ``__main__`` by its file).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from phalanx.testing.processes import Job, run_command
from phalanx.testing.warm import can_start_warm, warm_parent

pytestmark = pytest.mark.timeout(120)

_REPORT = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    import torch

    def square(x):
        return x * x

    if __name__ == "__main__":
        import __main__
        how = sys.argv[1]
        seen = {
            "argv": sys.argv[1:],
            "path0": sys.path[0],
            "on_path": os.environ["EXTRA"] in sys.path,
            "cwd": os.getcwd(),
            "var": os.environ.get("PHALANX_WARM_CHECK"),
            "rank": os.environ.get("RANK"),
            "main_file": os.path.basename(__main__.__file__),
            "threads": torch.get_num_threads(),
            "stdin": sys.stdin.read(),
            "session_leader": os.getsid(0) == os.getpid(),
        }
        if how == "spawn":
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                seen["spawned"] = pool.map(square, [3])
        print(json.dumps(seen), flush=True)
        print("to stderr", file=sys.stderr)
        if how == "raise":
            raise ValueError("boom")
        if how == "exit-text":
            sys.exit("stopped with a message")
        if how == "interrupt":
            raise KeyboardInterrupt
        if how == "term":
            os.kill(os.getpid(), 15)
        sys.exit(int(how) if how.isdigit() else 0)
    """
)


def _run(tmp_path: Path, how: str, *, warm: bool) -> tuple[int, dict, str, Job]:
    folder = tmp_path / ("warm" if warm else "cold") / how
    folder.mkdir(parents=True)
    script = tmp_path / "report.py"
    script.write_text(_REPORT)
    extra = tmp_path / "extra"
    env = {"PHALANX_WARM_CHECK": "yes", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(extra), "EXTRA": str(extra)}
    job = Job([str(script), how], folder, env=env, warm=warm)
    assert job.warm is warm
    code = job.wait(90)
    assert job.leftovers() == [], job.output()
    first = job.stdout.splitlines()[0] if job.stdout.strip() else "{}"
    return code, json.loads(first), job.stderr, job


@pytest.mark.parametrize("how", ["0", "3", "raise", "exit-text", "interrupt", "term", "spawn"])
def test_a_warm_job_sees_and_ends_as_a_new_interpreter_would(tmp_path: Path, how: str, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "5")  # a rank variable of the test process is never inherited
    cold = _run(tmp_path, how, warm=False)
    warm = _run(tmp_path, how, warm=True)
    assert warm[0] == cold[0], f"exit {warm[0]} warm, {cold[0]} cold\n{warm[3].output()}"
    seen_cold, seen_warm = cold[1], warm[1]
    assert seen_cold["cwd"].endswith(f"cold/{how}") and seen_warm["cwd"].endswith(f"warm/{how}")
    seen_cold.pop("cwd"), seen_warm.pop("cwd")
    assert seen_warm == seen_cold
    assert seen_warm["rank"] is None and seen_warm["threads"] == 1 and seen_warm["session_leader"]
    for stderr in (cold[2], warm[2]):
        assert "to stderr" in stderr
    expected = {"0": 0, "3": 3, "raise": 1, "exit-text": 1, "interrupt": -signal.SIGINT, "term": -signal.SIGTERM}
    assert cold[0] == expected.get(how, 0)
    if how == "raise":
        assert "ValueError: boom" in warm[2] and "Traceback" in warm[2]
    if how == "exit-text":
        assert "stopped with a message" in warm[2]
    if how == "spawn":
        assert seen_warm["spawned"] == [9]


def test_a_module_run_with_dash_m_gets_its_own_argv(tmp_path: Path) -> None:
    package = tmp_path / "pkg_for_warm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("import sys, json\nprint(json.dumps([__name__, sys.argv[1:]]))\n")
    outputs = []
    for warm in (False, True):
        result = run_command([sys.executable, "-m", "pkg_for_warm", "a", "b"], cwd=tmp_path, warm=warm)
        assert result.returncode == 0, result.output()
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1] == ["__main__", ["a", "b"]]


def test_what_cannot_be_made_equivalent_starts_cold(tmp_path: Path) -> None:
    python = sys.executable
    assert can_start_warm([python, "s.py"], dict(os.environ))
    assert can_start_warm([python, "-m", "torch.distributed.run", "s.py"], dict(os.environ))
    assert not can_start_warm([python, "-c", "pass"], dict(os.environ))  # -c: the launchers cannot re-run it
    assert not can_start_warm([python, "-X", "dev", "s.py"], dict(os.environ))
    assert not can_start_warm(["/bin/echo", "s.py"], dict(os.environ))
    assert not can_start_warm([python, "s.py"], {**os.environ, "PYTHONHASHSEED": "123"})
    job = Job([python, "-c", "print('cold')"], tmp_path, warm=True)
    assert job.wait(60) == 0 and not job.warm and job.stdout.strip() == "cold"


def test_the_warm_parent_belongs_to_no_job_and_no_test(tmp_path: Path) -> None:
    """The leak checks look for a job's or a test's marker in each process's environment: the
    parent, which outlives every job and test, carries neither (the jobs it forks get theirs)."""
    script = tmp_path / "quick.py"
    script.write_text("import os\nprint(os.environ['PHALANX_TEST_JOB'])\n")
    job = Job([str(script)], tmp_path, warm=True)
    assert job.wait(90) == 0 and job.warm
    assert job.stdout.strip() == job.marker
    parent = warm_parent().pid
    assert parent is not None
    with open(f"/proc/{parent}/environ", "rb") as fh:
        environ = fh.read()
    assert b"PHALANX_TEST_JOB=" not in environ and b"PHALANX_TEST_CASE=" not in environ


_LAUNCHER_JOB = Path(__file__).parent / "launcher_scripts" / "launcher_job.py"


@pytest.mark.parametrize("ranks", ["warm", "real start"])
def test_a_warm_jobs_ranks_are_forked_warm_unless_their_start_is_under_test(tmp_path: Path, ranks: str) -> None:
    """The popen launcher of a warm job asks the warm parent for its ranks (phalanx.launchers.
    _warm_ranks): each is the parent's child, not the launcher's, with the launcher's environment,
    streams and exit reported back; ``PHALANX_TEST_WARM_RANKS=0`` keeps the real ``Popen``."""
    env = {} if ranks == "warm" else {"PHALANX_TEST_WARM_RANKS": "0"}
    job = Job([sys.executable, str(_LAUNCHER_JOB), "ok", str(tmp_path)], tmp_path, env=env, warm=True)
    assert job.wait(90) == 0 and job.warm, job.output()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [s["env"]["LOCAL_RANK"] for s in seen] == ["0", "1"]
    assert seen[0]["env"]["MASTER_PORT"] == seen[1]["env"]["MASTER_PORT"]
    assert seen[1]["argv"] == seen[0]["argv"]
    expected_parent = warm_parent().pid if ranks == "warm" else seen[0]["pid"]
    assert seen[1]["ppid"] == expected_parent, (seen, warm_parent().pid)
    assert (tmp_path / "rank1.done").exists()  # the launcher waited for the rank's exit, reported back
    assert f"READY 1 {seen[1]['pid']}" in job.stdout  # the rank writes to the launcher's stdout
    assert not job.leftovers()


def test_a_warm_rank_is_the_jobs_until_it_ends_and_dies_with_its_launcher(tmp_path: Path) -> None:
    """A forked rank shows no marker in /proc and is in a session of its own, so the parent lists
    it for the leak checks; when the launcher is SIGKILLed the parent kills the rank, as the
    parent-death signal of a ``Popen``-ed rank would."""
    job = Job([sys.executable, str(_LAUNCHER_JOB), "sleep"], tmp_path, warm=True)
    try:
        deadline = time.monotonic() + 90
        while job.stdout.count("READY") < 2 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = dict(line.split()[1:] for line in job.stdout.splitlines() if line.startswith("READY"))
        assert set(ready) == {"0", "1"}, job.output()
        rank1 = int(ready["1"])
        assert rank1 in job.leftovers(grace=0.0)
        os.kill(job.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while rank1 in job.leftovers(grace=0.0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rank1 not in job.leftovers(grace=0.0), "the rank outlived its SIGKILLed launcher"
    finally:
        job.kill()
    assert not job.leftovers()
