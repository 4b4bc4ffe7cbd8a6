"""fit, then save_checkpoint, validate, test and predict with the same Trainer (one strategy).

Usage: ``python after_fit.py STRATEGY[,STRATEGY...] OUT``; several strategies run one after the
other in the same processes (the imports are paid once). Each process writes
``OUT/<strategy>/rank<R>.json`` with its weights after fit, the evaluation results and predictions, and the
validation loss of a fresh Module loaded from the checkpoint saved after fit.
"""

from __future__ import annotations

import os
import sys

import torch
from rel_common import Net, eval_loader, to_lists, train_loader, trainer_kwargs, write_json

from phalanx import Trainer


def run(strategy: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    model = Net()
    trainer = Trainer(**trainer_kwargs(strategy, out))
    trainer.fit(model, train_loader())
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    path = os.path.join(out, "final.ckpt")
    trainer.save_checkpoint(path)
    val = trainer.validate(model, eval_loader(1), verbose=False)
    test = trainer.test(model, eval_loader(2), verbose=False)
    predictions = trainer.predict(model, eval_loader(3))
    rows = torch.cat(list(predictions)).tolist() if predictions else []
    fresh = Net()
    again = Trainer(**trainer_kwargs(strategy, out))
    reloaded = again.validate(fresh, eval_loader(1), ckpt_path=path, verbose=False)
    write_json(
        os.path.join(out, f"rank{trainer.global_rank}.json"),
        {
            "weights": to_lists(weights),
            "val_loss": float(val[0]["val_loss"]),
            "test_loss": float(test[0]["test_loss"]),
            "predictions": rows,
            "reloaded_val_loss": float(reloaded[0]["val_loss"]),
            "saved": os.path.exists(path),
        },
    )


def main() -> None:
    for strategy in sys.argv[1].split(","):
        run(strategy, os.path.join(sys.argv[2], strategy))


if __name__ == "__main__":
    main()
