"""Write an ordinary full checkpoint with ddp (2 ranks) for the fsdp tests' model.

Usage: python ddp_full_checkpoint.py FSDP_SCRIPTS_DIR OUT_FILE
One epoch (the script is re-executed per rank) with the fsdp runs' Trainer settings (accumulate 2, clip norm 0.5); then
``trainer.save_checkpoint`` (rank 0 writes the file).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    from common import Net

    import phalanx

    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Net())
    trainer.save_checkpoint(sys.argv[2])
