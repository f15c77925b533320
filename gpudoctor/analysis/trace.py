"""Compact parsing of a torch.profiler (Kineto) Chrome trace: keep only what the views need.

Times are converted to seconds since the epoch (the trace's `baseTimeNanoseconds` plus each event's
microsecond `ts`) so that they line up with the instrumentation events and the samplers.

The trace is read in chunks of a few MB (`gpudoctor.bundle.TraceStream`), so memory stays a small
fraction of the trace's size as JSON. A big trace (over DETAIL_MAX_BYTES of JSON) keeps only what the
views use: GPU ops, synchronizing CUDA calls, and the step, gpudoctor and DataLoader annotations; a
small one keeps every CUDA runtime call, operator and Python frame as well (`TraceData.detail`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.bundle import EventFilter, TraceNotStreamable, TraceStream, read_trace
from gpudoctor.bundle.trace_stream import json_size

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_PY_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent")
SYNC_RUNTIME = frozenset((*SYNC_CALLS, "cudaMemcpy"))  # the runtime calls the views use (sync stalls)
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
DETAIL_MAX_BYTES = 32 << 20  # JSON size up to which every host event is kept


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
    # True: every CUDA runtime call, cpu_op, python_function and annotation was kept. False (a big trace):
    # only synchronizing calls (SYNC_RUNTIME) and the ProfilerStep#, gpudoctor/ and DataLoader annotations;
    # `ops` and `python` are empty.
    detail: bool = True

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_ops)


def parse_trace(path: Path, progress: Callable[[int, int], None] | None = None,
                detail: bool | None = None) -> TraceData:
    """Parse a trace in chunks. `progress(done, total)` hears of each chunk read (bytes of the file); if it
    has a `close()`, that is called at the end. `detail` defaults to the trace being at most DETAIL_MAX_BYTES."""
    path = Path(path)
    if detail is None:
        detail = max(path.stat().st_size, json_size(path)) <= DETAIL_MAX_BYTES
    try:
        try:
            stream = TraceStream(path, progress)
            select = None if detail else EventFilter(
                _categories(False), {"cuda_runtime": SYNC_RUNTIME, "cuda_driver": SYNC_RUNTIME})
            return _parse(path, stream.batches(select), stream.meta, detail)
        except TraceNotStreamable:  # a layout the chunked reader does not follow, or a corrupt trace
            raw = read_trace(path)  # raises BundleError saying what is wrong, if anything is
            events = raw.pop("traceEvents")
            return _parse(path, iter([events]), raw, detail)
    finally:
        close = getattr(progress, "close", None)
        if close is not None:
            close()


def _parse(path: Path, batches: Iterable[list[Any]], meta: dict[str, Any], detail: bool) -> TraceData:
    data = TraceData(path=path, detail=detail)
    builder: _Builder | None = None
    pending: list[Any] = []  # when baseTimeNanoseconds comes after the events, they wait for it
    for batch in batches:
        if builder is None and "baseTimeNanoseconds" in meta:
            builder = _Builder(data, float(meta["baseTimeNanoseconds"]) / 1e9, detail)
        if builder is None:
            pending.extend(e for e in batch if type(e) is dict and e.get("ph") == "X")
        else:
            builder.add(batch)
    if builder is None:
        builder = _Builder(data, float(meta.get("baseTimeNanoseconds", 0)) / 1e9, detail)
    builder.add(pending)
    data.device_properties = meta.get("deviceProperties", [])
    for spans in (data.runtime, data.annotations, data.python, data.ops):
        spans.sort(key=lambda s: s.start)
    data.gpu_ops.sort(key=lambda o: o.start)
    return data


def _categories(detail: bool) -> frozenset[str]:
    kept = {*GPU_CATEGORIES, "cuda_runtime", "cuda_driver", "user_annotation"}
    return frozenset(kept | {"python_function", "cpu_op"} if detail else kept)


class _Builder:
    """Turns the events of a trace, a batch at a time, into TraceData's lists, sharing one str per name."""

    def __init__(self, data: TraceData, base: float, detail: bool) -> None:
        self.data, self.base, self.detail = data, base, detail
        self.wanted = _categories(detail)
        self.names: dict[str, str] = {}

    def add(self, events: list[Any]) -> None:
        wanted, add_event = self.wanted, self._add_event
        for event in events:
            if type(event) is not dict:
                continue
            cat = event.get("cat")
            try:
                if cat not in wanted or event.get("ph") != "X":
                    continue
                add_event(event, cat)
            except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
                continue  # a malformed event is skipped; one bad row must not lose the trace

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, name)

    def _add_event(self, event: dict[str, Any], cat: str) -> None:
        data = self.data
        name = event.get("name", "")
        if cat in ("cuda_runtime", "cuda_driver") and not self.detail and name not in SYNC_RUNTIME:
            return
        if cat == "user_annotation" and not self.detail and not _kept_annotation(name):
            return
        start, dur = self.base + float(event["ts"]) / 1e6, float(event.get("dur", 0)) / 1e6
        if not (math.isfinite(start) and 0.0 <= dur < math.inf):
            return  # NaN, infinite or negative: a malformed event, skipped like any other
        end = start + dur
        args = event.get("args") or {}
        name = self._name(name)
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


def _kept_annotation(name: str) -> bool:
    """The annotations a big trace keeps: steps, gpudoctor's phases and the DataLoader's waits."""
    return name.startswith(("ProfilerStep#", "gpudoctor/")) or "DataLoader" in name


def _tid(event: dict[str, Any]) -> int:
    tid = event.get("tid", 0)
    return tid if isinstance(tid, int) else hash(tid)


def parse_python_frame(name: str) -> dict[str, Any] | None:
    """'train.py(41): train_step' -> {"file": "train.py", "line": 41, "function": "train_step"}."""
    match = _PY_FRAME.match(name)
    if not match:
        return None
    return {"file": match.group("file"), "line": int(match.group("line")), "function": match.group("function")}
