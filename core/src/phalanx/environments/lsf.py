"""IBM Spectrum LSF, with processes started by its Job Step Manager (``jsrun``).

``jsrun`` starts every rank and sets ``JSM_NAMESPACE_SIZE`` (world size), ``JSM_NAMESPACE_RANK``
(global rank) and ``JSM_NAMESPACE_LOCAL_RANK``; LSF sets ``LSB_JOBID`` and ``LSB_DJOB_RANKFILE``, a
file naming the job's launch host on its first line and then one host per rank. The rendezvous is
the first host of that list; the port is ``MASTER_PORT`` when set, else derived from the job id so
that every rank computes the same one without talking to the others. Detected when the four
variables jsrun and LSF always set are present.
"""

from __future__ import annotations

import logging
import os
import socket

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.local import parse_int_env
from phalanx.errors import MisconfigurationError

__all__ = ["LSFEnvironment"]

log = logging.getLogger(__name__)

_DETECT = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")


def _jsm(name: str, what: str) -> int:
    value = os.environ.get(name)
    if value is None:
        msg = (
            f"Cannot determine the {what}: environment variable {name} is not set. Fix: start the script with "
            "LSF's `jsrun`, which sets it for every rank."
        )
        raise ValueError(msg)
    return parse_int_env(name, value)


class LSFEnvironment(ClusterEnvironment):
    """Ranks and rendezvous of an LSF job step started with ``jsrun``.

    The rendezvous address, port and node rank are computed once, when the environment is built,
    and exported as ``MASTER_ADDR`` / ``MASTER_PORT`` for ``torch.distributed``'s ``env://`` init.

    Raises:
        ValueError: ``LSB_DJOB_RANKFILE`` or ``LSB_JOBID`` is missing or empty, or this host is not
            in the rank file.
    """

    def __init__(self) -> None:
        super().__init__()
        hosts = self._read_hosts()
        self._main_address = hosts[0]
        self._main_port = self._get_main_port()
        self._node_rank = self._get_node_rank(hosts)
        os.environ["MASTER_ADDR"] = str(self._main_address)
        os.environ["MASTER_PORT"] = str(self._main_port)

    @property
    def creates_processes_externally(self) -> bool:
        """Always: jsrun starts the ranks."""
        return True

    @property
    def main_address(self) -> str:
        """The first host of ``LSB_DJOB_RANKFILE`` (after the launch host)."""
        return self._main_address

    @property
    def main_port(self) -> int:
        return self._main_port

    @staticmethod
    def detect() -> bool:
        """Whether LSF and jsrun's variables are all set."""
        return all(name in os.environ for name in _DETECT)

    def world_size(self) -> int:
        return _jsm("JSM_NAMESPACE_SIZE", "world size")

    def set_world_size(self, size: int) -> None:
        log.debug("LSFEnvironment keeps the world size jsrun set; set_world_size(%s) ignored", size)

    def global_rank(self) -> int:
        return _jsm("JSM_NAMESPACE_RANK", "global rank")

    def set_global_rank(self, rank: int) -> None:
        log.debug("LSFEnvironment keeps the rank jsrun set; set_global_rank(%s) ignored", rank)

    def local_rank(self) -> int:
        return _jsm("JSM_NAMESPACE_LOCAL_RANK", "local rank")

    def node_rank(self) -> int:
        """This host's position among the job's distinct hosts, in rank-file order."""
        return self._node_rank

    @staticmethod
    def _read_hosts() -> list[str]:
        """The compute hosts of the job: the rank file's lines after the first (the launch host)."""
        import fsspec

        path = os.environ.get("LSB_DJOB_RANKFILE")
        if not path:
            msg = (
                "LSB_DJOB_RANKFILE is not set or empty: LSFEnvironment reads the job's hosts from it. Fix: run "
                "inside an LSF job, or use another cluster environment."
            )
            raise ValueError(msg)
        with fsspec.open(path, "r") as handle:
            return [line.strip() for line in handle][1:]

    @staticmethod
    def _get_main_port() -> int:
        """``MASTER_PORT`` when set; else 10000 + the job id's last three digits, the same on every rank."""
        if "MASTER_PORT" in os.environ:
            return parse_int_env("MASTER_PORT", os.environ["MASTER_PORT"])
        if "LSB_JOBID" not in os.environ:
            msg = "LSB_JOBID is not set, so LSFEnvironment cannot derive a port. Fix: set MASTER_PORT, or run inside an LSF job."
            raise ValueError(msg)
        return parse_int_env("LSB_JOBID", os.environ["LSB_JOBID"]) % 1000 + 10000

    @staticmethod
    def _get_node_rank(hosts: list[str]) -> int:
        order: dict[str, int] = {}
        for host in hosts:
            order.setdefault(host, len(order))
        hostname = socket.gethostname()
        if hostname not in order:
            msg = f"this host ({hostname!r}) is not in LSB_DJOB_RANKFILE (hosts: {sorted(order)}); LSFEnvironment cannot place it"
            raise MisconfigurationError(msg)
        return order[hostname]
