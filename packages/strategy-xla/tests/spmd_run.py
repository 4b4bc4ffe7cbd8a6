"""Run by test_spmd.py in a fresh process with PJRT_DEVICE=CPU and CPU_NUM_DEVICES=2.

SPMD mode is process-wide and permanent, so it cannot share the pytest process with the other
XLA tests. Prints one JSON line of results for the test to check.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from _demo import EPOCHS, DemoModel, cpu_reference_losses, make_loader

from phalanx import Trainer
from phalanx.errors import MisconfigurationError


class InspectingModel(DemoModel):
    """Records how the first batch and the first weight are laid out over the mesh."""

    def inspect_step(self, x: torch.Tensor) -> dict[str, Any]:
        import torch_xla

        weight = self.net[0].weight
        return {
            "input_sharding": torch_xla._XLAC._get_xla_sharding_spec(x),
            "weight_sharding": torch_xla._XLAC._get_xla_sharding_spec(weight),
        }


def _trainer(root: Path, epochs: int = EPOCHS, **kwargs: Any) -> Trainer:
    options: dict[str, Any] = {"accelerator": "xla", "strategy": "xla_fsdp", "devices": 2}
    options.update(kwargs)
    return Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   default_root_dir=str(root), **options)


def _error(**kwargs: Any) -> str:
    try:
        _trainer(Path(tempfile.gettempdir()), **kwargs)
    except MisconfigurationError as err:
        return str(err)
    return "no error"


def main() -> None:
    out: dict[str, Any] = {}
    out["error_xla_multi_cpu"] = _error(strategy="xla", devices=2)
    out["error_fsdp_subset"] = _error(devices=1)
    out["error_too_many"] = _error(devices=3)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = InspectingModel()
        trainer = _trainer(root)
        trainer.fit(model, make_loader())
        out["losses"] = model.losses
        out["seen"] = model.seen
        full = root / "full.ckpt"
        trainer.save_checkpoint(full)
        saved = torch.load(full, map_location="cpu", weights_only=True)["state_dict"]
        out["full_matches"] = all(torch.equal(saved[k], v.cpu()) for k, v in model.state_dict().items())

        sharded_model = DemoModel()
        from phalanx.strategies import XLAFSDPStrategy  # resolved from this installed plugin

        sharded_trainer = _trainer(root, strategy=XLAFSDPStrategy(state_dict_type="sharded"))
        sharded_trainer.fit(sharded_model, make_loader())
        folder = root / "sharded.ckpt"
        sharded_trainer.save_checkpoint(folder)
        out["sharded_files"] = sorted(p.name for p in folder.iterdir())
        loaded = sharded_trainer.strategy.checkpoint_io.load_checkpoint(folder)
        out["sharded_matches"] = all(torch.equal(loaded["state_dict"][k], v.cpu()) for k, v in sharded_model.state_dict().items())

        from phalanx.discovery import convert_checkpoint

        portable = root / "portable.ckpt"
        convert_checkpoint(str(folder), str(portable))  # what `phalanx checkpoint convert` runs
        converted = torch.load(portable, map_location="cpu", weights_only=True)["state_dict"]
        out["converted_matches"] = all(torch.equal(converted[k], v.cpu()) for k, v in sharded_model.state_dict().items())

        resumed = DemoModel()
        _trainer(root, epochs=EPOCHS + 1, strategy=XLAFSDPStrategy(state_dict_type="sharded")).fit(
            resumed, make_loader(), ckpt_path=str(folder)
        )
        out["resumed_losses"] = resumed.losses
    # The CPU reference runs last: a CPU backward before the XLA runtime starts breaks every later
    # XLA backward in this process (pytorch/xla issue 4174).
    out["reference"] = cpu_reference_losses()
    out["reference_3"] = cpu_reference_losses(epochs=EPOCHS + 1)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
