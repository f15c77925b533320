"""A synthetic torch.profiler trace of a chosen size: the steps of a recorded fixture, replicated, with shifted
timestamps, renumbered ProfilerStep#N and fresh correlation ids (bench/analyze.py, bench/analysis_guard.py).

Each mix keeps some events of the fixture (its metadata events always):

  recorded     every event of the fixture (about 9% of them GPU kernels, memcpys and memsets),
  gpu          the GPU events only (kernels, memcpys, memsets, GPU annotations) and the step annotations,
  gpu+runtime  those and the CUDA runtime and driver calls.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "bundles" / "data_starvation_cpu_bound_fixed" / "trace.json.gz"
MB = 1_000_000
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
ID_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Sequence number")
_STEPS_AND_GPU = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "user_annotation"})
# The categories of the replicated events each mix keeps (None: all of them).
MIXES: dict[str, frozenset[str] | None] = {
    "recorded": None,
    "gpu": _STEPS_AND_GPU,
    "gpu+runtime": _STEPS_AND_GPU | {"cuda_runtime", "cuda_driver"},
}

def build_trace(fixture: Path, size_mb: float, out: Path, info_path: Path | None = None,
                mix: str = "recorded") -> dict[str, Any]:
    """Write `out` (gzipped) holding about size_mb MB of JSON: the fixture's steps, replicated, with the events of
    `mix` only; describe it in `info_path` (default: beside it)."""
    info_path = info_path or out.with_name(out.name + ".info.json")
    want = {"fixture": str(fixture), "fixture_bytes": fixture.stat().st_size, "size_mb": size_mb, "version": 3,
            "mix": mix}
    if out.is_file() and info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("built_from") == want:
            return info
    with gzip.open(fixture, "rb") as f:
        trace = json.loads(f.read())
    events = trace.pop("traceEvents")
    trace_name = trace.pop("traceName", None)
    once = [e for e in events if e.get("ph") in ("M", "i") or e.get("cat") == "Trace"]
    repeated = [e for e in events if not (e.get("ph") in ("M", "i") or e.get("cat") == "Trace")]
    steps = sorted(int(m.group(1)) for e in repeated if e.get("cat") == "user_annotation"
                   for m in [_STEP.match(str(e.get("name", "")))] if m)
    if not steps:
        sys.exit(f"{fixture} has no ProfilerStep#N annotations to replicate; choose a fixture that has, such as "
                 f"{FIXTURE.relative_to(ROOT)}")
    first_step, n_steps = steps[0], steps[-1] - steps[0] + 1
    timed = [e for e in repeated if "ts" in e]
    t0 = min(float(e["ts"]) for e in timed)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed)
    starts = sorted(float(e["ts"]) for e in repeated if e.get("cat") == "user_annotation"
                    and _STEP.match(str(e.get("name", ""))))
    gap = (starts[-1] - starts[0]) / max(1, len(starts) - 1) * 0.05  # a little idle time between replicas
    period = (t1 - t0) + gap
    id_stride = 1 + max([int(e["id"]) for e in repeated if isinstance(e.get("id"), int)]
                        + [int(v) for e in repeated for k, v in (e.get("args") or {}).items()
                           if k in ID_ARGS and isinstance(v, int)] + [0])
    kept = MIXES[mix]
    if kept is not None:
        repeated = [e for e in repeated if e.get("cat") in kept]
    header = {"distributedInfo": {"rank": 0, "world_size": 1}, **trace}  # HTA finds the rank near the top

    out.parent.mkdir(parents=True, exist_ok=True)
    target = int(size_mb * MB)
    written = replicas = count = 0
    tmp = out.with_name(out.name + ".tmp")
    started = time.perf_counter()
    with gzip.open(tmp, "wb", compresslevel=6) as f:
        def write(text: str) -> None:
            nonlocal written
            data = text.encode()
            written += len(data)
            f.write(data)

        write("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in header.items())
              + ',\n  "traceEvents": [\n')
        tail = '\n  ],\n  "traceName": ' + json.dumps(trace_name or str(out)) + "\n}\n"
        parts = ["  " + json.dumps(e) for e in once]
        write(",\n".join(parts))
        count += len(once)
        while written + len(tail) < target:
            block = ",\n" + ",\n".join("  " + json.dumps(_shifted(e, replicas, period, n_steps, id_stride))
                                       for e in repeated)
            write(block)
            count += len(repeated)
            replicas += 1
            print(f"\rbuilding {out.name}: {written / MB:,.0f} of {size_mb:,.0f} MB", end="", file=sys.stderr,
                  flush=True)
        write(tail)
    print(file=sys.stderr)
    os.replace(tmp, out)
    gpu = sum(1 for e in repeated if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    info = {"built_from": want, "json_bytes": written, "gz_bytes": out.stat().st_size, "events": count,
            "gpu_events": gpu * replicas, "replicas": replicas, "steps": replicas * n_steps,
            "first_step": first_step, "build_s": round(time.perf_counter() - started, 1)}
    info_path.write_text(json.dumps(info, indent=2))
    return info


def _shifted(event: dict[str, Any], replica: int, period: float, n_steps: int, id_stride: int) -> dict[str, Any]:
    if replica == 0:
        return event
    e = dict(event)
    if "ts" in e:
        e["ts"] = round(float(e["ts"]) + replica * period, 3)
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + replica * id_stride
    name = e.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        match = _STEP.match(name)
        if match:
            e["name"] = f"ProfilerStep#{int(match.group(1)) + replica * n_steps}"
    args = e.get("args")
    if isinstance(args, dict) and any(k in args for k in ID_ARGS):
        e["args"] = {k: (v + replica * id_stride if k in ID_ARGS and isinstance(v, int) and v > 0 else v)
                     for k, v in args.items()}
    return e
