"""The Lightning scripts as test cases: how each is run, and what its results must satisfy.

Shared by ``test_lightning_scripts.py`` (each script renamed to phalanx) and
``test_under_lightning.py`` (each script unmodified, under real Lightning), so the checks that
phalanx must pass are the ones Lightning itself is seen to pass. Every check compares the run's
numbers with a plain-PyTorch replay computed here, in the test process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from phalanx.testing.processes import Job

__all__ = ["CASES", "SCRIPTS", "Case", "check", "load_script", "run_case"]

SCRIPTS = Path(__file__).parent / "scripts"
#: Seconds one script run may take before its processes are killed and the test fails.
RUN_TIMEOUT = 240.0
#: Variables that would make a script think it is already a rank of some job.
_RANK_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID")
#: What libstdc++ prints when gloo's threads are torn down at interpreter exit with the process
#: group never destroyed (``std::terminate`` on a joinable thread), before it raises SIGABRT.
GLOO_EXIT_ABORT = "terminate called without an active exception"


@dataclass(frozen=True)
class Case:
    """One run of one script: its file name under ``scripts/`` and its command-line arguments."""

    script: str
    args: tuple[str, ...]


CASES = {
    "bug_report-ddp-2": Case("bug_report_model.py", ("--strategy", "ddp", "--devices", "2")),
    "autoencoder-ddp-2": Case("autoencoder.py", ("--strategy", "ddp", "--devices", "2")),
    "autoencoder-fsdp-2": Case("autoencoder.py", ("--strategy", "fsdp", "--devices", "2")),
    "tensor_parallel-dp2-tp2": Case("tensor_parallel_llama.py", ("--data-parallel", "2", "--tensor-parallel", "2")),
    "early_stopping_loggers-ddp-2": Case("early_stopping_loggers.py", ("--strategy", "ddp", "--devices", "2")),
}


def run_case(script: Path, case: Case, workdir: Path, *, gloo_exit_abort: bool = False) -> dict[str, Any]:
    """Run ``script`` as a user would (``python script.py ...``) and return the JSON it wrote.

    The script launches its own ranks. It runs in a session of its own, is killed as a whole
    after :data:`RUN_TIMEOUT` or on any interruption, and must leave no process behind.

    It must exit 0, with one exception for runs of Lightning itself (``gloo_exit_abort=True``,
    ``test_under_lightning.py`` only): Lightning 2.6.6 leaves its ranks' gloo process group to
    interpreter exit, where torch 2.13's gloo aborts in about one 2-rank run in eight, after the
    script has finished and written its results. That exit is accepted only as this exact crash,
    SIGABRT with :data:`GLOO_EXIT_ABORT` in the output, and only with the results file written;
    the caller's :func:`check` must then find every result the case expects, so a run whose work did
    not complete still fails. phalanx destroys its process group before exit: its runs
    (``test_lightning_scripts.py``) must exit 0.
    """
    out = workdir / "result.json"
    args = [*case.args, "--accelerator", "cpu", "--root", str(workdir), "--out", str(out)]
    if case.script == "tensor_parallel_llama.py":
        args += ["--init-out", str(workdir / "init.pt")]
    saved = {key: os.environ.pop(key) for key in _RANK_VARS if key in os.environ}
    try:
        job = Job([sys.executable, str(script), *args], workdir, env={"OMP_NUM_THREADS": "1"}, name="script", warm=True)
    finally:
        os.environ.update(saved)
    try:
        code = job.wait(RUN_TIMEOUT)
        # Lightning's launcher does not wait for the ranks it re-ran (its observer thread is a daemon
        # that ends with the first process), so under Lightning a rank may still be tearing down
        # when the script's first process exits: seen once on a loaded machine, rank 1 of the 4-rank
        # tensor_parallel case still alive after the 2 s phalanx's runs get. Their exit is waited
        # for, up to 30 s; phalanx's launcher waits for its ranks, so its runs keep the 2 s.
        left = job.leftovers(grace=30.0 if gloo_exit_abort else 2.0)
    finally:
        job.kill_leftovers()
    known_abort = gloo_exit_abort and code == -signal.SIGABRT and GLOO_EXIT_ABORT in job.stderr
    assert code == 0 or known_abort, f"{script.name} {' '.join(case.args)} exited with {code}\n{job.output()[-8000:]}"
    assert not left, f"{script.name} left processes behind: {left}\n{job.output()[-4000:]}"
    assert out.exists(), f"{script.name} exited with {code} and wrote no {out.name}\n{job.output()[-4000:]}"
    if known_abort:  # the upstream crash at exit: the results, checked by the caller, decide
        print(f"{script.name} {' '.join(case.args)}: SIGABRT at exit ({GLOO_EXIT_ABORT!r}) after writing {out.name}")
    return json.loads(out.read_text(encoding="utf-8"))


def load_script(script: Path) -> ModuleType:
    """Import a script file as a module (its ``__main__`` block does not run), for its model and data."""
    spec = importlib.util.spec_from_file_location(f"_lightning_case_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(case: Case, script: Path, result: dict[str, Any], workdir: Path) -> None:
    """Assert ``result`` (from :func:`run_case`) is what the script's plain-PyTorch replay gives."""
    checks = {
        "bug_report_model.py": _check_bug_report,
        "autoencoder.py": _check_autoencoder,
        "tensor_parallel_llama.py": _check_tensor_parallel,
        "early_stopping_loggers.py": _check_early_stopping_loggers,
    }
    checks[case.script](load_script(script), result, workdir)


def _row_indices(rows: torch.Tensor, data: torch.Tensor) -> list[int]:
    """Index in ``data`` of each row of ``rows`` (each must be one of them, exactly)."""
    found = []
    for row in rows:
        matches = (data == row).all(dim=1).nonzero().flatten().tolist()
        assert matches, "a rank trained on a row that is not in the data set"
        found.append(matches[0])
    return found


def _check_bug_report(script: ModuleType, result: dict[str, Any], workdir: Path) -> None:
    world = result["world_size"]
    assert (world, result["global_step"]) == (2, 1), result
    train = torch.tensor(result["train_batches"])  # (world, batch, SIZE)
    test = torch.tensor(result["test_batches"])
    gathered = f"Module.all_gather in on_test_end gave {tuple(train.shape)}, not (world, batch, features)"
    assert train.shape[0] == test.shape[0] == world, gathered
    # the ranks read different samples of the same data set
    seen = [_row_indices(batch, script.RandomDataset(script.SIZE, 64, seed=1).data) for batch in train]
    assert len({i for rows in seen for i in rows}) == world * train.shape[1], seen
    tested = [_row_indices(batch, script.RandomDataset(script.SIZE, 64, seed=3).data) for batch in test]
    assert len({i for rows in tested for i in rows}) == world * test.shape[1], tested

    torch.manual_seed(0)
    layer = nn.Linear(script.SIZE, script.OUTPUTS)
    start_loss = float(layer(train[0]).sum().detach())
    grads = [torch.autograd.grad(layer(batch).sum(), list(layer.parameters())) for batch in train]
    with torch.no_grad():
        for param, *rank_grads in zip(layer.parameters(), *grads):
            param -= script.LR * sum(rank_grads) / world  # DDP averages the ranks' gradients
    expected = {name: value.tolist() for name, value in layer.state_dict().items()}
    for name, value in expected.items():
        assert torch.allclose(torch.tensor(result["weights"][name]), torch.tensor(value), atol=1e-6), (name, value)
    assert math.isclose(result["train_loss"], start_loss, abs_tol=1e-5), start_loss  # rank 0's own loss, pre-step
    with torch.no_grad():
        test_loss = sum(float(layer(batch).sum()) for batch in test) / world
    assert math.isclose(result["test_loss"], test_loss, abs_tol=1e-5), test_loss  # sync_dist: the ranks' mean
    assert math.isfinite(result["valid_loss"]), result


def _check_autoencoder(script: ModuleType, result: dict[str, Any], workdir: Path) -> None:
    world = result["world_size"]
    epochs = len(result["val_history"])
    assert (world, epochs) == (2, 4), result
    assert result["global_step"] == epochs * script.SAMPLES["fit"] // (16 * world), result
    history = result["val_history"]
    assert history[0] > history[1] > history[2], history  # it learns...
    assert history[3] > history[2], history  # ...until the spoilt last epoch
    # ModelCheckpoint(monitor="val_loss") kept the lowest score, which is not the last one
    assert math.isclose(result["best_score"], min(history), rel_tol=1e-6), result
    # load_from_checkpoint: the same hyperparameters, and the weights that scored best
    assert result["hparams"] == {"code_size": 3, "hidden": 32, "lr": 0.01, "spoil_epoch": epochs - 1}, result
    assert math.isclose(result["loaded_val_loss"], result["best_score"], rel_tol=1e-5), result
    # test(ckpt_path="best") ran with those weights, and they differ from the last ones
    assert math.isclose(result["test_loss"], result["loaded_test_loss"], rel_tol=1e-5), result
    assert result["last_test_loss"] > 2 * result["test_loss"], result
    # predict shards the samples over the ranks without repeating any
    assert result["predicted_rows"] == script.SAMPLES["predict"] // world, result
    assert result["predicted_width"] == 3, result
    assert math.isfinite(result["checksum"]), result
    assert Path(result["best_path"]).exists(), f"best_model_path does not exist: {result['best_path']!r}"


def _looks_reset(name: str, value: torch.Tensor) -> bool:
    """Whether ``value`` is what the layer's ``reset_parameters`` draws (not memory left uninitialised).

    Embedding: N(0, 1). Linear (no bias): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), whose std is
    bound/sqrt(3). RMSNorm: ones.
    """
    if not torch.isfinite(value).all():
        return False
    if value.dim() == 1:
        return bool((value == 1).all())
    if name.startswith("tok_embeddings"):
        return 0.7 < float(value.std()) < 1.3
    bound = value.shape[1] ** -0.5
    return float(value.abs().max()) <= bound * 1.0001 and float(value.std()) > bound / 3


def _check_tensor_parallel(script: ModuleType, result: dict[str, Any], workdir: Path) -> None:
    world, steps = result["world_size"], result["global_step"]
    assert (world, steps) == (4, 4), result
    initial = torch.load(workdir / "init.pt")
    not_reset = [name for name, value in initial.items() if not _looks_reset(name, value)]
    assert not not_reset, f"weights built under init_module(empty_init=True) not set by reset_parameters: {not_reset}"
    assert all(math.isfinite(loss) for loss in result["losses"]), result["losses"]
    samples = torch.tensor(result["rank_samples"])  # (world, steps, batch)
    rank_losses = torch.tensor(result["rank_losses"])  # (world, steps)
    data = script.TokenDataset(script.SAMPLES, script.SEQ, seed=7).tokens

    model = script.Transformer()
    model.load_state_dict(initial, strict=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=script.LR, foreach=False)
    expected_steps = []
    for step in range(steps):
        # the two ranks of a tensor-parallel group read the same batch; the two groups, different ones
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(world):
            groups.setdefault(tuple(samples[rank, step].tolist()), []).append(rank)
        assert sorted(len(ranks) for ranks in groups.values()) == [2, 2], groups
        assert len({i for key in groups for i in key}) == 2 * samples.shape[2], groups
        group_losses = []
        for key, ranks in groups.items():
            rows = data[list(key)]
            loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
            for rank in ranks:
                assert math.isclose(float(rank_losses[rank, step]), float(loss.detach()), abs_tol=2e-4), (step, rank)
            group_losses.append(loss)
        total = torch.stack(group_losses).mean()  # FSDP averages the gradients over data-parallel ranks
        expected_steps.append(float(total.detach()))
        total.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert torch.allclose(torch.tensor(result["losses"]), torch.tensor(expected_steps), atol=2e-4), (
        result["losses"],
        expected_steps,
    )
    assert result["losses"][-1] < result["losses"][0] - 0.3, result["losses"]
    checksum = float(sum(value.double().sum() for value in model.state_dict().values()))
    assert math.isclose(result["checksum"], checksum, rel_tol=1e-4, abs_tol=1e-3), (result["checksum"], checksum)


def _check_early_stopping_loggers(script: ModuleType, result: dict[str, Any], workdir: Path) -> None:
    """The stop, the learning rates and the scores, as TensorBoard's reader and the csv module read them."""
    import csv

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # epochs 0-2 improve; SPOIL_EPOCH and the next are worse: patience 2 runs out after epoch 4
    stop = script.SPOIL_EPOCH + script.PATIENCE - 1
    assert (result["world_size"], result["stopped_epoch"], result["should_stop"]) == (2, stop, True), result
    assert result["current_epoch"] == stop + 1, result
    steps_per_epoch = script.SAMPLES // (8 * result["world_size"])
    assert result["global_step"] == (stop + 1) * steps_per_epoch, result

    events = EventAccumulator(result["tensorboard_dir"])
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    val = [value for _, value in scalars["val_loss"]]
    assert len(val) == stop + 1, scalars["val_loss"]
    assert max(val[: script.SPOIL_EPOCH]) < script.PENALTY < val[script.SPOIL_EPOCH] < val[stop], val
    # LearningRateMonitor(logging_interval="epoch"): StepLR scales the rate by 0.8 every epoch
    lrs = [value for _, value in scalars["lr-SGD"]]
    expected_lrs = [script.LR * 0.8**epoch for epoch in range(stop + 1)]
    assert len(lrs) == len(expected_lrs) and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(lrs, expected_lrs)), (
        lrs
    )
    # ModelCheckpoint(save_top_k=2) kept the two best epochs
    ranked = sorted(range(len(val)), key=lambda epoch: val[epoch])[:2]
    assert math.isclose(result["best_score"], min(val), rel_tol=1e-6), (result, val)
    assert sorted(name.split("-")[0] for name in result["best_k"]) == sorted(f"epoch={e}" for e in ranked), result

    with open(Path(result["csv_dir"]) / "metrics.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    csv_val = [float(row["val_loss"]) for row in rows if row.get("val_loss")]
    assert len(csv_val) == len(val) and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(csv_val, val)), (
        csv_val,
        val,
    )
    csv_lrs = [float(row["lr-SGD"]) for row in rows if row.get("lr-SGD")]
    assert len(csv_lrs) == len(lrs) and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(csv_lrs, lrs)), csv_lrs
    train_steps = [int(row["step"]) for row in rows if row.get("train_loss_step")]
    assert train_steps == list(range(1, result["global_step"], 2)), train_steps  # log_every_n_steps=2
    hparams = (Path(result["csv_dir"]) / "hparams.yaml").read_text(encoding="utf-8")
    assert f"lr: {script.LR}" in hparams, hparams
