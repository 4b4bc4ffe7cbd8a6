"""PyTorchProfiler: torch.profiler around the profiled actions, reported as an operator table.

The Simple and Advanced profilers see Python; this one sees the operators torch runs (``aten::mm``,
kernels, copies), their time on CPU and GPU and, optionally, memory and shapes. Each profiled
action is a labelled range (``[pl][profile]<action>``) in the trace, and with
``record_module_names`` each submodule's forward is one too (``[pl][module]<class>``), so the
Chrome/TensorBoard trace shows where in the step an operator ran.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerActivity

from phalanx.errors import MisconfigurationError
from phalanx.profilers.profiler import Profiler, _filesystem

__all__ = ["PyTorchProfiler"]

_TORCH_PROFILE_KWARGS = set(inspect.signature(torch.profiler.profile.__init__).parameters) - {"self"}
_TABLE_KWARGS = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
_OWN_KWARGS = {"export_to_flame_graph", "metric"}


class PyTorchProfiler(Profiler):
    """Record torch operators from the first profiled action until :meth:`describe`.

    Deliberate differences from Lightning's (for docs/migrating-from-lightning.md): without a
    ``schedule`` every operator of the stage is recorded (Lightning records steps 3-5 by default),
    so keep profiled runs short (``limit_train_batches``) or pass
    ``schedule=torch.profiler.schedule(wait=1, warmup=1, active=3)``, which is stepped after
    every ``*_step`` action as in Lightning; ``record_module_names`` labels forwards by class.

    Args:
        dirpath: Folder of the report, the Chrome trace and flame-graph stacks.
        filename: Report file name without extension; without it the report is printed.
        group_by_input_shapes: Group the table's rows by input shape (needs ``record_shapes=True``).
        emit_nvtx: Emit NVTX ranges for ``nvprof``/Nsight instead of recording (CUDA only; no table).
        export_to_chrome: Write the trace (``<stage>-<filename>.pt.trace.json``) to ``dirpath``.
        row_limit: Rows in the table; -1 for all.
        sort_by_key: Column to sort by (see :attr:`AVAILABLE_SORT_KEYS`); defaults to
            ``cpu_time_total``, or ``cuda_time_total`` when CUDA is recorded.
        record_module_names: Label every submodule's forward in the trace.
        table_kwargs: Extra arguments of ``EventList.table`` (``max_name_column_width``...).
        **profiler_kwargs: Arguments of :class:`torch.profiler.profile` (``record_shapes``,
            ``profile_memory``, ``with_stack``, ``schedule``, ``activities``...), plus
            ``export_to_flame_graph`` and ``metric`` (stacks for flamegraph.pl).

    Raises:
        MisconfigurationError: An unknown sort key, table argument or profiler argument, or a
            ``schedule`` that is not a callable returning a ``torch.profiler.ProfilerAction``.
    """

    STEP_FUNCTIONS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})
    AVAILABLE_SORT_KEYS = frozenset(
        {
            "cpu_time", "cuda_time", "device_time", "cpu_time_total", "cuda_time_total", "device_time_total",
            "self_cpu_time_total", "self_cuda_time_total", "self_device_time_total", "cpu_memory_usage",
            "cuda_memory_usage", "self_cpu_memory_usage", "self_cuda_memory_usage", "count",
        }
    )  # fmt: skip

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        group_by_input_shapes: bool = False,
        emit_nvtx: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        record_module_names: bool = True,
        table_kwargs: dict[str, Any] | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        unknown = set(profiler_kwargs) - _TORCH_PROFILE_KWARGS - _OWN_KWARGS
        if unknown:
            msg = (
                f"PyTorchProfiler got unknown profiler arguments {sorted(unknown)}; valid ones are "
                f"{sorted(_TORCH_PROFILE_KWARGS | _OWN_KWARGS)} (those of torch.profiler.profile): fix or remove them"
            )
            raise MisconfigurationError(msg)
        bad_table = set(table_kwargs or {}) - _TABLE_KWARGS
        if bad_table:
            msg = (
                f"PyTorchProfiler got table_kwargs {sorted(bad_table)}; valid ones are {sorted(_TABLE_KWARGS)} "
                "(sort_by and row_limit are the sort_by_key and row_limit arguments)"
            )
            raise MisconfigurationError(msg)
        schedule = profiler_kwargs.get("schedule")
        if schedule is not None and not (callable(schedule) and isinstance(schedule(0), torch.profiler.ProfilerAction)):
            msg = (
                f"PyTorchProfiler(schedule={schedule!r}) must be a callable returning a torch.profiler.ProfilerAction: "
                "use torch.profiler.schedule(wait=..., warmup=..., active=...)"
            )
            raise MisconfigurationError(msg)
        activities = profiler_kwargs.get("activities")
        if activities is None:
            activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
        self._sort_by_key = sort_by_key or (
            "cuda_time_total" if ProfilerActivity.CUDA in activities else "cpu_time_total"
        )
        if self._sort_by_key not in self.AVAILABLE_SORT_KEYS:
            msg = (
                f"PyTorchProfiler(sort_by_key={sort_by_key!r}) is not a sort key; use one of "
                f"{sorted(self.AVAILABLE_SORT_KEYS)}"
            )
            raise MisconfigurationError(msg)
        super().__init__(dirpath=dirpath, filename=filename)  # after validation: __del__ needs a whole object
        self._group_by_input_shapes = group_by_input_shapes and bool(profiler_kwargs.get("record_shapes", False))
        self._emit_nvtx = emit_nvtx
        self._export_to_chrome = export_to_chrome
        self._row_limit = row_limit
        self._record_module_names = record_module_names
        self._table_kwargs = dict(table_kwargs or {})
        self._flame_graph = bool(profiler_kwargs.get("export_to_flame_graph", False))
        self._metric = str(profiler_kwargs.get("metric", "self_cpu_time_total"))
        self._profiler_kwargs = {k: v for k, v in profiler_kwargs.items() if k in _TORCH_PROFILE_KWARGS}
        self._profiler_kwargs["activities"] = activities
        self._profiler_kwargs["with_stack"] = bool(profiler_kwargs.get("with_stack", False)) or self._flame_graph
        self._schedule = schedule
        #: The running ``torch.profiler.profile`` (or NVTX emitter) between the first action and describe.
        self.profiler: Any = None
        #: The recorded events, once the profiler has stopped (what the table is built from).
        self.function_events: EventList | None = None
        self._nvtx_parent: Any = None
        self._ranges: dict[str, Any] = {}
        self._module_ranges: list[Any] = []
        self._module_hooks: list[Any] = []

    def start(self, action_name: str) -> None:
        """Start torch's profiler on the first action, then open the action's labelled range."""
        if self.profiler is None:
            self._start_profiler()
        if not self._emit_nvtx and action_name not in self._ranges:
            label = record_function("[pl][profile]" + action_name)
            label.__enter__()
            self._ranges[action_name] = label

    def stop(self, action_name: str) -> None:
        """Close the action's range; after a ``*_step`` action, advance a user-given schedule."""
        label = self._ranges.pop(action_name, None)
        if label is not None:
            label.__exit__(None, None, None)
        if (
            self._schedule is not None
            and isinstance(self.profiler, torch.profiler.profile)
            and action_name.endswith(tuple(self.STEP_FUNCTIONS))
        ):
            self.profiler.step()

    def summary(self) -> str:
        """Stop recording and return the operator table (empty with ``emit_nvtx`` or nothing recorded)."""
        self._stop_profiler()
        if self._emit_nvtx or not self.function_events:
            return ""
        averages = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        table = averages.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs)
        return self._stats_to_str({"records": table})

    def teardown(self, stage: str | None) -> None:
        """Stop torch's profiler (if still running), close every open range and the report."""
        self._stop_profiler()
        super().teardown(stage=stage)

    # ------------------------------------------------------------------ internals
    def _start_profiler(self) -> None:
        self.function_events = None
        if self._emit_nvtx:
            self._nvtx_parent = torch.cuda.profiler.profile()
            self._nvtx_parent.__enter__()
            self.profiler = torch.autograd.profiler.emit_nvtx(
                record_shapes=bool(self._profiler_kwargs.get("record_shapes"))
            )
            self.profiler.__enter__()
        else:
            self.profiler = torch.profiler.profile(**self._profiler_kwargs)
            self.profiler.__enter__()
        if self._record_module_names:
            self._module_hooks = [
                torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module),
                torch.nn.modules.module.register_module_forward_hook(self._exit_module),
            ]

    def _stop_profiler(self) -> None:
        """Close open ranges innermost first, stop the profiler, keep its events and write the traces."""
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks = []
        for label in [*reversed(self._module_ranges), *reversed(self._ranges.values())]:
            label.__exit__(None, None, None)
        self._module_ranges, self._ranges = [], {}
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        profiler.__exit__(None, None, None)
        if self._nvtx_parent is not None:
            self._nvtx_parent.__exit__(None, None, None)
            self._nvtx_parent = None
            return
        # With a schedule still waiting, torch never started its recorder: there are no events.
        self.function_events = profiler.events() if profiler.profiler is not None else None
        if self.dirpath is not None and self.function_events:
            if self._export_to_chrome:
                self._export(profiler.export_chrome_trace, ".pt.trace.json")
            if self._flame_graph:
                self._export(lambda path: profiler.export_stacks(path, metric=self._metric), ".stack")

    def _export(self, write: Any, extension: str) -> None:
        """torch writes traces to local files only; write to a temporary one and copy it to ``dirpath``."""
        target = self._output_path(extension=extension)
        with tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, "trace" + extension)
            write(local)
            with open(local, "rb") as source, _filesystem(target).open(target, "wb") as sink:
                sink.write(source.read())

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        label = record_function(f"[pl][module]{type(module).__module__}.{type(module).__qualname__}")
        label.__enter__()
        self._module_ranges.append(label)

    def _exit_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._module_ranges:
            self._module_ranges.pop().__exit__(None, None, None)
