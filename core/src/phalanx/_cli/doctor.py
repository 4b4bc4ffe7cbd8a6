"""``phalanx doctor``: prove this machine can train, the way ``accelerate test`` does for Accelerate.

Two kinds of checks, each in fresh processes with a timeout, killed and reported if it hangs:

1. a real 2-process gloo all-reduce (the transport every CPU strategy uses);
2. a tiny fit under each installed strategy (one per base name; ``--all`` adds the variants),
   2 processes for parallel strategies. A strategy that cannot be used here (a library missing,
   a name conflict) is skipped with the registry's reason. The one Module serves every
   strategy: where the strategy's mesh has a ``tensor_parallel`` dimension (``model_parallel``)
   its ``configure_model`` splits the layers over it, and the check fails unless weights really
   ended up sharded (see ``doctor_fit.py``); the core thus needs no model from any plugin. A
   strategy that must prepare a model its own way (a vendor's) defines
   ``doctor_configure_model(model) -> str`` and the doctor hands it the model instead.

Every check's processes carry a marker in their environment; anything still alive afterwards is
killed and fails the check, so the doctor never leaves a process behind.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx._cli.listing import fold_variants, terminal_width
from phalanx.testing.processes import Job, kill_marked

__all__ = ["CheckResult", "doctor_names", "run_doctor"]

_HERE = Path(__file__).parent


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: ``status`` is ``pass``, ``fail`` or ``skipped``."""

    name: str
    status: str
    seconds: float
    detail: str


def doctor_names(*, include_variants: bool) -> list[str]:
    """The strategy names the doctor checks by default: each base name, or every name."""
    from phalanx.registry import StrategyRegistry

    groups = fold_variants(StrategyRegistry.entries())
    if include_variants:
        return [entry.name for group in groups for entry in (group.base, *group.variants)]
    return [group.base.name for group in groups]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(text: str, lines: int = 4) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def _finish(jobs: Sequence[Job], timeout: float) -> str | None:
    """Wait for ``jobs``; return what went wrong (timeout, exit code, leftovers) or ``None``."""
    deadline = time.monotonic() + timeout
    problem = None
    for job in jobs:
        try:
            code = job.wait(max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            problem = problem or f"did not finish within {timeout:g}s (killed)\n{_tail(job.stderr)}"
            continue
        if code != 0 and problem is None:
            problem = f"exit code {code}\n{_tail(job.stderr) or _tail(job.stdout)}"
    for job in jobs:
        left = job.leftovers(grace=3.0)
        if left:
            kill_marked(job.marker)
            problem = problem or f"left processes behind (pids {left}); killed them"
    return problem


def check_allreduce(workdir: Path, timeout: float) -> CheckResult:
    """Two processes join a gloo group on localhost and all-reduce ``[1] + [2]``."""
    start = time.monotonic()
    script = workdir / "phalanx_doctor_allreduce.py"
    shutil.copy(_HERE / "doctor_allreduce.py", script)
    port = str(_free_port())
    jobs = [
        Job(
            [str(script)],
            workdir,
            env={"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
            name=f"allreduce{rank}",
        )
        for rank in range(2)
    ]
    problem = _finish(jobs, timeout)
    seconds = time.monotonic() - start
    if problem:
        return CheckResult("gloo all-reduce", "fail", seconds, problem)
    return CheckResult("gloo all-reduce", "pass", seconds, "2 processes, sum 3 as expected")


def check_fit(name: str, accelerator: str, workdir: Path, timeout: float) -> CheckResult:
    """Train the tiny regression under strategy ``name``; pass when the loss falls."""
    from phalanx.registry import StrategyRegistry

    reason = StrategyRegistry.entry(name).unavailable_reason()
    if reason is not None:
        return CheckResult(name, "skipped", 0.0, reason)
    start = time.monotonic()
    run_dir = workdir / name
    run_dir.mkdir()
    script = run_dir / "phalanx_doctor_fit.py"
    shutil.copy(_HERE / "doctor_fit.py", script)
    result_file = run_dir / "result.json"
    job = Job([str(script), name, accelerator, str(result_file)], run_dir, name="fit")
    problem = _finish([job], timeout)
    seconds = time.monotonic() - start
    if problem:
        return CheckResult(name, "fail", seconds, problem)
    if not result_file.exists():
        return CheckResult(name, "fail", seconds, f"training ended without rank 0's result\n{_tail(job.stderr)}")
    result = json.loads(result_file.read_text())
    first, last, world = result["first"], result["last"], result["world_size"]
    processes = f"{world} process{'es' if world > 1 else ''}"
    parallelism, split = result.get("parallelism", ""), result.get("split", [])
    if result.get("by_strategy"):  # the strategy's doctor_configure_model prepared the model: its own words
        processes += f", {parallelism}"
    elif parallelism and not split:
        detail = (
            f"{processes}: configure_model applied {parallelism} but no parameter ended up sharded over tensor_parallel"
        )
        return CheckResult(name, "fail", seconds, detail)
    elif parallelism:
        processes += f", {parallelism} ({len(split)} parameters split)"
    if not last < first:
        return CheckResult(name, "fail", seconds, f"{processes}: loss did not fall ({first:.4f} -> {last:.4f})")
    return CheckResult(name, "pass", seconds, f"{processes}, loss {first:.3f} -> {last:.3f}")


def _print_result(result: CheckResult, width: int) -> None:
    first, _, rest = result.detail.partition("\n")
    head = f"  {result.name:<24} {result.status:<7} {result.seconds:5.1f}s  "
    wrapped = textwrap.wrap(first, max(20, width - len(head)), break_on_hyphens=False) or [""]
    print(head + wrapped[0], flush=True)
    for extra in wrapped[1:]:
        print(" " * len(head) + extra, flush=True)
    for extra in rest.splitlines():
        print(
            textwrap.shorten(f"      {extra.strip()}", width, placeholder="...")
            if len(extra) + 6 > width
            else f"      {extra.strip()}",
            flush=True,
        )


def run_doctor(names: Sequence[str], *, accelerator: str, timeout: float) -> int:
    """Run the all-reduce and one fit per name in ``names``; 1 if anything failed, else 0."""
    width = terminal_width()
    print(f"phalanx doctor: accelerator={accelerator}, timeout {timeout:g}s per check", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="phalanx-doctor-") as tmp:
        workdir = Path(tmp)
        for check in [lambda: check_allreduce(workdir, timeout)] + [
            (lambda n=name: check_fit(n, accelerator, workdir, timeout)) for name in names
        ]:
            result = check()
            _print_result(result, width)
            results.append(result)
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "skipped")}
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped")
    return 1 if counts["fail"] else 0
