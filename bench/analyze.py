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
  (d) gunzip alone: the file inflated in blocks of 1 MB and thrown away, the floor of reading it,
  (e) `gpudoctor analyze` of the fixture itself (a few steps, 0.1 MB): the command's fixed cost (the interpreter,
      its imports, the rules and the report), which every trace pays whatever its size,
  (f) the decode alone: the trace inflated and decoded into the Structs gpudoctor reads it into (msgspec, the
      keys it uses), nothing built from them: what reading the trace costs in Python before any analysis,

and prints the wall time and peak memory (ru_maxrss of the process and anything it waited for) of each,
and the ratios. HTA is run with --hta-python (a virtual environment with HolisticTraceAnalysis, as its
pandas may not suit this one); without it, and without hta importable here, (c) is skipped. HTA reads a
folder of per-rank traces: the trace is alone in its folder, its description (.info.json) beside the folder.
With several mixes (comma-separated), each gets its table, and a summary of all of them comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from figures import Figures, add_json_option
from synthetic_trace import FIXTURE, MB, MIXES, build_trace
from timing import BARE, cpu_model, has_module, measure_in_turn, versions

TARGET_VS_HTA, TARGET_VS_BARE, TARGET_MEMORY_VS_HTA, TARGET_VS_GUNZIP = 10.0, 1.0, 0.25, 2.0

# The floor of reading a trace: inflating it, nothing else (in the blocks gpudoctor's reader inflates).
GUNZIP = """
import gzip, sys
with gzip.open(sys.argv[1], "rb") as f:
    while f.read(1 << 20):
        pass
"""

# What gpudoctor's reader does before it builds anything: inflate, cut into chunks, decode into its Structs.
DECODE = """
import sys
from pathlib import Path
from gpudoctor.analysis.trace import _Event
from gpudoctor.bundle.trace_stream import TraceStream, TypedEvents
print(sum(len(batch) for batch in TraceStream(Path(sys.argv[1])).batches(TypedEvents(_Event))), "events decoded")
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
    figures = Figures("analyze", args.json)
    figures.set("versions", found)
    results = []
    for mix in mixes:
        info, rows = bench_mix(args, mix, skip, hta_python, backends)
        print_table(args, info, rows, found, mix)
        results.append((mix, info, rows))
        figures.set(mix, {"trace": info, "runs": rows})
    if len(results) > 1:
        print_summary(results)
    figures.write()


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
    parser.add_argument("--skip", default="", help="comma-separated: bare, gunzip, gpudoctor, hta, fixed, decode")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each, in turn (the least wall time is shown, all of them beside it)")
    add_json_option(parser)
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
    if "gunzip" not in skip:
        commands.append(("(d) gunzip alone", [sys.executable, "-c", GUNZIP, str(trace)], logs / "gunzip.log"))
    if "gpudoctor" not in skip:
        commands.append(("(b) gpudoctor analyze", [sys.executable, "-m", "gpudoctor", "analyze", str(trace),
                                                   "--out", str(out)], logs / "gpudoctor.log"))
    if "fixed" not in skip:
        commands.append(("(e) gpudoctor analyze of the fixture: the fixed cost",
                         [sys.executable, "-m", "gpudoctor", "analyze", str(args.fixture), "--out",
                          str(args.workdir / "out-fixture")], logs / "fixed.log"))
    if "decode" not in skip:
        commands.append(("(f) the decode alone, into gpudoctor's Structs", [sys.executable, "-c", DECODE, str(trace)],
                         logs / "decode.log"))
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
    gd, bare, gunzip, fixed, decode = by.get("(b)"), by.get("(a)"), by.get("(d)"), by.get("(e)"), by.get("(f)")
    lines = []
    if gd and gunzip:
        t = gd["wall_s"] / gunzip["wall_s"]
        lines.append(f"gpudoctor vs gunzip alone: {t:.2f}x the time (target <= {TARGET_VS_GUNZIP:g}x: "
                     f"{_met(t <= TARGET_VS_GUNZIP)})")
    if gd and gunzip and fixed:
        added = gd["wall_s"] - fixed["wall_s"]
        lines.append(f"  of which the fixed cost, (e): {fixed['wall_s']:.2f} s, "
                     f"{fixed['wall_s'] / gunzip['wall_s']:.2f}x this trace's gunzip alone; what this trace adds "
                     f"to it: {added:.2f} s, {added / gunzip['wall_s']:.2f}x")
    if decode and gunzip:
        lines.append(f"  the decode alone, (f): {decode['wall_s']:.2f} s, {decode['wall_s'] / gunzip['wall_s']:.2f}x "
                     "the gunzip alone")
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
    return {"(a)": "bare parse", "(b)": "gpudoctor", "(e)": "(e) fixed cost",
            "(f)": "(f) decode alone"}.get(label.split(" ")[0], label[:17])


if __name__ == "__main__":
    main()
