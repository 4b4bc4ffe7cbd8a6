"""The script the callback and logger kits run: three 2-rank fits that record what each rank did.

One fresh Python process (never the pytest process: strategies start their ranks from the
script) runs, in order, with a fresh plugin instance each time:

- ``full``: an uninterrupted fit of ``STEPS`` steps (sanity check and one validation included),
  in which a ModelCheckpoint in the training processes saves every ``RESUME_AT`` steps;
- ``resumed``: a new Trainer resuming from the checkpoint of step ``RESUME_AT`` (mid-epoch) to
  ``STEPS``; left out when no selected check reads it.

Each rank writes ``kit/<phase>-rank<r>.pt``: how often each hook the plugin overrides was called,
the plugin's ``state_dict()`` right after the restore (``on_fit_start``) and at the end, rank 0's
per-step losses, and for loggers every ``log_metrics`` / ``finalize`` call. An audit hook
(``sys.addaudithook``) appends every file opened for writing, created or renamed under the run's
folder to ``kit/writes-<pid>.txt`` with the writing process's rank; the kit's own records are not
counted.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

__all__ = ["MIDDLE", "PHASES", "render_rank_script"]

PHASES = ("full", "resumed")
#: The checkpoint the resumed fit starts from, relative to the run folder.
MIDDLE = "checkpoints/middle-step={resume_at}.ckpt"

_TEMPLATE = """
import functools, os, sys
sys.path[:0] = {paths!r}
OUT, KIND, SPEC, PARAMS, STRATEGY, START, STEPS, RESUME_AT, RESUME = {out!r}, {kind!r}, {spec!r}, {params!r}, {strategy!r}, {start!r}, {steps}, {resume_at}, {resume!r}
RECORDS = os.path.join(OUT, "kit")
os.makedirs(RECORDS, exist_ok=True)
_writing = [False]


def _audit(event, args):
    if _writing[0] or event not in ("open", "os.mkdir", "os.rename", "os.replace"):
        return
    path = args[0]
    if event == "open":
        if not isinstance(path, (str, bytes, os.PathLike)) or not (args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND)):
            return
    path = os.path.abspath(os.fsdecode(path))
    if not path.startswith(OUT + os.sep) or path.startswith(RECORDS):
        return
    from phalanx.utilities import rank_zero_only
    _writing[0] = True
    try:
        fd = os.open(os.path.join(RECORDS, f"writes-{{os.getpid()}}.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, f"{{rank_zero_only.rank}}\\t{{event}}\\t{{path}}\\n".encode())
        os.close(fd)
    finally:
        _writing[0] = False


sys.addaudithook(_audit)

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from phalanx import Module, Trainer
from phalanx.callbacks import Callback, ModelCheckpoint
from phalanx.hooks import CALLBACK_HOOKS
from phalanx.registry import CallbackRegistry, LoggerRegistry
from phalanx.strategies import ParallelStrategy
from phalanx.testing.kits._common import build, import_spec
from phalanx.utilities.model_helpers import is_overridden


class KitDDP(ParallelStrategy):
    # DistributedDataParallel imports torch._dynamo on first use: once here, not in every forked rank of every fit.
    launcher_preload = ("torch._dynamo",)

    def wrap_model(self, model, *, training):
        return DistributedDataParallel(model) if training else super().wrap_model(model, training=training)


def data(seed, n):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g))


class Net(Module):
    def __init__(self, losses):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 2)
        self.losses = losses

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.losses.append((self.global_step, loss.item()))
        self.log("train_loss", loss)
        return loss

    def on_train_start(self):
        # What user code does on every rank: read where the logs go, reach the experiment object
        # (to log an image, say). A logger must make both harmless off rank 0.
        for logger in self.loggers:
            logger.log_dir
            getattr(logger, "experiment", None)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(data(1, 32), batch_size=4)

    def val_dataloader(self):
        return DataLoader(data(2, 16), batch_size=4)


class Recorder(Callback):
    def __init__(self, phase, plugin, counts, calls, losses):
        self.phase, self.plugin, self.counts, self.calls, self.losses = phase, plugin, counts, calls, losses
        self.restored, self.final, self.rank, self.world_size = None, None, None, None

    def on_fit_start(self, trainer, pl_module):
        self.restored = self.plugin.state_dict() if KIND == "callback" else None

    def teardown(self, trainer, pl_module, stage):
        self.final = self.plugin.state_dict() if KIND == "callback" else None
        self.rank, self.world_size = trainer.global_rank, trainer.world_size
        self.dump()

    def dump(self):
        # Written again after a logger's finalize, which the Trainer calls after teardown.
        record = {{"hooks": dict(self.counts), "restored": self.restored, "final": self.final, "calls": list(self.calls),
                  "losses": list(self.losses), "world_size": self.world_size}}
        _writing[0] = True
        try:
            # A temporary name, then a rename: a rank stopped mid-write (another rank failed) leaves no half record.
            path = os.path.join(RECORDS, f"{{self.phase}}-rank{{self.rank}}.pt")
            torch.save(record, f"{{path}}.{{os.getpid()}}.tmp")
            os.replace(f"{{path}}.{{os.getpid()}}.tmp", path)
        finally:
            _writing[0] = False


def counting(name, method, counts):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return method(*args, **kwargs)
    return wrapper


def recording(name, method, calls, holder):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        if name == "log_metrics":
            metrics = args[0] if args else kwargs["metrics"]
            step = args[1] if len(args) > 1 else kwargs.get("step")
            calls.append((name, {{k: float(v) for k, v in metrics.items()}}, step))
        else:
            calls.append((name, args[:1], None))
        result = method(*args, **kwargs)
        recorder = holder.get("recorder")
        if name == "finalize" and recorder is not None and recorder.rank is not None:
            recorder.dump()
        return result
    return wrapper


def make_plugin(phase):
    value = SPEC if ":" not in SPEC else import_spec(SPEC)
    if KIND == "callback":
        return build(value, CallbackRegistry, PARAMS, what="callback")
    return build(value, LoggerRegistry, {{"save_dir": os.path.join(OUT, phase, "logs"), **PARAMS}}, what="logger")


def run(phase, max_steps, ckpt_path=None):
    plugin, counts, calls, losses, holder = make_plugin(phase), {{}}, [], [], {{}}
    if KIND == "callback":
        for name in CALLBACK_HOOKS:
            if is_overridden(name, plugin, Callback):
                setattr(plugin, name, counting(name, getattr(plugin, name), counts))
    else:
        for name in ("log_metrics", "log_hyperparams", "finalize", "save", "after_save_checkpoint"):
            if hasattr(plugin, name):
                setattr(plugin, name, recording(name, getattr(plugin, name), calls, holder))
    callbacks = [plugin] if KIND == "callback" else []
    if phase == "full":
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(OUT, "checkpoints"), filename="middle-{{step}}", every_n_train_steps=RESUME_AT, save_top_k=-1))
    holder["recorder"] = Recorder(phase, plugin, counts, calls, losses)
    callbacks.append(holder["recorder"])
    trainer = Trainer(
        strategy=STRATEGY if STRATEGY else KitDDP(start_method=START), accelerator="cpu", devices=2, max_steps=max_steps,
        logger=plugin if KIND == "logger" else False, callbacks=callbacks, enable_checkpointing=phase == "full",
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, limit_val_batches=2,
        default_root_dir=os.path.join(OUT, phase),
    )
    trainer.fit(Net(losses), ckpt_path=ckpt_path)


if __name__ == "__main__":
    run("full", STEPS)
    if RESUME:
        run("resumed", STEPS, ckpt_path=os.path.join(OUT, {middle!r}))
"""


def render_rank_script(
    path: Path,
    *,
    out: Path,
    kind: str,
    spec: str,
    params: dict[str, Any],
    strategy: str | None,
    start_method: str,
    steps: int,
    resume_at: int,
    resume: bool,
    paths: list[str],
) -> Path:
    """Write the script to ``path``; ``kind`` is ``"callback"`` or ``"logger"``, ``spec`` a name or ``"module:qualname"``."""
    text = _TEMPLATE.format(
        paths=paths,
        out=str(out),
        kind=kind,
        spec=spec,
        params=dict(params),
        strategy=strategy,
        start=start_method,
        steps=steps,
        resume_at=resume_at,
        resume=resume,
        middle=MIDDLE.format(resume_at=resume_at),
    )
    path.write_text(textwrap.dedent(text))
    return path
