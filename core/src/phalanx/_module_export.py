"""Exporting a Module: TorchScript (``to_torchscript``) and ONNX (``to_onnx``), as in Lightning.

Both take an example input (an argument, or ``Module.example_input_array``) and move it to the
model's device through the Module's batch-transfer hooks, exactly as a batch reaches ``forward``
during training, so an export sees the inputs the model was trained on. ONNX needs packages torch
does not install (``onnx``; ``onnxscript`` for the default dynamo exporter): their absence is one
error saying what to install, raised before any work.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from phalanx.errors import MisconfigurationError

__all__ = ["ExportMixin", "jit_is_scripting"]

# True while ``to_torchscript`` compiles. Module-wide rather than per class: the model's submodules
# are compiled too, and each may be a Module of another class.
_scripting_now = False


def jit_is_scripting() -> bool:
    """Whether ``to_torchscript`` is compiling a Module right now.

    TorchScript reads every attribute of a module while compiling it, so a property that raises
    outside a Trainer (``Module.trainer``) must answer instead while this is True.
    """
    return _scripting_now


class ExportMixin:
    """``example_input_array``, ``to_torchscript`` and ``to_onnx`` (mixed into ``phalanx.Module``)."""

    #: Class-level default; ``example_input_array = ...`` sets the instance's own.
    _example_input_array: Any = None

    @property
    def example_input_array(self) -> Any:
        """An input for ``forward``, used by :meth:`to_onnx` and :meth:`to_torchscript` (``method="trace"``).

        A tensor is passed as ``forward(x)``, a tuple as ``forward(*x)``, a dict as ``forward(**x)``.
        """
        return self._example_input_array

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self._example_input_array = example

    @torch.no_grad()
    def to_torchscript(
        self,
        file_path: str | os.PathLike[str] | None = None,
        method: str | None = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Compile the model with TorchScript (``torch.jit.script``, or ``torch.jit.trace`` with ``method="trace"``).

        The model is compiled in eval mode and put back in the mode it was in. Tracing runs
        ``forward`` on ``example_inputs`` (default :attr:`example_input_array`), moved to the
        model's device through the batch-transfer hooks.

        Args:
            file_path: Also save the compiled module there (``torch.jit.save``; fsspec URLs work).
            method: ``"script"`` or ``"trace"``.
            example_inputs: The input to trace with.
            **kwargs: Passed to ``torch.jit.script`` / ``torch.jit.trace``.

        Raises:
            MisconfigurationError: An unknown ``method``, or tracing without an example input.
        """
        module: Any = self
        mode = module.training
        if method == "script":
            with _scripting():
                compiled = torch.jit.script(module.eval(), **kwargs)
        elif method == "trace":
            example = example_inputs if example_inputs is not None else self.example_input_array
            if example is None:
                msg = (
                    f"{type(self).__qualname__}.to_torchscript(method='trace') needs an input to trace. Fix: pass "
                    "example_inputs=..., or set model.example_input_array."
                )
                raise MisconfigurationError(msg)
            if kwargs.get("check_inputs") is not None:
                kwargs["check_inputs"] = _on_device(module, kwargs["check_inputs"])
            with _scripting():
                compiled = torch.jit.trace(module.eval(), example_inputs=_on_device(module, example), **kwargs)
        else:
            msg = f"to_torchscript(method={method!r}) is not a TorchScript method; choose 'script' or 'trace'."
            raise MisconfigurationError(msg)
        module.train(mode)
        if file_path is not None:
            with _open_for_writing(file_path) as handle:
                torch.jit.save(compiled, handle)
        return compiled

    @torch.no_grad()
    def to_onnx(self, file_path: Any = None, input_sample: Any = None, **kwargs: Any) -> Any:
        """Export the model to ONNX with ``torch.onnx.export``, in eval mode (the mode is restored after).

        Args:
            file_path: Where to write the ``.onnx`` file (a path or a binary file object); None
                writes nothing and returns the export.
            input_sample: The input to export with (default :attr:`example_input_array`): a tensor,
                a tuple of positional arguments, or a dict of keyword arguments.
            **kwargs: Passed to ``torch.onnx.export`` (e.g. ``dynamo=False``, ``input_names``).

        Returns:
            What ``torch.onnx.export`` returns (an ``ONNXProgram`` with the dynamo exporter).

        Raises:
            ModuleNotFoundError: ``onnx`` (or, for the default dynamo exporter, ``onnxscript``) is
                not installed; the message says what to install.
            MisconfigurationError: No input sample.
        """
        _require_onnx(type(self).__qualname__, dynamo=kwargs.get("dynamo", _onnx_dynamo_default()))
        module: Any = self
        sample = input_sample if input_sample is not None else self.example_input_array
        if sample is None:
            msg = (
                f"{type(self).__qualname__}.to_onnx() needs an input to export with. Fix: pass input_sample=..., "
                "or set model.example_input_array."
            )
            raise MisconfigurationError(msg)
        sample = _on_device(module, sample)
        args, call_kwargs = ((), sample) if isinstance(sample, Mapping) else (_as_tuple(sample), None)
        if call_kwargs is not None:
            kwargs.setdefault("kwargs", dict(call_kwargs))
        target = os.fspath(file_path) if isinstance(file_path, os.PathLike) else file_path
        mode = module.training
        try:  # in eval mode, as torch's TorchScript-based exporter (Lightning's default) always exported
            return torch.onnx.export(module.eval(), args, target, **kwargs)
        finally:
            module.train(mode)


# ---------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _scripting() -> Iterator[None]:
    """Tell the Module's properties that TorchScript is reading them (see :func:`jit_is_scripting`)."""
    global _scripting_now
    previous, _scripting_now = _scripting_now, True
    try:
        yield
    finally:
        _scripting_now = previous


def _on_device(module: Any, sample: Any) -> Any:
    """``sample`` as a batch would reach ``forward``: through the Module's batch-transfer hooks."""
    sample = module.on_before_batch_transfer(sample, 0)
    sample = module.transfer_batch_to_device(sample, module.device, 0)
    return module.on_after_batch_transfer(sample, 0)


def _as_tuple(sample: Any) -> tuple[Any, ...]:
    return sample if isinstance(sample, tuple) else (sample,)


@contextlib.contextmanager
def _open_for_writing(path: str | os.PathLike[str]) -> Iterator[Any]:
    """A binary handle for ``path``: a local file (parents created) or an fsspec URL."""
    target = os.fspath(path)
    if "://" in target:
        from fsspec.core import url_to_fs

        filesystem, location = url_to_fs(target)
        with filesystem.open(location, "wb") as handle:
            yield handle
        return
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    with open(target, "wb") as handle:
        yield handle


def _onnx_dynamo_default() -> bool:
    """Whether ``torch.onnx.export`` uses the dynamo exporter when not told (True from torch 2.9)."""
    parameter = inspect.signature(torch.onnx.export).parameters.get("dynamo")
    return bool(parameter.default) if parameter is not None else False


def _require_onnx(owner: str, *, dynamo: bool) -> None:
    """Raise one error naming what to install when torch.onnx's exporter cannot run here."""
    needed = ["onnx", "onnxscript"] if dynamo else ["onnx"]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        msg = (
            f"{owner}.to_onnx() needs {' and '.join(missing)}, which torch.onnx.export uses and which "
            f"{'is' if len(missing) == 1 else 'are'} not installed. Fix: pip install onnx onnxscript"
        )
        raise ModuleNotFoundError(msg)
