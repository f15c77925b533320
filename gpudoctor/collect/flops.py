"""The matrix work of one step, counted: the floating-point operations of each matrix product, convolution and
attention the first detail step runs, by the dtype it runs in, with the settings that let fp32 products use TF32.
The analysis divides them by the step's time for the step's throughput, and by the device's peak for that precision
for its utilization (analysis.throughput).

A dispatch mode sees every operator the step runs, after autocast has cast its inputs, and counts those torch's own
FLOP formulas know (torch.utils.flop_counter, which its FlopCounterMode uses), forward and backward (the autograd
engine's threads run in the mode too). It costs a Python call per operator for that one step, whose time no figure
reads (the detail steps are timed for their phases, and the run's pace is the steps' after the window). It is never
entered where torch.compile has compiled a graph (a compiled model run under a dispatch mode would be traced again),
nor where the script has not loaded torch._dynamo: entering a dispatch mode imports it, and inductor with it, seconds
that gpudoctor never spends in a script's process (torch.optim's optimizers load it at their first step).
Nothing it does may fail the step: a formula that raises counts nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import defaultdict
from typing import Any

from gpudoctor.bundle.events import FlopsEvent
from gpudoctor.bundle.step_events import MatrixWork
from gpudoctor.collect.recorder import Recorder

COMPILED = "torch.compile is in use, and a dispatch mode around a compiled model would make dynamo trace it again"
# Entering and leaving a dispatch mode imports torch._dynamo, and with it inductor (seconds, on a GPU machine): only
# where the script has loaded them already (torch.optim's optimizers do, at their first step).
NOT_LOADED = ("counting would import torch.compile's machinery (torch._dynamo, inductor), which this script has not "
              "loaded")
# An operator's kind, by its name: attention's kernels name themselves so; convolutions too; the rest are products.
KIND_WORDS = (("attention", "attention"), ("conv", "conv"))


def kind_of(name: str) -> str:
    """gemm, conv or attention, from an operator's name (aten.mm, aten.convolution_backward, ...)."""
    return next((kind for word, kind in KIND_WORDS if word in name), "gemm")


class FlopCount:
    """Counts one step's matrix work once the first detail step begins, and writes it as that step ends."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._mode: Any = None
        self._step: int | None = None
        self._done = False

    def install(self) -> None:
        self.recorder.on_window_change(self._on_window_change)
        self.recorder.on_step_end(self._on_step_end)

    def _on_window_change(self, hooked: bool) -> None:
        if not hooked or self._done or threading.current_thread() is not threading.main_thread():
            return  # a dispatch mode is the thread's own: it is entered and left where the steps end, the main thread
        self._done = True  # one step of the run: the first window's
        if "torch._dynamo" not in sys.modules:
            self.recorder.emit(FlopsEvent(reason=NOT_LOADED))
            return
        if _compiled():
            self.recorder.emit(FlopsEvent(reason=COMPILED))
            return
        try:
            self._mode = _counting_mode()
            self._mode.__enter__()
        except Exception:  # noqa: BLE001 - no count is better than a step that fails
            self._mode = None
            return
        self._step = self.recorder.current.index

    def _on_step_end(self, step: int) -> None:
        mode = self._mode
        if mode is None or step != self._step or threading.current_thread() is not threading.main_thread():
            return
        self._mode = None
        try:
            mode.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - a mode the script's own code left unbalanced: its count is not sure
            return
        self.recorder.emit(_event(step, mode.counts))

    def stop(self) -> None:
        """Leave the mode, counting nothing, where the run ends inside the counted step."""
        mode, self._mode = self._mode, None
        if mode is not None and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(Exception):
                mode.__exit__(None, None, None)


def _compiled() -> bool:
    """Whether torch.compile has compiled a graph in this process (torch._dynamo's own counters; torch.optim imports
    dynamo without compiling anything)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return False
    try:
        stats = dict(counters.get("stats", {}))
    except Exception:  # noqa: BLE001 - counters of another shape: say compiled, and count nothing
        return True
    return bool(stats.get("unique_graphs") or stats.get("calls_captured"))


def _event(step: int, counts: dict[tuple[str, str], list[int]]) -> FlopsEvent:
    import torch

    work = [MatrixWork(kind=kind, dtype=dtype, flops=flops, calls=calls)
            for (kind, dtype), (flops, calls) in sorted(counts.items())]
    matmul = torch.backends.cuda.matmul
    return FlopsEvent(step=step, work=work, tf32_matmul=bool(matmul.allow_tf32),
                      tf32_conv=bool(torch.backends.cudnn.allow_tf32))


def _counting_mode() -> Any:
    """A TorchDispatchMode that adds each known operator's FLOPs to `counts[(kind, dtype)]` = [flops, calls]."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class CountingMode(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = getattr(func, "_overloadpacket", None)
            formula = flop_registry.get(packet) if packet is not None else None
            if formula is not None:
                try:
                    flops = int(formula(*args, **kwargs, out_val=out))
                    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                    dtype = str(first.dtype).removeprefix("torch.") if first is not None else "unknown"
                    row = self.counts[(kind_of(str(packet)), dtype)]
                    row[0] += flops
                    row[1] += 1
                except Exception:  # noqa: BLE001, S110 - a formula that cannot read these arguments counts nothing
                    pass
            return out

    return CountingMode()
