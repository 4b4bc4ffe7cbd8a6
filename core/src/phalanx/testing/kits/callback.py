"""The callback conformance kit: hooks on every rank, nothing written off rank 0, state through resume.

```python
from phalanx.testing import CallbackConformance

class TestMyCallback(CallbackConformance):
    callback = "my_callback"   # the registered name, or the class / a factory
    callback_params = {"patience": 2}
```

The callback runs in a real 2-rank job (gloo, started from a generated script in a fresh process;
see :mod:`phalanx.testing.kits._rank_script`): an uninterrupted fit that checkpoints mid-epoch,
then a new Trainer with a fresh instance resuming from that checkpoint.

- **registered**: a registered name is available, described and builds a ``Callback``.
- **hooks on every rank**: the job finishes, and every hook the callback overrides ran on every
  rank, as often on each. A callback that decides something on rank 0 alone (stopping, skipping a
  collective) makes the ranks diverge: the counts differ or the job fails.
- **nothing written off rank 0**: no rank other than 0 opened a file for writing, created a
  folder or renamed a file under the run's folder (unless ``writes_on_every_rank``).
- **state through resume**: on every rank, ``state_dict()`` right after the restore equals the
  state the checkpoint holds, and after the resumed fit it equals the uninterrupted fit's final
  state. A callback whose ``load_state_dict`` drops something fails here.
"""

from __future__ import annotations

from typing import Any, ClassVar

from phalanx.testing.kits._common import build
from phalanx.testing.kits._rank_script import MIDDLE
from phalanx.testing.kits._runs import RankRunKit, Runs

__all__ = ["CallbackConformance"]


def _same(got: Any, expected: Any, where: str) -> None:
    import torch

    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got.cpu(), expected.cpu()), (
            f"{where}: {got!r} != {expected!r}"
        )
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(map(str, got)) == sorted(map(str, expected)), (
            f"{where}: keys {list(got)} != {list(expected)}"
        )
        for key in expected:
            _same(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), f"{where}: {got!r} != {expected!r}"
        for index, (a, b) in enumerate(zip(got, expected)):
            _same(a, b, f"{where}[{index}]")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


class CallbackConformance(RankRunKit):
    """Subclass with ``callback`` set (registered name, class or factory); pytest runs the checks."""

    _kind: ClassVar[str] = "callback"
    callback: ClassVar[Any] = ""
    #: Keyword arguments for the factory (or overrides of the registered init params).
    callback_params: ClassVar[dict[str, Any]] = {}
    check_resume: ClassVar[bool] = True

    _RESUME_CHECKS: ClassVar[frozenset[str]] = frozenset({"test_state_survives_resume"})
    _OPT_OUTS: ClassVar[dict[str, str]] = {"test_state_survives_resume": "check_resume"}

    @classmethod
    def _plugin_value(cls) -> Any:
        return cls.callback

    @classmethod
    def _plugin_params(cls) -> dict[str, Any]:
        return cls.callback_params

    def test_registered_and_described(self) -> None:
        from phalanx.callbacks import Callback
        from phalanx.registry import CallbackRegistry

        assert self.callback, "set the class attribute `callback` to the registered name, the class or a factory"
        if isinstance(self.callback, str):
            entry = CallbackRegistry.entry(self.callback)
            assert entry.unavailable_reason() is None, entry.unavailable_reason()
            assert entry.description, f"{self.callback!r} has no description; pass one to registry.register"
        plugin = build(self.callback, CallbackRegistry, self.callback_params, what="callback")
        assert isinstance(plugin, Callback), f"{plugin!r} is not a phalanx Callback"

    def test_hooks_run_on_every_rank(self, runs: Runs) -> None:
        self._check_ran(runs)
        for phase in sorted({phase for phase, _ in runs.records}):
            zero, one = runs.record(phase, 0)["hooks"], runs.record(phase, 1)["hooks"]
            assert zero, f"no hook the callback overrides ran on rank 0 during the {phase!r} fit"
            assert zero == one, (
                f"the callback's hooks ran differently on the two ranks ({phase!r} fit): rank 0 {zero}, rank 1 {one}"
            )

    def test_nothing_written_off_rank_zero(self, runs: Runs) -> None:
        self._check_no_writes_off_rank_zero(runs)

    def test_state_survives_resume(self, runs: Runs) -> None:
        import torch

        self._check_ran(runs)
        checkpoint = torch.load(runs.out / MIDDLE.format(resume_at=self.resume_at), weights_only=False)
        saved = checkpoint.get("callbacks", {})
        plugin_state = [state for key, state in saved.items() if not key.startswith(("ModelCheckpoint", "Recorder"))]
        expected_saved = plugin_state[0] if plugin_state else {}
        for rank in (0, 1):
            restored = runs.record("resumed", rank)["restored"]
            _same(
                restored,
                expected_saved,
                f"rank {rank}: state_dict() right after the restore (the checkpoint holds {expected_saved!r})",
            )
            final, uninterrupted = runs.record("resumed", rank)["final"], runs.record("full", rank)["final"]
            _same(final, uninterrupted, f"rank {rank}: state_dict() after the resumed fit vs the uninterrupted fit")
