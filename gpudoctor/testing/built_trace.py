"""trace.json.gz of a built bundle: the Chrome trace torch.profiler (Kineto) writes, as plain JSON data.

The trace is torch's format, not gpudoctor's, so it has no records: only the keys gpudoctor's trace reader
uses, with Kineto's units (microseconds from `baseTimeNanoseconds`).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

from gpudoctor.bundle.jsonio import encode
from gpudoctor.testing.spec import H100, H100_THREADS_PER_SM, BundleSpec, GpuOp

TraceEvent = dict[str, object]
LOADER_ANNOTATION = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
OP_CATEGORIES = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
FIRST_CORRELATION = 1001


def write_trace(path: Path, spec: BundleSpec) -> None:
    with gzip.open(path, "wb") as f:
        f.write(encode(trace(spec)))


def trace(spec: BundleSpec) -> dict[str, object]:
    base_s = _base_s(spec)
    events = [{"ph": "M", "name": "process_name", "pid": spec.settings.pid, "tid": 0, "args": {"name": "python"}}]
    events += _step_annotations(spec, base_s)
    events += _device_and_runtime_events(spec, base_s)
    return {
        "schemaVersion": 1, "record_shapes": 1, "displayTimeUnit": "ms", "traceName": str(spec.settings.path / "trace"),
        "baseTimeNanoseconds": base_s * 1_000_000_000,
        "deviceProperties": [_device_properties(d) for d in sorted({op.device for op in spec.ops})],
        "traceEvents": events,
    }


def _base_s(spec: BundleSpec) -> int:
    """Kineto's base time: a whole second before anything in the trace."""
    times = [s.start for s in spec.steps] + [op.start for op in spec.ops] + [call.start for call in spec.runtime]
    return int(min(times)) - 1 if times else int(spec.settings.start) - 1


def _us(t: float, base_s: int) -> float:
    return round((t - base_s) * 1e6, 3)


def _dur(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _step_annotations(spec: BundleSpec, base_s: int) -> Iterator[TraceEvent]:
    """ProfilerStep#N for each active step, N counted from the window's first (warm-up) step, and its data wait."""
    first = spec.first_window_step or 0
    for s in spec.steps:
        if s.window == "active":
            name = f"ProfilerStep#{s.index - first}"
            yield _host_span(spec, name, s.start, s.wall_s, base_s, {"External id": s.index})
            if s.data_wait_s > 0:
                yield _host_span(spec, LOADER_ANNOTATION, s.start, s.data_wait_s, base_s, {})


def _host_span(spec: BundleSpec, name: str, start: float, dur: float, base_s: int,
               args: dict[str, object]) -> TraceEvent:
    pid = spec.settings.pid
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": pid, "ts": _us(start, base_s),
            "dur": _dur(dur), "args": args}


def _device_and_runtime_events(spec: BundleSpec, base_s: int) -> list[TraceEvent]:
    """GPU ops by start time, then runtime calls, each with the next correlation id."""
    ops = sorted(spec.ops, key=lambda o: o.start)
    events = [_op_event(op, base_s, FIRST_CORRELATION + i) for i, op in enumerate(ops)]
    pid = spec.settings.pid
    for i, call in enumerate(spec.runtime, start=FIRST_CORRELATION + len(ops)):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": call.name, "pid": pid, "tid": pid,
                       "ts": _us(call.start, base_s), "dur": _dur(call.dur), "args": {"correlation": i}})
    return events


def _op_event(op: GpuOp, base_s: int, correlation: int) -> TraceEvent:
    args: dict[str, object] = {"device": op.device, "stream": op.stream, "correlation": correlation}
    if op.bytes is not None:
        args["bytes"] = op.bytes
    if op.warps_per_sm is not None:
        args["warps per SM"] = op.warps_per_sm
    return {"ph": "X", "cat": OP_CATEGORIES[op.kind], "name": op.name, "pid": op.device, "tid": op.stream,
            "ts": _us(op.start, base_s), "dur": _dur(op.dur), "args": args}


def _device_properties(device: int) -> TraceEvent:
    return {"id": device, "name": H100.name, "totalGlobalMem": H100.total_memory, "computeMajor": 9, "computeMinor": 0,
            "numSms": H100.multiprocessors, "maxThreadsPerMultiprocessor": H100_THREADS_PER_SM, "warpSize": 32}

