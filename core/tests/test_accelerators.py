"""Accelerators: availability, ``devices=`` parsing and device setup.

The index parsing shared by multi-device accelerators is checked in test_trainer_connector.py,
against a test accelerator that pretends to have four devices (the one place that fakes hardware).
"""

from __future__ import annotations

import pytest
import torch

from phalanx.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator
from phalanx.errors import MisconfigurationError


def test_cpu_is_always_available_and_auto_means_one_process() -> None:
    assert CPUAccelerator.is_available()
    assert CPUAccelerator.auto_device_count() == 1
    assert CPUAccelerator.parse_devices("auto") == 1
    assert CPUAccelerator.parse_devices(3) == 3
    assert CPUAccelerator.parse_devices("2") == 2
    assert CPUAccelerator.get_parallel_devices(2) == [torch.device("cpu"), torch.device("cpu")]


@pytest.mark.parametrize("bad", [0, -1, "-1", [0, 1], "0,1", "many", True, 1.5])
def test_cpu_rejects_values_that_are_not_a_process_count(bad: object) -> None:
    with pytest.raises(MisconfigurationError, match="number of processes") as info:
        CPUAccelerator.parse_devices(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)


def test_cpu_setup_device_accepts_cpu_and_rejects_other_types() -> None:
    accelerator = CPUAccelerator()
    accelerator.setup_device(torch.device("cpu"))
    with pytest.raises(MisconfigurationError, match="'cuda:0'"):
        accelerator.setup_device(torch.device("cuda", 0))


def test_cpu_device_stats_are_numbers() -> None:
    stats = CPUAccelerator().get_device_stats("cpu")
    assert stats["cpu_count"] >= 1
    assert all(isinstance(value, (int, float)) for value in stats.values())


def test_cuda_counts_match_torch_and_errors_name_the_cpu_fix() -> None:
    assert CUDAAccelerator.auto_device_count() == torch.cuda.device_count()
    assert CUDAAccelerator.is_available() == (torch.cuda.device_count() > 0)
    if torch.cuda.device_count() == 0:
        with pytest.raises(MisconfigurationError, match='accelerator="cpu"'):
            CUDAAccelerator.parse_devices(1)
    else:
        assert CUDAAccelerator.parse_devices(1) == [0]
        assert CUDAAccelerator.get_parallel_devices([0]) == [torch.device("cuda", 0)]


def test_cuda_setup_device_rejects_a_cpu_device() -> None:
    with pytest.raises(MisconfigurationError, match="only drives 'cuda'"):
        CUDAAccelerator().setup_device(torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_setup_device_selects_the_gpu_and_reports_memory() -> None:
    accelerator = CUDAAccelerator()
    accelerator.setup_device(torch.device("cuda", 0))
    assert torch.cuda.current_device() == 0
    torch.ones(1024, device="cuda")
    stats = accelerator.get_device_stats("cuda:0")
    assert stats["allocated_bytes.all.current"] > 0
    accelerator.teardown()


def test_mps_availability_is_consistent() -> None:
    assert MPSAccelerator.auto_device_count() == (1 if MPSAccelerator.is_available() else 0)
    if not MPSAccelerator.is_available():
        assert MPSAccelerator().get_device_stats("mps") == {}
        with pytest.raises(MisconfigurationError):
            MPSAccelerator.parse_devices(1)


def test_names_are_the_registry_names() -> None:
    assert (CPUAccelerator.name, CUDAAccelerator.name, MPSAccelerator.name) == ("cpu", "cuda", "mps")
