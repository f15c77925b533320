"""Compact parsing of a torch.profiler (Kineto) Chrome trace: keep only what the views need.

Times are converted to seconds since the epoch (the trace's `baseTimeNanoseconds` plus each event's
microsecond `ts`) so that they line up with the instrumentation events and the samplers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.bundle import read_trace

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_PY_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent")
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


@dataclass(frozen=True, slots=True)
class GpuOp:
    """One kernel, memcpy or memset on a GPU stream, from the trace (times in seconds since the epoch)."""

    kind: str  # kernel | memcpy | memset
    name: str
    start: float
    end: float
    device: int
    stream: int
    bytes: int | None
    correlation: int | None

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class HostSpan:
    """A CPU-side event: an operator, a CUDA runtime call, an annotation or a Python frame."""

    kind: str  # op | runtime | annotation | python
    name: str
    start: float
    end: float
    tid: int
    correlation: int | None = None
    python_id: int | None = None
    python_parent: int | None = None

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class TraceData:
    path: Path
    gpu_ops: list[GpuOp] = field(default_factory=list)
    runtime: list[HostSpan] = field(default_factory=list)
    annotations: list[HostSpan] = field(default_factory=list)
    python: list[HostSpan] = field(default_factory=list)
    ops: list[HostSpan] = field(default_factory=list)
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # ProfilerStep#N -> (start, end)
    device_properties: list[dict[str, Any]] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_ops)


def parse_trace(path: Path) -> TraceData:
    raw = read_trace(path)
    base = float(raw.get("baseTimeNanoseconds", 0)) / 1e9
    data = TraceData(path=path, device_properties=raw.get("deviceProperties", []))
    for event in raw["traceEvents"]:
        if event.get("ph") != "X":
            continue
        try:
            _add_event(data, event, base)
        except (KeyError, TypeError, ValueError):
            continue  # a malformed event is skipped; one bad row must not lose the trace
    for spans in (data.runtime, data.annotations, data.python, data.ops):
        spans.sort(key=lambda s: s.start)
    data.gpu_ops.sort(key=lambda o: o.start)
    return data


def _add_event(data: TraceData, event: dict[str, Any], base: float) -> None:
    cat = event.get("cat")
    start = base + float(event["ts"]) / 1e6
    end = start + float(event.get("dur", 0)) / 1e6
    args = event.get("args") or {}
    name = event.get("name", "")
    if cat in GPU_CATEGORIES:
        data.gpu_ops.append(GpuOp(
            GPU_CATEGORIES[cat], name, start, end, int(args.get("device", event.get("pid", 0)) or 0),
            int(args.get("stream", event.get("tid", 0)) or 0), args.get("bytes"), args.get("correlation"),
        ))
    elif cat in ("cuda_runtime", "cuda_driver"):
        data.runtime.append(HostSpan("runtime", name, start, end, _tid(event), correlation=args.get("correlation")))
    elif cat == "user_annotation":
        match = _STEP.match(name)
        if match:
            data.steps[int(match.group(1))] = (start, end)
        else:
            data.annotations.append(HostSpan("annotation", name, start, end, _tid(event)))
    elif cat == "python_function":
        data.python.append(HostSpan(
            "python", name, start, end, _tid(event),
            python_id=args.get("Python id"), python_parent=args.get("Python parent id"),
        ))
    elif cat == "cpu_op":
        data.ops.append(HostSpan("op", name, start, end, _tid(event)))


def _tid(event: dict[str, Any]) -> int:
    tid = event.get("tid", 0)
    return tid if isinstance(tid, int) else hash(tid)


def parse_python_frame(name: str) -> dict[str, Any] | None:
    """'train.py(41): train_step' -> {"file": "train.py", "line": 41, "function": "train_step"}."""
    match = _PY_FRAME.match(name)
    if not match:
        return None
    return {"file": match.group("file"), "line": int(match.group("line")), "function": match.group("function")}
