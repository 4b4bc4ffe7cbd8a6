"""Per-step cost of the usual callbacks and loggers, phalanx against Lightning, one process.

    python benchmarks/bench_callbacks_overhead.py            # 5 interleaved repetitions
    python benchmarks/bench_callbacks_overhead.py --quick    # smoke run: a few steps, nothing enforced

The tiny model of ``bench_trainer_overhead.py`` (Linear 32->32->4, batch 8: the step is almost all
Python) logs its loss every step and is trained with the set a Lightning user typically attaches:
EarlyStopping and ModelCheckpoint on that loss, LearningRateMonitor, the progress bar switched
off, TensorBoardLogger and CSVLogger (``log_every_n_steps=50``). Each Trainer is measured with
and without the set, beside the plain loop, with the same stamps as ``bench_trainer_overhead.py``
(per step, between the first stamp after warm-up and the last: the end-of-epoch checkpoint is
outside). Reported: each loop's overhead over the plain loop in microseconds of CPU time, paired
within each repetition, and what the set adds to each Trainer. Lightning rows need
``pytorch_lightning`` (``nox -s bench`` installs it); the set needs ``tensorboard``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

from _bench import Row, finish, pin_threads, spread

pin_threads()

import torch  # noqa: E402
from bench_trainer_overhead import MODELS, Stamps, _loader, _net, _stamp, lightning_available, per_step, plain  # noqa: E402
from torch import nn  # noqa: E402

import phalanx  # noqa: E402
from phalanx.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint  # noqa: E402
from phalanx.loggers import CSVLogger, TensorBoardLogger  # noqa: E402

WIDTHS, BATCH = MODELS["tiny"]


def _trainer_kwargs(root: str, with_set: bool, lib: Any) -> dict[str, Any]:
    """The same Trainer arguments for both libraries; ``lib`` provides the callback and logger classes."""
    if not with_set:
        return {"logger": False, "enable_checkpointing": False}
    callbacks = [
        lib.EarlyStopping(monitor="train_loss", patience=1000, check_on_train_epoch_end=True),
        lib.LearningRateMonitor(logging_interval="step"),
        lib.ModelCheckpoint(dirpath=root, monitor="train_loss", save_top_k=1),
    ]
    loggers = [lib.TensorBoardLogger(root, name="tb"), lib.CSVLogger(root, name="csv")]
    return {"callbacks": callbacks, "logger": loggers, "log_every_n_steps": 50}


class _Classes:
    """The set's classes from phalanx (Lightning's are gathered the same way in run_lightning)."""

    EarlyStopping = EarlyStopping
    LearningRateMonitor = LearningRateMonitor
    ModelCheckpoint = ModelCheckpoint
    TensorBoardLogger = TensorBoardLogger
    CSVLogger = CSVLogger


class _PhalanxNet(phalanx.Module):
    def __init__(self, stamps: Stamps) -> None:
        super().__init__()
        self.net = _net(WIDTHS)
        self.stamps = stamps

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _stamp(self.stamps)
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _phalanx(with_set: bool) -> Callable[[tuple[int, ...], Any, Stamps], None]:
    def run(widths: tuple[int, ...], data: Any, stamps: Stamps) -> None:
        with tempfile.TemporaryDirectory() as root:
            trainer = phalanx.Trainer(
                accelerator="cpu",
                devices=1,
                max_epochs=1,
                default_root_dir=root,
                enable_progress_bar=False,
                enable_model_summary=False,
                **_trainer_kwargs(root, with_set, _Classes),
            )
            trainer.fit(_PhalanxNet(stamps), data)

    return run


def _lightning(with_set: bool) -> Callable[[tuple[int, ...], Any, Stamps], None]:
    def run(widths: tuple[int, ...], data: Any, stamps: Stamps) -> None:
        import pytorch_lightning as pl
        from pytorch_lightning import callbacks, loggers

        class LitNet(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = _net(WIDTHS)

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                _stamp(stamps)
                x, y = batch
                loss = nn.functional.mse_loss(self.net(x), y)
                self.log("train_loss", loss)
                return loss

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        classes = type("Classes", (), {**vars(callbacks), **vars(loggers)})
        with tempfile.TemporaryDirectory() as root:
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=1,
                max_epochs=1,
                default_root_dir=root,
                enable_progress_bar=False,
                enable_model_summary=False,
                **_trainer_kwargs(root, with_set, classes),
            )
            trainer.fit(LitNet(), data)

    return run


def main() -> int:
    """Run, print the table and the target rows; 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per run")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (at least 5 for the record)")
    parser.add_argument("--quick", action="store_true", help="a few steps, 1 repetition: proves the script runs")
    parser.add_argument("--no-lightning", action="store_true", help="skip the Lightning comparison")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeat = 60, 1
    warnings.filterwarnings("ignore")
    loops: dict[str, Callable[..., None]] = {"plain": plain, "phalanx": _phalanx(False), "phalanx+set": _phalanx(True)}
    if not args.no_lightning and lightning_available():
        loops.update({"lightning": _lightning(False), "lightning+set": _lightning(True)})
    for loop in loops.values():  # warm-up: lazy imports (tensorboard), allocator
        loop(WIDTHS, _loader(WIDTHS, BATCH, 20), [])
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in loops}
    names = list(loops)
    for rep in range(args.repeat):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            stamps: Stamps = []
            data = _loader(WIDTHS, BATCH, args.steps + 1)
            gc.collect()
            loops[name](WIDTHS, data, stamps)
            results[name].append(per_step(stamps, warmup=max(args.steps // 20, 2)))
    return report(args, results)


def report(args: argparse.Namespace, results: dict[str, list[tuple[float, float]]]) -> int:
    """Print overheads over the plain loop (CPU time, paired per repetition) and the target rows."""
    print(f"one process, 1 thread, tiny model, {args.steps} steps; {args.repeat} interleaved repetitions (median [min..max])")
    overhead = {
        name: spread([(run[1] - base[1]) * 1e6 for run, base in zip(runs, results["plain"])])
        for name, runs in results.items()
        if name != "plain"
    }
    for name, value in overhead.items():
        print(f"  {name:<15} +{value!s} us/step CPU over the plain loop")
    data: dict[str, Any] = {"overhead_us": {name: vars(value) for name, value in overhead.items()}, "repeat": args.repeat}
    added = overhead["phalanx+set"].median - overhead["phalanx"].median
    rows: list[Row] = []
    print(f"  the set adds {added:.1f} us/step to phalanx")
    if "lightning+set" in overhead:
        lit_added = overhead["lightning+set"].median - overhead["lightning"].median
        print(f"  the set adds {lit_added:.1f} us/step to Lightning")
        rows.append(
            Row("per-step cost of the set, phalanx / Lightning (CPU time)", added / lit_added, 0.5, "x",
                note=f"phalanx +{added:.0f} us, Lightning +{lit_added:.0f} us")
        )  # fmt: skip
        share = overhead["phalanx+set"].median / overhead["lightning+set"].median
        rows.append(
            Row("overhead with the set, phalanx / Lightning (CPU time)", share, 0.2, "x",
                note=f"Lightning +{overhead['lightning+set'].median:.0f} us/step")
        )  # fmt: skip
        data["lightning_set_added_us"] = lit_added
    data["phalanx_set_added_us"] = added
    return finish("callbacks_overhead", rows, data, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
