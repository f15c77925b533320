"""Analysis of a big trace: gpudoctor vs a bare JSON parse vs HTA, on the same file, side by side.

    PYTHONPATH=$PWD python3 bench/analyze.py --size-mb 100
    PYTHONPATH=$PWD python3 bench/analyze.py --size-mb 1000 --hta-python /tmp/hta/bin/python

Builds a synthetic torch.profiler trace of --size-mb MB of JSON (gzipped, as gpudoctor writes it) by
replicating the steps of a recorded fixture (healthy_transformer by default) with shifted timestamps,
renumbered ProfilerStep#N and fresh correlation ids, then runs, each in its own process:

  (a) a bare parse: orjson.loads of the decompressed bytes (the fastest JSON parser there is for Python),
  (b) `gpudoctor analyze TRACE` to findings.json, report.html and the text summary,
  (c) HolisticTraceAnalysis: TraceAnalysis(trace_dir=...) then get_idle_time_breakdown(), with its default
      parser (json) and, when ijson is installed beside it, its ijson_batch_and_compress parser,

and prints the wall time and peak memory (ru_maxrss of the process and anything it waited for) of each,
and the ratios. HTA is run with --hta-python (a virtual environment with HolisticTraceAnalysis, as its
pandas may not suit this one); without it, and without hta importable here, (c) is skipped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "bundles" / "healthy_transformer" / "trace.json.gz"
MB = 1_000_000
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
ID_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Sequence number")

BARE = """
import gzip, sys, orjson
with gzip.open(sys.argv[1], "rb") as f:
    trace = orjson.loads(f.read())
print(len(trace["traceEvents"]), "events")
"""

HTA = """
import logging, sys
from hta.configs.parser_config import ParserBackend, ParserConfig
from hta.trace_analysis import TraceAnalysis
logging.disable(logging.WARNING)
if sys.argv[2] != "json":
    cfg = ParserConfig.get_default_cfg()
    cfg.set_parser_backend(ParserBackend(sys.argv[2]))
    ParserConfig.set_default_cfg(cfg)
analysis = TraceAnalysis(trace_dir=sys.argv[1])
idle, _ = analysis.get_idle_time_breakdown(visualize=False)
print(idle.to_string())
"""

# Runs one command and reports its wall time and the peak RSS of it and its children (ru_maxrss, KiB on Linux).
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
with open(sys.argv[1], "wb") as log:
    rc = subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT).returncode
wall = time.perf_counter() - started
print(json.dumps({"rc": rc, "wall_s": wall, "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


# -- the synthetic trace ---------------------------------------------------------------------------
def build_trace(fixture: Path, size_mb: float, out: Path) -> dict[str, Any]:
    """Write `out` (gzipped) holding about size_mb MB of JSON: the fixture's steps, replicated."""
    info_path = out.with_name(out.name + ".info.json")
    want = {"fixture": str(fixture), "fixture_bytes": fixture.stat().st_size, "size_mb": size_mb, "version": 2}
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
        sys.exit(f"{fixture} has no ProfilerStep#N annotations to replicate")
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
    info = {"built_from": want, "json_bytes": written, "gz_bytes": out.stat().st_size, "events": count,
            "replicas": replicas, "steps": replicas * n_steps, "first_step": first_step,
            "build_s": round(time.perf_counter() - started, 1)}
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


# -- measuring -------------------------------------------------------------------------------------
def measure(label: str, command: list[str], log: Path, repeat: int = 1) -> dict[str, Any]:
    """Run `command` `repeat` times, each in a fresh process: the least wall time, the largest peak RSS."""
    runs = []
    for i in range(repeat):
        print(f"running {label} ({i + 1} of {repeat}) ...", file=sys.stderr, flush=True)
        result = subprocess.run([sys.executable, "-c", MEASURE, str(log), *command],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0 or not result.stdout.strip():
            sys.exit(f"{label}: the measuring process failed\n{result.stderr[-2000:]}")
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
        if runs[-1]["rc"] != 0:
            tail = log.read_text(errors="replace")[-1500:]
            print(f"{label}: exit status {runs[-1]['rc']}; the last of {log}:\n{tail}", file=sys.stderr)
            break
    return {"label": label, "log": str(log), "rc": max(r["rc"] for r in runs),
            "wall_s": min(r["wall_s"] for r in runs), "walls": [r["wall_s"] for r in runs],
            "maxrss_kib": max(r["maxrss_kib"] for r in runs)}


def versions(hta_python: str | None) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from gpudoctor import __version__

    found = {"python": platform.python_version(), "gpudoctor": __version__}
    for name in ("orjson",):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    if hta_python:
        probe = ("from importlib.metadata import version as v; import json\n"
                 "out = {}\nfor n in ('HolisticTraceAnalysis', 'pandas', 'numpy', 'ijson'):\n"
                 "    try: out[n] = v(n)\n    except Exception: pass\nprint(json.dumps(out))")
        result = subprocess.run([hta_python, "-c", probe], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            found.update(json.loads(result.stdout))
    return found


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def has_module(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=100.0, help="MB of JSON in the synthetic trace")
    parser.add_argument("--fixture", type=Path, default=FIXTURE, help="the recorded trace to scale up")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpudoctor-bench-analyze"),
                        help="where the synthetic trace (kept between runs) and the outputs go")
    parser.add_argument("--hta-python", default=None,
                        help="a Python with HolisticTraceAnalysis installed (default: this one, if it has it)")
    parser.add_argument("--hta-backends", default=None,
                        help="comma-separated HTA parsers (default: json, plus ijson_batch_and_compress "
                             "when ijson is installed beside HTA)")
    parser.add_argument("--skip", default="", help="comma-separated: bare, gpudoctor, hta")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each (the least wall time is shown, all of them beside it)")
    args = parser.parse_args()

    size_tag = f"{args.size_mb:g}mb"
    trace_dir = args.workdir / f"trace-{size_tag}"  # HTA reads a directory of per-rank trace files
    trace = trace_dir / "rank-0.trace.json.gz"
    info = build_trace(args.fixture, args.size_mb, trace)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    hta_python = args.hta_python or (sys.executable if has_module(sys.executable, "hta") else None)
    if hta_python and args.hta_backends:
        backends = [b.strip() for b in args.hta_backends.split(",") if b.strip()]
    elif hta_python:
        backends = ["json"] + (["ijson_batch_and_compress"] if has_module(hta_python, "ijson") else [])
    else:
        backends = []

    logs = args.workdir / f"logs-{size_tag}"
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    if "bare" not in skip:
        rows.append(measure("(a) bare parse: orjson.loads", [sys.executable, "-c", BARE, str(trace)],
                            logs / "bare.log", args.repeat))
    if "gpudoctor" not in skip:
        out = args.workdir / f"out-{size_tag}"
        rows.append(measure("(b) gpudoctor analyze", [sys.executable, "-m", "gpudoctor", "analyze", str(trace),
                                                     "--out", str(out)], logs / "gpudoctor.log", args.repeat))
        rows[-1]["findings"] = _findings_summary(out / "findings.json")
    if "hta" not in skip:
        if not backends:
            print("HTA skipped: pass --hta-python (a Python with HolisticTraceAnalysis installed)", file=sys.stderr)
        for backend in backends:
            rows.append(measure(f"(c) HTA load + idle time ({backend})",
                                [hta_python, "-c", HTA, str(trace_dir), backend], logs / f"hta-{backend}.log",
                                args.repeat))

    print_table(args, info, rows, versions(hta_python))


def _findings_summary(path: Path) -> str:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return "no findings.json"
    steps = report.get("run", {}).get("steps_analysed")
    codes = sorted({f.get("code", "?") for f in report.get("findings", [])})
    verdict = report.get("summary", {}).get("verdict", "")
    return (f"{steps} steps analysed, {len(report.get('findings', []))} findings ({', '.join(codes) or 'none'}): "
            f"{verdict}")


def print_table(args: argparse.Namespace, info: dict[str, Any], rows: list[dict[str, Any]],
                found: dict[str, str]) -> None:
    print()
    print(f"trace: {info['json_bytes'] / MB:,.0f} MB of JSON ({info['gz_bytes'] / MB:,.1f} MB gzipped), "
          f"{info['events']:,} events, {info['steps']:,} steps: {args.fixture.parent.name} x{info['replicas']}")
    print(f"machine: {os.cpu_count()} cores, {cpu_model()}, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    print()
    print(f"{'':52} {'wall s':>8} {'peak RSS MB':>12}")
    for row in rows:
        status = "" if row["rc"] == 0 else f"  (exit status {row['rc']})"
        runs = f"  (runs: {', '.join(f'{w:.1f}' for w in row['walls'])})" if len(row["walls"]) > 1 else ""
        print(f"{row['label']:52} {row['wall_s']:8.1f} {row['maxrss_kib'] * 1024 / MB:12,.0f}{status}{runs}")
    for row in rows:
        if row.get("findings"):
            print(f"gpudoctor: {row['findings']}")
    by = {r["label"].split(" ")[0]: r for r in rows if r["rc"] == 0}
    gd, bare = by.get("(b)"), by.get("(a)")
    print()
    if gd and bare:
        t, m = gd["wall_s"] / bare["wall_s"], gd["maxrss_kib"] / bare["maxrss_kib"]
        print(f"gpudoctor vs bare parse: {t:.2f}x the time (target <= 2x: {'met' if t <= 2 else 'missed'}), "
              f"{m:.2f}x the memory")
    for hta in (r for r in rows if r["label"].startswith("(c)") and r["rc"] == 0):
        if gd:
            speed, mem = hta["wall_s"] / gd["wall_s"], gd["maxrss_kib"] / hta["maxrss_kib"]
            backend = hta["label"].split("(")[-1].rstrip(")")
            print(f"gpudoctor vs HTA ({backend}): {speed:.1f}x faster (target >= 5x: "
                  f"{'met' if speed >= 5 else 'missed'}), {mem:.3f}x its peak memory (target < 0.25x: "
                  f"{'met' if mem < 0.25 else 'missed'})")


if __name__ == "__main__":
    main()
