"""Analysis of a big trace: gpudoctor vs a bare JSON parse vs HTA, on the same file, side by side.

    PYTHONPATH=$PWD python3 bench/analyze.py --size-mb 100
    PYTHONPATH=$PWD python3 bench/analyze.py --size-mb 1000 --hta-python /tmp/hta/bin/python
    PYTHONPATH=$PWD python3 bench/analyze.py --size-mb 150 --event-mix recorded,gpu,gpu+runtime --repeat 3 \
        --hta-python /tmp/hta/bin/python

Builds a synthetic torch.profiler trace of --size-mb MB of JSON (gzipped, as gpudoctor writes it) by
replicating the steps of a recorded fixture (data_starvation_cpu_bound_fixed by default: a healthy training step
recorded on an H200 with its ProfilerStep#N annotations and CPU operators) with shifted timestamps,
renumbered ProfilerStep#N and fresh correlation ids, keeping the events of --event-mix:

  recorded     every event of the fixture (about 9% of them GPU kernels, memcpys and memsets),
  gpu          the GPU events only (kernels, memcpys, memsets, GPU annotations) and the step annotations,
  gpu+runtime  those and the CUDA runtime and driver calls,

(the metadata events of the fixture are kept in each), then runs, each in its own process, in turn
(a, b, c, a, b, c, ... so that a slow moment of the machine weighs on all of them):

  (a) a bare parse: orjson.loads of the decompressed bytes (the fastest JSON parser there is for Python),
  (b) `gpudoctor analyze TRACE` to findings.json, report.html and the text summary,
  (c) HolisticTraceAnalysis: TraceAnalysis(trace_dir=...) then get_idle_time_breakdown(), with its default
      parser (json) and, when ijson is installed beside it, its ijson_batch_and_compress parser,

and prints the wall time and peak memory (ru_maxrss of the process and anything it waited for) of each,
and the ratios. HTA is run with --hta-python (a virtual environment with HolisticTraceAnalysis, as its
pandas may not suit this one); without it, and without hta importable here, (c) is skipped. HTA reads a
folder of per-rank traces: the trace is alone in its folder, its description (.info.json) beside the folder.
With several mixes (comma-separated), each gets its table, and a summary of all of them comes last.
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
TARGET_VS_HTA, TARGET_VS_BARE, TARGET_MEMORY_VS_HTA = 10.0, 1.0, 0.25

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
try:
    idle, _ = analysis.get_idle_time_breakdown(visualize=False)
except ValueError as exc:  # HTA keeps only the kernels that a CUDA runtime call in the trace launched
    if "No objects to concatenate" not in str(exc):
        raise
    print("HTA kept no kernel:", exc)
else:
    print(idle.to_string())
"""
NO_KERNEL = "HTA kept no kernel"

# Runs one command and reports its wall time, and the CPU time (user + system) and the peak RSS of it and its
# children (ru_maxrss, KiB on Linux).
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
with open(sys.argv[1], "wb") as log:
    rc = subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT).returncode
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kib": usage.ru_maxrss}))
"""


# -- the synthetic trace ---------------------------------------------------------------------------
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


# -- measuring -------------------------------------------------------------------------------------
def run_once(label: str, command: list[str], log: Path) -> dict[str, Any]:
    """Run `command` once in a fresh process: its exit status, wall time and peak RSS (KiB)."""
    result = subprocess.run([sys.executable, "-c", MEASURE, str(log), *command],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        sys.exit(f"{label}: the measuring process failed\n{result.stderr[-2000:]}")
    run: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    if run["rc"] != 0:
        tail = log.read_text(errors="replace")[-1500:]
        print(f"{label}: exit status {run['rc']}; the last of {log}:\n{tail}", file=sys.stderr)
    return run


def _summary(label: str, log: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The least wall time and the largest peak RSS of `runs`."""
    no_kernel = NO_KERNEL in log.read_text(errors="replace") if log.is_file() else False
    return {"label": label + (" [no kernel kept]" if no_kernel else ""), "log": str(log),
            "rc": max(r["rc"] for r in runs), "wall_s": min(r["wall_s"] for r in runs),
            "walls": [r["wall_s"] for r in runs], "cpu_s": min(r.get("cpu_s", 0.0) for r in runs),
            "maxrss_kib": max(r["maxrss_kib"] for r in runs), "no_kernel": no_kernel}


def measure(label: str, command: list[str], log: Path, repeat: int = 1) -> dict[str, Any]:
    """Run `command` `repeat` times, each in a fresh process: the least wall time, the largest peak RSS."""
    runs = []
    for i in range(repeat):
        print(f"running {label} ({i + 1} of {repeat}) ...", file=sys.stderr, flush=True)
        runs.append(run_once(label, command, log))
        if runs[-1]["rc"] != 0:
            break
    return _summary(label, log, runs)


def measure_in_turn(commands: list[tuple[str, list[str], Path]], repeat: int) -> list[dict[str, Any]]:
    """Run each of `commands` (label, command line, log) `repeat` times, in turn: a, b, c, a, b, c, ..."""
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in commands}
    for i in range(repeat):
        for label, command, log in commands:
            if runs[label] and runs[label][-1]["rc"] != 0:
                continue
            print(f"running {label} ({i + 1} of {repeat}) ...", file=sys.stderr, flush=True)
            runs[label].append(run_once(label, command, log))
    return [_summary(label, log, runs[label]) for label, _, log in commands]


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
    args = parse_args()
    mixes = [m.strip() for m in args.event_mix.split(",") if m.strip()]
    unknown = [m for m in mixes if m not in MIXES]
    if unknown or not mixes:
        sys.exit(f"--event-mix: {', '.join(unknown) or 'none given'}; choose among {', '.join(MIXES)}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    hta_python = args.hta_python or (sys.executable if has_module(sys.executable, "hta") else None)
    backends = hta_backends(hta_python, args.hta_backends) if "hta" not in skip else []
    if "hta" not in skip and not backends:
        print("HTA skipped: pass --hta-python (a Python with HolisticTraceAnalysis installed)", file=sys.stderr)
    found = versions(hta_python)
    results = []
    for mix in mixes:
        info, rows = bench_mix(args, mix, skip, hta_python, backends)
        print_table(args, info, rows, found, mix)
        results.append((mix, info, rows))
    if len(results) > 1:
        print_summary(results)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=100.0, help="MB of JSON in the synthetic trace")
    parser.add_argument("--event-mix", default="recorded",
                        help=f"the events the trace holds, one or several comma-separated: {', '.join(MIXES)} "
                             "(default: recorded)")
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
                        help="runs of each, in turn (the least wall time is shown, all of them beside it)")
    return parser.parse_args()


def hta_backends(hta_python: str | None, wanted: str | None) -> list[str]:
    if hta_python and wanted:
        return [b.strip() for b in wanted.split(",") if b.strip()]
    if hta_python:
        return ["json"] + (["ijson_batch_and_compress"] if has_module(hta_python, "ijson") else [])
    return []


def bench_mix(args: argparse.Namespace, mix: str, skip: set[str], hta_python: str | None,
              backends: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Build (or reuse) the trace of `mix` and run what is compared on it, in turn."""
    tag = f"{mix.replace('+', '-')}-{args.size_mb:g}mb"
    trace_dir = args.workdir / f"trace-{tag}"  # HTA reads a folder of per-rank trace files: the trace alone
    trace = trace_dir / "rank-0.trace.json.gz"
    info = build_trace(args.fixture, args.size_mb, trace, args.workdir / f"trace-{tag}.info.json", mix)
    strays = [p.name for p in trace_dir.iterdir() if p != trace]
    if strays:
        sys.exit(f"{trace_dir} must hold the trace alone for HTA; remove {', '.join(strays)}")
    logs = args.workdir / f"logs-{tag}"
    logs.mkdir(parents=True, exist_ok=True)
    out = args.workdir / f"out-{tag}"
    commands = []
    if "bare" not in skip:
        commands.append(("(a) bare parse: orjson.loads", [sys.executable, "-c", BARE, str(trace)], logs / "bare.log"))
    if "gpudoctor" not in skip:
        commands.append(("(b) gpudoctor analyze", [sys.executable, "-m", "gpudoctor", "analyze", str(trace),
                                                   "--out", str(out)], logs / "gpudoctor.log"))
    for backend in backends:
        commands.append((f"(c) HTA load + idle time ({backend})", [hta_python or "", "-c", HTA, str(trace_dir),
                                                                   backend], logs / f"hta-{backend}.log"))
    rows = measure_in_turn(commands, args.repeat)
    for row in rows:
        if row["label"].startswith("(b)"):
            row["findings"] = _findings_summary(out / "findings.json")
    return info, rows


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


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def print_table(args: argparse.Namespace, info: dict[str, Any], rows: list[dict[str, Any]],
                found: dict[str, str], mix: str = "recorded") -> None:
    print()
    gpu = f", {info['gpu_events'] / max(1, info['events']):.0%} of them GPU ops" if "gpu_events" in info else ""
    print(f"trace ({mix}): {info['json_bytes'] / MB:,.0f} MB of JSON ({info['gz_bytes'] / MB:,.1f} MB gzipped), "
          f"{info['events']:,} events{gpu}, {info['steps']:,} steps: {args.fixture.parent.name} x{info['replicas']}")
    print(f"machine: {os.cpu_count()} cores, {cpu_model()}, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    print()
    print(f"{'':69} {'wall s':>7} {'CPU s':>6} {'peak RSS MB':>12}")
    for row in rows:
        status = "" if row["rc"] == 0 else f"  (exit status {row['rc']})"
        runs = f"  (runs: {', '.join(f'{w:.2f}' for w in row['walls'])})" if len(row["walls"]) > 1 else ""
        print(f"{row['label']:69} {row['wall_s']:7.2f} {row['cpu_s']:6.2f} {row['maxrss_kib'] * 1024 / MB:12,.0f}"
              f"{status}{runs}")
    for row in rows:
        if row.get("findings"):
            print(f"gpudoctor: {row['findings']}")
    print()
    for line in _verdicts(rows):
        print(line)


def _verdicts(rows: list[dict[str, Any]]) -> list[str]:
    by = {r["label"].split(" ")[0]: r for r in rows if r["rc"] == 0}
    gd, bare = by.get("(b)"), by.get("(a)")
    lines = []
    if gd and bare:
        t, m = gd["wall_s"] / bare["wall_s"], gd["maxrss_kib"] / bare["maxrss_kib"]
        lines.append(f"gpudoctor vs bare parse: {t:.2f}x the time (target <= {TARGET_VS_BARE:g}x: "
                     f"{_met(t <= TARGET_VS_BARE)}), {m:.2f}x the memory")
    for hta in (r for r in rows if r["label"].startswith("(c)") and r["rc"] == 0):
        if gd:
            speed, mem = hta["wall_s"] / gd["wall_s"], gd["maxrss_kib"] / hta["maxrss_kib"]
            backend = hta["label"].split("(")[2].split(")")[0]
            lines.append(f"gpudoctor vs HTA ({backend}): {speed:.1f}x faster (target >= {TARGET_VS_HTA:g}x: "
                         f"{_met(speed >= TARGET_VS_HTA)}), {mem:.3f}x its peak memory (target <= "
                         f"{TARGET_MEMORY_VS_HTA:g}x: {_met(mem <= TARGET_MEMORY_VS_HTA)})")
    if any(r.get("no_kernel") for r in rows):
        lines.append("[no kernel kept]: HTA dropped every kernel (it keeps those that a CUDA runtime call in the "
                     "trace launched) and its idle time breakdown stopped there: its figures are its load alone")
    return lines


def print_summary(results: list[tuple[str, dict[str, Any], list[dict[str, Any]]]]) -> None:
    """One line a mix: sizes, the least wall time and the peak RSS of each command, and the ratios."""
    print()
    print("summary (wall s / peak RSS MB; least wall time of the runs, largest peak RSS):")
    labels = [r["label"].split(" [")[0] for r in results[0][2]]
    print(f"{'mix':12} {'JSON MB':>8} {'events':>10} {'GPU ops':>8} " + " ".join(f"{_short(x):>17}" for x in labels)
          + f" {'vs bare':>8} {'vs HTA':>8} {'mem/HTA':>8}")
    for mix, info, rows in results:
        ok = [r for r in rows if r["rc"] == 0]
        cells = " ".join(_cell(r) for r in rows)
        gd = next((r for r in ok if r["label"].startswith("(b)")), None)
        bare = next((r for r in ok if r["label"].startswith("(a)")), None)
        htas = [r for r in ok if r["label"].startswith("(c)")]
        vs_bare = f"{gd['wall_s'] / bare['wall_s']:7.2f}x" if gd and bare else f"{'-':>8}"
        vs_hta = f"{min(h['wall_s'] for h in htas) / gd['wall_s']:7.1f}x" if gd and htas else f"{'-':>8}"
        mem = f"{gd['maxrss_kib'] / min(h['maxrss_kib'] for h in htas):8.3f}" if gd and htas else f"{'-':>8}"
        gpu = info.get("gpu_events", 0) / max(1, info["events"])
        note = "  (HTA: load alone, no kernel kept)" if any(r.get("no_kernel") for r in rows) else ""
        print(f"{mix:12} {info['json_bytes'] / MB:8,.0f} {info['events']:10,} {gpu:8.0%} {cells} {vs_bare} {vs_hta} "
              f"{mem}{note}")
    print("vs bare: gpudoctor's time / the bare parse's; vs HTA: the faster HTA's time / gpudoctor's; "
          "mem/HTA: gpudoctor's peak / the smaller HTA peak")


def _cell(row: dict[str, Any]) -> str:
    if row["rc"] != 0:
        return f"{'failed':>17}"
    return f"{row['wall_s']:7.2f} /{row['maxrss_kib'] * 1024 / MB:6,.0f}  "


def _short(label: str) -> str:
    if label.startswith("(c)"):
        return "HTA " + label.split("(")[-1].rstrip(")")[:13]
    return {"(a)": "bare parse", "(b)": "gpudoctor"}.get(label.split(" ")[0], label[:17])


if __name__ == "__main__":
    main()
