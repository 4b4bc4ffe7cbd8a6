"""The cluster environment conformance kit: ranks and rendezvous from a given environment, detect, validation.

```python
from phalanx.testing import ClusterEnvironmentConformance

class TestMyScheduler(ClusterEnvironmentConformance):
    cluster_environment = "my_scheduler"      # the registered name, or the class / a factory
    job_environment = {"MYSCHED_RANK": "5", "MYSCHED_WORLD": "8", ...}   # what the scheduler sets
    expected = {"global_rank": 5, "world_size": 8, "local_rank": 1, "node_rank": 1,
                "main_address": "10.0.0.7", "main_port": 29512}
    allocation = (4, 2)   # devices per node and nodes that job_environment describes
```

The example must be a process that is *not* rank 0 of a one-node job (the kit refuses an
example whose ranks are all 0): an environment that ignores a variable and answers 0 would pass
such an example. What the kit checks, with ``os.environ`` replaced by ``job_environment`` alone:

- **registered**: a registered name is available, described and names a ``ClusterEnvironment``.
- **reads the environment**: ``global_rank``, ``world_size``, ``local_rank``, ``node_rank``,
  ``main_address``, ``main_port`` and ``creates_processes_externally`` are what ``expected`` says.
- **detect**: ``detect()`` is true under ``job_environment``, false under an empty environment
  (unless ``detects_everywhere``), and changes nothing; importing the class and calling
  ``detect()`` in a fresh interpreter does not import torch (``phalanx plugins`` and the
  environment-detection hook run it while listing).
- **validation against the allocation**: ``validate_settings(*allocation)`` passes, and one device
  more, or one node more, raises a ``MisconfigurationError`` naming the wrong number (unless
  ``validates_allocation`` is False: the local environment has no allocation to check against).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pytest

from phalanx.testing.kits._common import ConformanceKit, build, environment_diff, import_paths, target_spec

__all__ = ["ClusterEnvironmentConformance"]

_FACTS = ("global_rank", "world_size", "local_rank", "node_rank", "main_address", "main_port")
#: What a process always has; the kit keeps them so the interpreter still works inside the block.
_KEEP = ("PATH", "HOME", "LANG", "PYTHONPATH", "TMPDIR")


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Run the block with ``os.environ`` holding ``values`` (and the basics) only; restore it exactly."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: saved[k] for k in _KEEP if k in saved})
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _facts(environment: Any) -> dict[str, Any]:
    return {
        "global_rank": environment.global_rank(),
        "world_size": environment.world_size(),
        "local_rank": environment.local_rank(),
        "node_rank": environment.node_rank(),
        "main_address": environment.main_address,
        "main_port": environment.main_port,
    }


class ClusterEnvironmentConformance(ConformanceKit):
    """Subclass with ``cluster_environment``, ``job_environment``, ``expected`` and ``allocation`` set."""

    cluster_environment: ClassVar[Any] = ""
    cluster_environment_params: ClassVar[dict[str, Any]] = {}
    #: The variables the launcher sets for one process of a multi-node job (not rank 0).
    job_environment: ClassVar[dict[str, str]] = {}
    #: What the environment must answer there: every key of ``global_rank``, ``world_size``,
    #: ``local_rank``, ``node_rank``, ``main_address``, ``main_port``.
    expected: ClassVar[dict[str, Any]] = {}
    #: ``(devices per node, nodes)`` of the job ``job_environment`` describes.
    allocation: ClassVar[tuple[int, int]] = (1, 1)
    #: ``creates_processes_externally`` under ``job_environment``.
    creates_processes_externally: ClassVar[bool] = True
    #: True for a fallback environment whose ``detect()`` is always true (local).
    detects_everywhere: ClassVar[bool] = False
    validates_allocation: ClassVar[bool] = True

    _OPT_OUTS: ClassVar[dict[str, str]] = {"test_validates_against_the_allocation": "validates_allocation"}

    @classmethod
    def _environment(cls) -> Any:
        from phalanx.registry import ClusterEnvironmentRegistry

        return build(
            cls.cluster_environment,
            ClusterEnvironmentRegistry,
            cls.cluster_environment_params,
            what="cluster_environment",
        )

    @classmethod
    def _class(cls) -> Any:
        from phalanx.registry import ClusterEnvironmentRegistry

        value = cls.cluster_environment
        return (
            ClusterEnvironmentRegistry.get_class(value)
            if isinstance(value, str) and value
            else type(cls._environment())
        )

    def test_registered_and_described(self) -> None:
        from phalanx.environments import ClusterEnvironment
        from phalanx.registry import ClusterEnvironmentRegistry

        assert self.cluster_environment, (
            "set the class attribute `cluster_environment` to the registered name, the class or a factory"
        )
        if isinstance(self.cluster_environment, str):
            entry = ClusterEnvironmentRegistry.entry(self.cluster_environment)
            assert entry.unavailable_reason() is None, entry.unavailable_reason()
            assert entry.description, f"{self.cluster_environment!r} has no description; pass one to registry.register"
        assert isinstance(self._environment(), ClusterEnvironment), "the plugin is not a phalanx ClusterEnvironment"

    def test_reads_ranks_and_rendezvous_from_the_environment(self) -> None:
        missing = [fact for fact in _FACTS if fact not in self.expected]
        assert not missing, f"`expected` lacks {missing}; give every one of {list(_FACTS)}"
        zero = [f for f in ("global_rank", "local_rank", "node_rank") if not self.expected[f]]
        assert not zero and self.expected["world_size"] > 1, (
            f"the example has {zero or 'world_size'} 0 or 1: describe a process with non-zero global, local and node "
            "ranks in a multi-node job, so that an environment ignoring a variable (and answering 0) cannot pass"
        )
        with _environment(self.job_environment):
            environment = self._environment()
            got = _facts(environment)
            externally = environment.creates_processes_externally
        assert got == {fact: self.expected[fact] for fact in _FACTS}, (
            f"under job_environment the environment answers {got}, expected {self.expected}"
        )
        assert externally == self.creates_processes_externally, (
            f"creates_processes_externally is {externally}, expected {self.creates_processes_externally}"
        )

    def test_detect(self) -> None:
        cls = self._class()
        with _environment(self.job_environment):
            before = dict(os.environ)
            detected = cls.detect()
            changed = environment_diff(before, os.environ)
        assert detected is True, f"{cls.__name__}.detect() is {detected!r} under job_environment"
        assert not changed, f"{cls.__name__}.detect() changed environment variables {changed}"
        if not self.detects_everywhere:
            with _environment({}):
                assert cls.detect() is False, f"{cls.__name__}.detect() is true without any of its variables"
        spec = target_spec(self.cluster_environment)
        code = (
            "import sys\nsys.path[:0] = " + repr(import_paths()) + "\n"
            "from phalanx.registry import ClusterEnvironmentRegistry\n"
            "from phalanx.testing.kits._common import import_spec\n"
            f"spec = {spec!r}\n"
            "cls = import_spec(spec) if ':' in spec else ClusterEnvironmentRegistry.get_class(spec)\n"
            "cls = cls if isinstance(cls, type) else type(cls())\n"
            "cls.detect()\n"
            "print('torch' in sys.modules)\n"
        )
        env = {k: os.environ[k] for k in _KEEP if k in os.environ} | dict(self.job_environment)
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        assert result.returncode == 0, f"importing the environment and calling detect() failed:\n{result.stderr}"
        assert result.stdout.strip() == "False", (
            "importing the environment class or detect() imports torch: keep its module torch-free"
        )

    def test_validates_against_the_allocation(self) -> None:
        from phalanx.errors import MisconfigurationError

        devices, nodes = self.allocation
        with _environment(self.job_environment):
            environment = self._environment()
            environment.validate_settings(devices, nodes)
            for wrong, named in (((devices + 1, nodes), devices + 1), ((devices, nodes + 1), nodes + 1)):
                with pytest.raises(MisconfigurationError) as caught:
                    environment.validate_settings(*wrong)
                text = str(caught.value)
                assert str(named) in text, (
                    f"the error for devices={wrong[0]}, num_nodes={wrong[1]} does not name {named}: {text}"
                )
