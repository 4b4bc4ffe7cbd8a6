"""A real Ray cluster for the tests: one head node on 127.0.0.1, CPU only, started and stopped by them.

The cluster runs as a :class:`phalanx.testing.processes.Job` (``ray start --head --block``), in a
session of its own and without the per-test leak marker, so it can outlive one test (a module
fixture shares it) and still be found, all of it, when it is stopped: the raylet's workers carry
the Job's marker. Drivers are separate scripts run with ``run_command``; Ray Train's workers
import the scripts' modules from ``SCRIPTS`` (put on the cluster's PYTHONPATH).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from phalanx.environments.local import find_free_port
from phalanx.testing.leaks import CASE_VAR
from phalanx.testing.processes import RANK_VARIABLES, Job, describe_processes

SCRIPTS = Path(__file__).parent / "scripts"
#: What Ray needs on a test machine: no usage report, no token file in $HOME, one thread per worker,
#: and every address on loopback. Ray replaces 127.0.0.1 by the machine's network address for a
#: cluster (other nodes must reach it) except where clusters are off, as on macOS; switching them
#: off keeps the node, the drivers and the workers' MASTER_ADDR on 127.0.0.1.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "OMP_NUM_THREADS": "1",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # SIGTERM to `ray start --block` otherwise waits up to 30 s for the node to drain (for Serve).
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
}
#: The strategies the runs use. A package session blocks every other package's entry points
#: (PHALANX_DISABLE_PLUGINS) to test the package as if installed alone; these runs train under
#: other packages' strategies on purpose, so the cluster unblocks exactly these.
NEEDED_PLUGINS = ("ddp", "fsdp", "local_sgd")
START_TIMEOUT = 90.0


def _blocked_plugins() -> str:
    blocked = [name for name in os.environ.get("PHALANX_DISABLE_PLUGINS", "").split(",") if name]
    return ",".join(name for name in blocked if name not in NEEDED_PLUGINS)


class LocalRayCluster:
    """``ray start --head`` on 127.0.0.1 with ``num_cpus`` CPUs; :meth:`stop` ends every process of it."""

    def __init__(self, workdir: Path, *, num_cpus: int = 2) -> None:
        self.port = find_free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Ray puts its sockets under the temp dir: keep the path short (Unix sockets allow ~107 bytes).
        self.temp_dir = tempfile.mkdtemp(prefix="pxray-", dir="/tmp")
        ray = str(Path(sys.executable).with_name("ray"))
        command = [
            ray, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={self.port}",
            f"--num-cpus={num_cpus}", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]  # fmt: skip
        env = {
            **RAY_ENV,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")])),
            "PHALANX_DISABLE_PLUGINS": _blocked_plugins(),
        }
        self.job = Job(command, workdir, env=env, name="ray-head", unset=(*RANK_VARIABLES, CASE_VAR))
        self._wait_until_started()

    def _wait_until_started(self) -> None:
        """Wait for ``ray start`` to say the node is up (it prints that once GCS and raylet serve)."""
        deadline = time.monotonic() + START_TIMEOUT
        while "Ray runtime started" not in self.job.stdout:
            if self.job.poll() is not None or time.monotonic() > deadline:
                output = self.job.output()
                self.stop()
                msg = f"the local Ray cluster did not start within {START_TIMEOUT:g}s:\n{output[-6000:]}"
                raise RuntimeError(msg)
            time.sleep(0.05)

    def driver_env(self) -> dict[str, str]:
        """The environment of a driver script connecting to this cluster with ``ray.init()``."""
        return {**RAY_ENV, "RAY_ADDRESS": self.address}

    def stop(self) -> str:
        """Stop the cluster (SIGTERM to ``ray start --block`` stops its processes), kill what stays.

        Returns ``pid: command`` of the processes that were still alive 10 s after the stop and
        had to be killed; empty when Ray cleaned up after itself.
        """
        if self.job.poll() is None:
            self.job.process.send_signal(signal.SIGTERM)
            try:
                self.job.process.wait(timeout=30)
            except Exception:  # whatever went wrong, everything is killed below
                pass
        leftovers = self.job.leftovers(grace=10.0)
        described = describe_processes(leftovers) if leftovers else ""
        self.job.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return described
