"""Start, check and stop the lighthouse of a local ``ft_ddp`` run.

The lighthouse is a real child process (``python -m phalanx_strategy_torchft.lighthouse``): it
must outlive any one replica group, so it cannot live inside one. It dies with its parent (a
parent-death signal, and it stops when its stdin closes), so even a ``kill -9`` of the job leaves
no lighthouse behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from urllib.parse import urlsplit

from phalanx.errors import MisconfigurationError

__all__ = ["LocalLighthouse", "check_reachable", "die_with_parent", "parse_address"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the OS to SIGKILL this (child) process when its parent dies; runs between fork and exec."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: stdin closing still stops it
        pass


def parse_address(address: str) -> tuple[str, int]:
    """``http://host:port`` (or ``host:port``) -> (host, port); a clear error for anything else."""
    parts = urlsplit(address if "://" in address else f"http://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        msg = (
            f"lighthouse={address!r} is not a lighthouse address; expected 'http://HOST:PORT' "
            "(e.g. 'http://10.0.0.5:29510'). Fix: pass the address the lighthouse printed, or "
            "lighthouse=None to start one for a local run."
        )
        raise MisconfigurationError(msg)
    return parts.hostname, port


def check_reachable(address: str, timeout: timedelta) -> None:
    """Fail now, at ``Trainer(...)``, when nothing listens at the lighthouse address.

    torchft itself would only find out at the first quorum, after the processes started and after
    its connect timeout (a minute by default), and then fail in every replica group at once.
    """
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=max(timeout.total_seconds(), 0.1)):
            return
    except OSError as err:
        msg = (
            f"The torchft lighthouse at {address!r} is unreachable ({err.strerror or err}); every replica "
            "group asks it for a quorum before each step. Fix: start it (python -m "
            "phalanx_strategy_torchft.lighthouse --bind [::]:29510 --min-replicas N, or torchft_lighthouse) "
            "and pass its address, or pass lighthouse=None for a local run (phalanx starts one)."
        )
        raise MisconfigurationError(msg) from None


class LocalLighthouse:
    """A lighthouse child process on the loopback interface, for one local job.

    Args:
        min_replicas: Replica groups a quorum needs.
        join_timeout: How long a quorum waits for a group that is alive but has not asked yet.
        heartbeat_timeout: How long a silent group counts as alive (then it is dropped).
        startup_timeout: How long to wait for the process to print its address.
    """

    def __init__(
        self,
        *,
        min_replicas: int,
        join_timeout: timedelta,
        heartbeat_timeout: timedelta,
        startup_timeout: float = 120.0,
    ) -> None:
        command = [
            sys.executable, "-m", "phalanx_strategy_torchft.lighthouse", "--bind", "127.0.0.1:0",
            "--min-replicas", str(min_replicas),
            "--join-timeout-ms", str(int(join_timeout.total_seconds() * 1000)),
            "--heartbeat-timeout-ms", str(int(heartbeat_timeout.total_seconds() * 1000)),
            "--exit-with-stdin",
        ]  # fmt: skip
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, preexec_fn=die_with_parent
        )
        self.address = self._read_address(startup_timeout)

    def _read_address(self, timeout: float) -> str:
        line: list[bytes] = []
        assert self.proc.stdout is not None
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        text = line[0].decode().strip() if line else ""
        if not text.startswith("http"):
            code = self.proc.poll()
            self.stop()
            msg = (
                f"The local torchft lighthouse did not start (exit code {code}, first line {text!r}). "
                "Fix: check that torchft imports (python -c 'import torchft'), or run a lighthouse "
                "yourself and pass lighthouse='http://HOST:PORT'."
            )
            raise RuntimeError(msg)
        return text

    def alive(self) -> bool:
        """Whether the lighthouse process still runs."""
        return self.proc.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """Stop it (close stdin, SIGTERM, then SIGKILL) and reap it."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.terminate()
                self.proc.wait(grace)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
