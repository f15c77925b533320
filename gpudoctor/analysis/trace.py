"""Compact parsing of a torch.profiler (Kineto) Chrome trace: keep only what the views need.

Times are converted to seconds since the epoch (the trace's `baseTimeNanoseconds` plus each event's
microsecond `ts`) so that they line up with the instrumentation events and the samplers.

The trace is read in chunks of about a MB (`gpudoctor.bundle.TraceStream`), so memory stays a small
fraction of the trace's size as JSON. A big trace (over DETAIL_MAX_BYTES of JSON) keeps only what the
views use: GPU ops, synchronizing CUDA calls, and the step, gpudoctor and DataLoader annotations; a
small one keeps every CUDA runtime call, operator and Python frame as well (`TraceData.detail`).

Each chunk is decoded into `_Event` Structs (the keys the views use, nothing else built) and the GPU ops are added
from them in one loop to the columns of `GpuOps` (about 54 bytes an op; a GpuOp is made only when one is read); a
chunk those Structs cannot take (an unexpected type somewhere in it) is read as dicts instead, by the same rules,
so both give the same records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec

from gpudoctor.analysis.gpu_ops import GPU_KINDS, INT64, NO_ID, NO_WARPS, GpuOps
from gpudoctor.analysis.gpu_ops import GpuOp as GpuOp  # re-exported: the records of a trace are defined here
from gpudoctor.bundle import EventFilter, TraceNotStreamable, TraceStream, read_trace
from gpudoctor.bundle.trace_file import json_size
from gpudoctor.bundle.trace_stream import TypedEvents

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_PY_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
# The runtime calls that block the host until the GPU is done. Not cudaStreamWaitEvent: it only makes one stream
# wait for another, on the GPU, and returns at once (cuDNN's LSTM makes 165 of them a step, each ~0.6 µs).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
GRAPH_LAUNCH = "cudaGraphLaunch"  # a CUDA graph replayed: torch.compile's mode="reduce-overhead", CUDAGraph
# The runtime calls the views use: sync stalls, and whether the step replays CUDA graphs
SYNC_RUNTIME = frozenset((*SYNC_CALLS, "cudaMemcpy", GRAPH_LAUNCH))
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_KIND_CODES = {cat: GPU_KINDS.index(kind) for cat, kind in GPU_CATEGORIES.items()}
DETAIL_MAX_BYTES = 32 << 20  # JSON size up to which every host event is kept
RUNTIME_CATEGORIES = frozenset(("cuda_runtime", "cuda_driver"))


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


class _Args(msgspec.Struct, gc=False):
    """The keys of an event's args that the views use. UNSET: the key is absent (a GPU op's device and stream then
    come from the event's pid and tid)."""

    device: int | msgspec.UnsetType | None = msgspec.UNSET
    stream: int | msgspec.UnsetType | None = msgspec.UNSET
    bytes: int | None = None
    correlation: int | None = None
    python_id: int | None = msgspec.field(default=None, name="Python id")
    python_parent: int | None = msgspec.field(default=None, name="Python parent id")
    warps: float | None = msgspec.field(default=None, name="warps per SM")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    """The keys of a trace event that the views use; msgspec skips every other one without building it. pid and tid
    are whatever the trace holds (a number, or a name such as "Spans")."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    # No ts: NaN, not finite, so the event is skipped. A null, like any other unexpected type, does not decode
    # here: its chunk is then read as dicts.
    ts: float = math.nan
    dur: float = 0.0
    pid: Any = 0
    tid: Any = 0
    args: _Args | None = None


T = TypeVar("T")

@dataclass
class TraceData:
    path: Path
    gpu_ops: GpuOps = field(default_factory=GpuOps)  # by start
    runtime: list[HostSpan] = field(default_factory=list)
    annotations: list[HostSpan] = field(default_factory=list)
    python: list[HostSpan] = field(default_factory=list)
    ops: list[HostSpan] = field(default_factory=list)
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # ProfilerStep#N -> (start, end)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    # True: every CUDA runtime call, cpu_op, python_function and annotation was kept. False (a big trace):
    # only synchronizing calls and graph launches (SYNC_RUNTIME) and the ProfilerStep#, gpudoctor/ and
    # DataLoader annotations; `ops` and `python` are empty.
    detail: bool = True
    cut_short: int | None = None  # a trace that ends early: the bytes of the file read (bundle.TraceStream)
    # What views derive from the trace and several need (the collectives' spans, ...), computed once each: see
    # `derived`.
    _derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __reduce__(self) -> tuple[Callable[..., TraceData], tuple[Any, ...]]:
        """The host spans travel as msgpack (a job's rank analysed in another process, gpudoctor.job.parallel):
        loading them is several times faster than loading their pickled objects."""
        spans = _SPANS_ENCODER.encode((self.runtime, self.annotations, self.python, self.ops))
        return _unpickled, (self.path, self.gpu_ops, spans, self.steps, self.device_properties, self.detail,
                            self.cut_short, self._derived)

    def derived(self, key: str, compute: Callable[[TraceData], T]) -> T:
        """`compute(self)`, computed once for this trace under `key`."""
        if key not in self._derived:
            self._derived[key] = compute(self)
        return cast("T", self._derived[key])

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_ops)

    def warps_per_sm_limit(self) -> dict[int, float]:
        """The most warps an SM holds, by device id, from the trace's deviceProperties (its threads per SM over
        the warp size); a device whose properties lack either is left out."""
        return {p["id"]: p["maxThreadsPerMultiprocessor"] / p["warpSize"] for p in self.device_properties
                if type(p.get("id")) is int and _positive(p.get("maxThreadsPerMultiprocessor"), p.get("warpSize"))}


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
            data = _parse(path, stream.batches(_select(detail)), stream.meta, detail)
            data.cut_short = stream.cut_short
            return data
        except TraceNotStreamable:  # a layout the chunked reader does not follow, or a corrupt trace
            raw = read_trace(path)  # raises BundleError saying what is wrong, if anything is
            events = raw.pop("traceEvents")
            return _parse(path, iter([events]), raw, detail)
    finally:
        close = getattr(progress, "close", None)
        if close is not None:
            close()


def _select(detail: bool) -> TypedEvents[_Event]:
    """Each chunk decoded into _Event Structs; where that fails, picked (a big trace) or parsed into dicts."""
    picker = None if detail else EventFilter(_categories(False), dict.fromkeys(RUNTIME_CATEGORIES, SYNC_RUNTIME))
    return TypedEvents(_Event, picker)


def _parse(path: Path, batches: Iterable[list[Any]], meta: dict[str, Any], detail: bool) -> TraceData:
    data = TraceData(path=path, detail=detail)
    builder: _Builder | None = None
    pending: list[list[Any]] = []  # when baseTimeNanoseconds comes after the events, they wait for it
    wanted = _categories(detail)
    for batch in batches:
        if builder is None and "baseTimeNanoseconds" in meta:
            builder = _Builder(data, float(meta["baseTimeNanoseconds"]) / 1e9, detail)
        if builder is None:
            pending.append([e for e in batch if _may_keep(e, wanted)])
        else:
            builder.add(batch)
    if builder is None:
        builder = _Builder(data, float(meta.get("baseTimeNanoseconds", 0)) / 1e9, detail)
    for batch in pending:
        builder.add(batch)
    properties = meta.get("deviceProperties", [])
    data.device_properties = [p for p in properties if isinstance(p, dict)] if isinstance(properties, list) else []
    by_start = attrgetter("start")
    for spans in (data.runtime, data.annotations, data.python, data.ops):
        spans.sort(key=by_start)
    data.gpu_ops.columns.names = list(builder.gpu_names)
    data.gpu_ops.columns.sort()
    return data


def _may_keep(event: Any, wanted: frozenset[str]) -> bool:
    """A complete event ("ph": "X", the only kind the views use); a decoded one also of a category they use."""
    if type(event) is _Event:
        return event.ph == "X" and event.cat in wanted
    return type(event) is dict and event.get("ph") == "X"


def _categories(detail: bool) -> frozenset[str]:
    kept = {*GPU_CATEGORIES, "cuda_runtime", "cuda_driver", "user_annotation"}
    return frozenset(kept | {"python_function", "cpu_op"} if detail else kept)


class _Builder:
    """Turns the events of a trace, a batch at a time, into TraceData's lists, sharing one str per name."""

    def __init__(self, data: TraceData, base: float, detail: bool) -> None:
        self.data, self.base, self.detail = data, base, detail
        self.wanted = _categories(detail)
        self.names: dict[str, str] = {}
        self.gpu_names: dict[Any, int] = {}  # a GPU op's name -> its index in the names of the GpuOps' columns

    def add(self, events: list[Any]) -> None:
        """Add a batch: _Event Structs (a chunk decoded whole) or dicts (parsed, or picked), never both."""
        if events and type(events[0]) is _Event:
            self._add_typed(events)
        else:
            self._add_dicts(events)

    def _add_typed(self, events: list[_Event]) -> None:
        """The batch's GPU ops built in the loop (most events of a GPU-heavy trace), the other events it keeps by
        _add_host. Each value is converted and checked as _add_event does, so both give the same records."""
        gpu_kind, host, add_host = _KIND_CODES.get, self.wanted.difference(GPU_CATEGORIES), self._add_host
        base, inf, unset, names = self.base, math.inf, msgspec.UNSET, self.gpu_names
        columns = self.data.gpu_ops.columns
        add_kind, add_name, add_start, add_end = (columns.kinds.append, columns.name_ids.append,
                                                  columns.starts.append, columns.ends.append)
        add_device, add_stream, add_bytes = columns.devices.append, columns.streams.append, columns.bytes.append
        add_correlation, correlations = columns.add_correlation, columns.correlations.append
        add_warps, no_warps = columns.warps.append, NO_WARPS
        for e in events:
            if e.ph != "X":
                continue
            kind = gpu_kind(e.cat)
            if kind is None:
                if e.cat in host:
                    add_host(e)
                continue
            start, dur, args = base + e.ts / 1e6, e.dur / 1e6, e.args or _NO_ARGS
            if not (-inf < start < inf and 0.0 <= dur < inf):
                continue  # NaN (no ts), infinite or negative: a malformed event, skipped like any other
            device = e.pid if args.device is unset else args.device
            stream = e.tid if args.stream is unset else args.stream
            if type(device) is not int or type(stream) is not int:
                try:
                    device, stream = int(device or 0), int(stream or 0)
                except (TypeError, ValueError, OverflowError):
                    continue
            add_kind(kind)
            name_id = names.get(e.name)
            if name_id is None:
                name_id = names[e.name] = len(names)
            add_name(name_id)
            add_start(start)
            add_end(start + dur)
            add_device(device)
            add_stream(stream)
            add_bytes(args.bytes)
            correlation = args.correlation
            if type(correlation) is int and NO_ID < correlation < INT64:
                correlations(correlation)
            else:
                add_correlation(correlation)
            warps = args.warps
            add_warps(no_warps if warps is None else warps)

    def _add_host(self, e: _Event) -> None:
        """A CUDA runtime call, an annotation, an operator or a Python frame, as _add_event takes it."""
        name, detail = e.name, self.detail
        if not detail and e.cat in RUNTIME_CATEGORIES and name not in SYNC_RUNTIME:
            return
        if not detail and e.cat == "user_annotation" and not _kept_annotation(name):
            return
        start, dur = self.base + e.ts / 1e6, e.dur / 1e6
        if not (math.isfinite(start) and 0.0 <= dur < math.inf):
            return
        try:
            self._add_span(e, self.names.setdefault(name, name), start, start + dur)
        except (TypeError, ValueError, OverflowError):
            return  # a tid that is neither a number nor hashable

    def _add_span(self, e: _Event, name: str, start: float, end: float) -> None:
        data, cat, args = self.data, e.cat, e.args or _NO_ARGS
        if cat in RUNTIME_CATEGORIES:
            data.runtime.append(HostSpan("runtime", name, start, end, _tid_of(e.tid), correlation=args.correlation))
        elif cat == "user_annotation":
            match = _STEP.match(name)
            if match:
                data.steps[int(match.group(1))] = (start, end)
            else:
                data.annotations.append(HostSpan("annotation", name, start, end, _tid_of(e.tid)))
        elif cat == "python_function":
            data.python.append(HostSpan("python", name, start, end, _tid_of(e.tid), python_id=args.python_id,
                                        python_parent=args.python_parent))
        elif cat == "cpu_op":
            data.ops.append(HostSpan("op", name, start, end, _tid_of(e.tid)))

    def _add_dicts(self, events: list[Any]) -> None:
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
        if cat in GPU_CATEGORIES:
            device = int(args.get("device", event.get("pid", 0)) or 0)
            stream = int(args.get("stream", event.get("tid", 0)) or 0)
            data.gpu_ops.columns.add(_KIND_CODES[cat], self.gpu_names.setdefault(name, len(self.gpu_names)), start,
                                     end, device, stream, args.get("bytes"), args.get("correlation"),
                                     _number_or_none(args.get("warps per SM")))
            return
        name = self._name(name)
        if cat in ("cuda_runtime", "cuda_driver"):
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


# The annotations torch.distributed records around each collective on the host ("gloo:all_reduce", ...).
COLLECTIVE_ANNOTATIONS = ("gloo:", "nccl:")


def _kept_annotation(name: str) -> bool:
    """The annotations a big trace keeps: steps, gpudoctor's phases, the DataLoader's waits, collectives."""
    return name.startswith(("ProfilerStep#", "gpudoctor/", *COLLECTIVE_ANNOTATIONS)) or "DataLoader" in name


_SPANS_ENCODER = msgspec.msgpack.Encoder()
_SPANS_DECODER = msgspec.msgpack.Decoder(tuple[list[HostSpan], list[HostSpan], list[HostSpan], list[HostSpan]])


def _unpickled(path: Path, gpu_ops: GpuOps, spans: bytes, steps: dict[int, tuple[float, float]],
               device_properties: list[dict[str, Any]], detail: bool, cut_short: int | None,
               derived: dict[str, Any]) -> TraceData:
    """A trace pickled by `TraceData.__reduce__`."""
    runtime, annotations, python, ops = _SPANS_DECODER.decode(spans)
    return TraceData(path, gpu_ops, runtime, annotations, python, ops, steps, device_properties, detail, cut_short,
                     derived)


def _positive(*values: Any) -> bool:
    """Whether every value is a positive number."""
    return all(type(v) in (int, float) and v > 0 for v in values)


def _number_or_none(value: Any) -> float | None:
    """A number as the typed reader takes it (a float; an int made one), else None: a malformed value is left out."""
    return float(value) if type(value) in (int, float) else None


def _tid(event: dict[str, Any]) -> int:
    return _tid_of(event.get("tid", 0))


def _tid_of(tid: Any) -> int:
    return tid if isinstance(tid, int) else hash(tid)


def parse_python_frame(name: str) -> dict[str, Any] | None:
    """'train.py(41): train_step' -> {"file": "train.py", "line": 41, "function": "train_step"}."""
    match = _PY_FRAME.match(name)
    if not match:
        return None
    return {"file": match.group("file"), "line": int(match.group("line")), "function": match.group("function")}
