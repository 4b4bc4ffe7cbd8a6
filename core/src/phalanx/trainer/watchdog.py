"""The hang watchdog: every rank's stack within a minute of a hang, and a SIGTERM that works during one.

A rank that waits in a collective the others never join waits until the process-group timeout
(30 minutes by default) with nothing printed. The watchdog is a thread in every rank of a
distributed stage. Once a second it reads the Trainer's progress (batches done, hooks called, the
hook running); when that has not moved for ``Trainer(hang_report_after=50)`` seconds (so the report comes within a minute), it asks every
rank for a report through the rendezvous store (a side channel that does not need the stuck
process group) and rank 0 prints them together: each rank's position, the collective it waits in,
its own frames (phalanx's and torch's folded), and the first frame where the ranks' stacks differ
(:mod:`phalanx.trainer.hang_report`), and, from torch's flight recorder, the first collective
where the ranks' recorded collectives differ, with the line that issued it on each rank (a desync
whose line has already returned is on no stack; :mod:`phalanx.trainer.flight_recorder`). The job then keeps waiting, as before, until the
process-group timeout: a report is a diagnosis, not a verdict (a 2-minute step is not a hang).

SIGTERM during a hang: preemption turns a signal into a checkpoint at the next optimizer-step
boundary, which a hung rank never reaches, and Python runs signal handlers only between
bytecodes of the main thread, which is blocked in native code. So the watchdog also receives the
signal numbers through ``signal.set_wakeup_fd`` (written by the C-level handler at once). If the
ranks have neither agreed to stop nor made progress within the grace period
(``PHALANX_PREEMPTION_GRACE``, 15 s by default, or three of the recent step times if longer), it
prints the same report and ends the process with 143. No checkpoint is written then: writing one
needs the stuck group; the last good checkpoint stays untouched.

The watchdog costs nothing per step: it reads counters the loops keep anyway (measured in
benchmarks/bench_hang_checks.py). ``Trainer(hang_report_after=None)`` turns it off, SIGTERM
handling during a hang included.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from phalanx.environments.preemption import EXIT_CODE, grace_seconds
from phalanx.trainer import flight_recorder
from phalanx.trainer.hang_report import format_report, snapshot

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["GATHER_SECONDS", "Watchdog"]

#: How long rank 0 waits for the other ranks' reports before printing without them.
GATHER_SECONDS = 5.0
_TICK = 1.0
_PREFIX = "phalanx-watchdog/"


class Watchdog(threading.Thread):
    """Watch one rank's progress; report hangs across ranks; end the process on SIGTERM during one.

    Args:
        run: The stage's Run (progress and position are read from its loops and hook runner).
        report_after: Seconds without progress before the report.
        store: The rendezvous store every rank reaches (``strategy.rendezvous_store``); None: each
            rank prints its own report.
    """

    def __init__(self, run: Run, *, report_after: float, store: Any) -> None:
        super().__init__(name="phalanx-watchdog", daemon=True)
        self._run = run
        self._rank = run.strategy.global_rank
        self._world_size = run.strategy.world_size
        self._report_after = report_after
        self._store = store
        self._stopping = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._signals: set[int] = set()
        self._signal_at: float | None = None
        self._grace = grace_seconds()
        self._last_progress: Any = None
        self._last_change = time.monotonic()
        self._intervals: deque[float] = deque(maxlen=8)
        self._last_batches: int | None = None
        self._last_batch_at = 0.0
        self._reported_stall = False
        self._answered = 0
        self._printed = 0
        #: Reports printed by this process (the tests read the last one).
        self.reports: list[str] = []

    # ------------------------------------------------------------------ main-thread side
    @contextlib.contextmanager
    def catching(self, signals: list[signal.Signals]) -> Iterator[None]:
        """While fit catches the preemption ``signals``, let this thread see them as they arrive."""
        if not signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        self._signals = {int(s) for s in signals}
        previous = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous)
            self._signals = set()

    def stop(self) -> None:
        """End the thread (the stage is over) and release its pipe."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")  # wake the select() now: a failing stage must not wait a tick
        if self.is_alive():
            self.join(timeout=2 * _TICK + 1)
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    # ------------------------------------------------------------------ the thread
    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                ready, _, _ = select.select([self._read_fd], [], [], _TICK)
                if ready:
                    self._read_signals()
                if self._stopping.is_set():
                    return
                self.check(time.monotonic())
            except (OSError, ValueError):  # the pipe was closed by stop()
                return

    def _read_signals(self) -> None:
        data = os.read(self._read_fd, 64)
        if self._signal_at is None and any(byte in self._signals for byte in data):
            self._signal_at = time.monotonic()

    def _progress(self) -> tuple[Any, ...]:
        run = self._run
        hooks = run.hooks
        return (run.fit_loop.total_batches_done, hooks.calls, hooks.current, run.stage)

    def position(self) -> dict[str, Any]:
        """Where this rank is, in the Trainer's words: stage, hook, epoch, step."""
        run = self._run
        stage = getattr(run.stage, "value", run.stage)
        return {
            "stage": stage,
            "last_hook": run.hooks.current,
            "epoch": run.fit_loop.epoch,
            "step": run.fit_loop.global_step,
        }

    def check(self, now: float) -> None:
        """One look, as the thread takes every second: progress, a report to ask for or to answer, a signal."""
        progress = self._progress()
        if progress != self._last_progress:
            batches = progress[0]
            if self._last_batches is not None and batches != self._last_batches:
                # the time between training batches seen by this tick: the step time that sizes the grace
                self._intervals.append(now - self._last_batch_at)
            if batches != self._last_batches:
                self._last_batches, self._last_batch_at = batches, now
            self._last_progress, self._last_change, self._reported_stall = progress, now, False
        stalled = now - self._last_change
        if not self._reported_stall and stalled >= self._report_after:
            self._reported_stall = True
            self._request(
                f"no rank finished a step or hook for {stalled:.0f} s (Trainer(hang_report_after={self._report_after:g}))"
            )
        self._answer()
        if self._signal_at is not None:
            self._check_signal(now, stalled)

    def _check_signal(self, now: float, stalled: float) -> None:
        if self._run.fit_loop.preemption.preempted:  # the ranks agreed: the loop is saving and stopping
            self._signal_at = None
            return
        grace = max(self._grace, 3 * max(self._intervals, default=0.0))
        if now - self._signal_at < grace or stalled < grace:  # type: ignore[operator]
            return
        footer = f"The ranks did not reach the next step within {grace:.0f} s of the signal; exiting with {EXIT_CODE} (no checkpoint: the last saved one is kept)."
        number = self._request(
            f"a preemption signal arrived and the ranks are stuck ({stalled:.0f} s without progress)", footer=footer
        )
        self._answer()
        if self._rank == 0 or self._store is None:
            self._gather_and_print(number)
            self._set("exit", "1")
        else:
            self._wait_for("exit", GATHER_SECONDS * 2)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_CODE)

    # ------------------------------------------------------------------ the side channel
    def _request(self, headline: str, *, footer: str = "") -> int:
        """Ask every rank for a report; returns the request's number (a concurrent request is joined)."""
        footer = footer or "The job keeps waiting until the process-group timeout (the strategy's `timeout`)."
        store = self._store
        if store is None:
            self._printed += 1
            self._print([self._snapshot()], [], headline, footer)
            return self._printed
        try:
            seen = int(store.add(_PREFIX + "request", 0))
            number = seen + 1
            store.set(f"{_PREFIX}headline/{number}", json.dumps([headline, footer]))
            got = store.compare_set(_PREFIX + "request", str(seen), str(number))
            return int(got)
        except Exception as error:
            self._lost_store(error)
            return self._request(headline, footer=footer)

    def _answer(self) -> None:
        """Send this rank's report for a new request; rank 0 then gathers and prints."""
        store = self._store
        if store is None:
            return
        try:
            current = int(store.add(_PREFIX + "request", 0))
            if current > self._answered:
                # Every request since the last answer: two ranks that stall together ask at once
                # (#1, #2), and rank 0 prints #1 only with this rank's answer to #1 too.
                snapshot = json.dumps(self._snapshot())
                for number in range(self._answered + 1, current + 1):
                    store.set(f"{_PREFIX}report/{number}/{self._rank}", snapshot)
                self._answered = current
        except Exception as error:
            self._lost_store(error)
            return
        if self._rank == 0 and current > self._printed:
            self._gather_and_print(current)

    def _gather_and_print(self, number: int) -> None:
        store = self._store
        if store is None or number <= self._printed:
            return
        self._printed = number
        keys = [f"{_PREFIX}report/{number}/{rank}" for rank in range(self._world_size)]
        deadline = time.monotonic() + GATHER_SECONDS
        try:
            while time.monotonic() < deadline and not all(store.check([key]) for key in keys):
                time.sleep(0.1)
            snapshots, missing = [], []
            for rank, key in enumerate(keys):
                if store.check([key]):
                    snapshots.append(json.loads(store.get(key)))
                else:
                    missing.append(rank)
            headline, footer = json.loads(store.get(f"{_PREFIX}headline/{number}"))
        except Exception as error:
            self._lost_store(error)
            return
        self._print(snapshots, missing, headline, footer)

    def _set(self, key: str, value: str) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set(_PREFIX + key, value)

    def _wait_for(self, key: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._store is not None and time.monotonic() < deadline:
            try:
                if self._store.check([_PREFIX + key]):
                    return
            except Exception:
                return
            time.sleep(0.1)

    def _lost_store(self, error: BaseException) -> None:
        sys.stderr.write(
            f"[phalanx] rank {self._rank}: hang watchdog lost the rendezvous store ({error}); reports stay local\n"
        )
        self._store = None

    # ------------------------------------------------------------------ output
    def _snapshot(self) -> dict[str, Any]:
        try:
            snap = snapshot(rank=self._rank, position=self.position())
        except Exception as error:  # a report never ends the watchdog: say what could not be read
            return {
                "rank": self._rank,
                "host": "",
                "pid": os.getpid(),
                "position": {},
                "collective": None,
                "stack": [],
                "error": f"the stack could not be read: {type(error).__name__}: {error}",
            }
        recorded = flight_recorder.read()
        if recorded is not None:
            raw, snap["collectives"] = recorded
            try:
                snap["recorded_to"] = flight_recorder.write(raw, self._recorder_folder(), self._rank)
            except OSError as error:
                snap["recorded_to"] = None
                sys.stderr.write(f"[phalanx] rank {self._rank}: could not write the recorded collectives: {error}\n")
        return snap

    def _recorder_folder(self) -> str:
        """Where every rank writes its recorded collectives: ``<default_root_dir>/flight_recorder``, the
        same path on every rank (a logger's versioned folder is rank 0's alone)."""
        return os.path.abspath(os.path.join(self._run.trainer.default_root_dir, "flight_recorder"))

    def _print(self, snapshots: list[dict[str, Any]], missing: list[int], headline: str, footer: str) -> None:
        collectives = flight_recorder.format_divergence(snapshots)
        text = format_report(snapshots, headline=headline, missing=missing, footer=footer, collectives=collectives)
        self.reports.append(text)
        sys.stderr.write(text)
        sys.stderr.flush()
