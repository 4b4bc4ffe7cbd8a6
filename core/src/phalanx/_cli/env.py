"""``phalanx env``: versions, devices, distributed backends and plugin health, in well under a second.

Importing torch takes seconds, so by default nothing here imports it: torch's version and build
come from ``torch/version.py`` (read as a file), NVIDIA devices from the driver's ``/proc`` entries,
and the distributed backends from what the build ships. ``phalanx env --torch`` imports torch and
asks it instead; ``phalanx doctor`` goes further and actually runs collectives and fits.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["print_env"]

_LIBRARIES = ("deepspeed", "torch-xla", "numpy", "pluggy")


def _torch_build() -> dict[str, Any] | None:
    """torch's ``version.py`` values (``__version__``, ``cuda``, ``hip``) without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    values: dict[str, Any] = {}
    try:
        exec(compile(version_file.read_text(), str(version_file), "exec"), values)  # torch's own file: plain assignments
    except (OSError, SyntaxError, ImportError):
        return None
    return values


def _visible_nvidia_devices() -> tuple[int, str]:
    """NVIDIA GPUs the driver lists, narrowed by ``CUDA_VISIBLE_DEVICES``, and where that came from."""
    gpus = Path("/proc/driver/nvidia/gpus")
    count = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    source = "from the NVIDIA driver" if gpus.is_dir() else "no NVIDIA driver found"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")]))
        source += f", CUDA_VISIBLE_DEVICES={visible!r}"
    return count, source


def _library_versions() -> str:
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return ", ".join(f"{name} {version(name)}" for name in _LIBRARIES)


def _fast_torch_lines() -> list[str]:
    build = _torch_build()
    if build is None:
        return ["torch          not installed; fix: pip install torch (the build for your hardware)"]
    cuda, hip = build.get("cuda"), build.get("hip")
    kind = f"CUDA {cuda}" if cuda else f"ROCm/HIP {hip}" if hip else "CPU only"
    lines = [f"torch          {build.get('__version__', '?')} ({kind} build)"]
    if cuda or hip:
        count, source = _visible_nvidia_devices()
        lines.append(f"cuda devices   {count} ({source})")
    else:
        lines.append("cuda devices   0 (this torch build has no CUDA)")
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    lines.append(f"mps            {'expected (Apple silicon)' if apple else 'not available (needs macOS on Apple silicon)'}")
    backends = ["gloo"] if sys.platform in ("linux", "darwin") or sys.platform.startswith("win") else []
    if (cuda or hip) and sys.platform == "linux":
        backends.append("nccl")
    lines.append(f"backends       {', '.join(backends) or 'none'} (what this build ships; `phalanx env --torch` checks)")
    return lines


def _imported_torch_lines() -> list[str]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as err:
        return [f"torch          not importable: {err}; fix: pip install torch"]
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    name = f" ({torch.cuda.get_device_name(0)})" if cuda else ""
    mps = getattr(torch.backends, "mps", None)
    checks = (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()), ("mpi", dist.is_mpi_available()))
    backends = [backend for backend, ok in checks if ok]
    return [
        f"torch          {torch.__version__} (imported)",
        f"cuda devices   {cuda}{name}",
        f"mps            {'available' if mps is not None and mps.is_available() else 'not available'}",
        f"backends       {', '.join(backends) or 'none'}",
    ]


def print_env(*, import_torch: bool) -> int:
    """Print the environment report; ``import_torch`` asks torch itself (slower, authoritative)."""
    from phalanx.discovery import plugin_records
    from phalanx.version import __version__

    lines = [
        f"phalanx-core   {__version__}",
        # The interpreter's own path, as invoked: which venv is in use is what a user checks here.
        f"python         {platform.python_version()} ({sys.executable})",
        f"platform       {platform.platform()}",
        *(_imported_torch_lines() if import_torch else _fast_torch_lines()),
        f"libraries      {_library_versions()}",
        "plugins",
    ]
    for record in plugin_records():
        line = f"  {record.name:<14} {record.status:<12} {record.distribution or '?'} {record.version or ''}"
        lines.append(line.rstrip() + (f" - {record.reason}" if record.reason else ""))
    if not import_torch:
        lines.append("`phalanx env --torch` imports torch to check devices and backends; `phalanx doctor` runs them.")
    print("\n".join(lines))
    return 0
