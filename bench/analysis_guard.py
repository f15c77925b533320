"""Guard against a slower analysis: `gpudoctor analyze` against a bare JSON parse of the same GPU-heavy trace.

    PYTHONPATH=$PWD python3 bench/analysis_guard.py
    PYTHONPATH=$PWD python3 bench/analysis_guard.py --size-mb 150 --repeat 5

Builds (or reuses) the `gpu` mix of bench/analyze.py: the GPU ops and step annotations of a recorded fixture,
replicated to --size-mb MB of JSON, the trace where nearly every event is one the analysis uses. Then runs, each in
its own process and in turn, a bare parse (orjson.loads of the decompressed bytes) and `gpudoctor analyze` to
findings.json, report.html and the text summary, --repeat times, and compares the least wall time of each.

A ratio, not a time: the two run side by side on the same machine, so a slow machine slows both. It exits with 1 when
the analysis takes more than --max-ratio times the bare parse (the target is 1.0: the analysis no slower than
reading the JSON), and with 0 otherwise. Run it before a change to the analysis lands (CONTRIBUTING.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from figures import Figures, add_json_option
from synthetic_trace import FIXTURE, MB, build_trace
from timing import BARE, measure_in_turn


def main() -> int:
    args = parse_args()
    trace = args.workdir / f"gpu-{args.size_mb:g}mb" / "trace.json.gz"
    info = build_trace(args.fixture, args.size_mb, trace, mix="gpu")
    out = args.workdir / f"out-gpu-{args.size_mb:g}mb"
    logs = args.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bare, analysis = measure_in_turn([
        ("bare parse", [sys.executable, "-c", BARE, str(trace)], logs / "bare.log"),
        ("gpudoctor analyze", [sys.executable, "-m", "gpudoctor", "analyze", str(trace), "--out", str(out)],
         logs / "gpudoctor.log"),
    ], args.repeat)
    failed = [r for r in (bare, analysis) if r["rc"] != 0]
    if failed:
        print(f"{failed[0]['label']} failed (exit status {failed[0]['rc']}): see {failed[0]['log']}")
        return 1
    ratio = analysis["wall_s"] / bare["wall_s"]
    print(f"trace: {info['json_bytes'] / MB:,.0f} MB of JSON, {info['events']:,} events, {info['steps']:,} steps "
          f"({args.fixture.parent.name} x{info['replicas']}, GPU ops and step annotations)")
    for row in (bare, analysis):
        print(f"{row['label']:18} {row['wall_s']:6.2f} s  (runs: {', '.join(f'{w:.2f}' for w in row['walls'])})")
    met = ratio <= args.max_ratio
    print(f"gpudoctor analyze / bare parse: {ratio:.2f}x (at most {args.max_ratio:g}x: {'met' if met else 'missed'})")
    figures = Figures("analysis_guard", args.json)
    figures.set("trace", info)
    for row in (bare, analysis):
        figures.set(row["label"], {"wall_s": row["wall_s"], "walls": row["walls"], "maxrss_kib": row["maxrss_kib"]})
    figures.set("ratio", ratio)
    figures.write()
    return 0 if met else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=60.0, help="MB of JSON in the trace (default 60)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, in turn; the least wall time counts")
    parser.add_argument("--max-ratio", type=float, default=1.0,
                        help="the most the analysis may take, in bare parses of the same trace (default 1.0)")
    parser.add_argument("--fixture", type=Path, default=FIXTURE, help="the recorded trace to scale up")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpudoctor-bench-guard"),
                        help="where the trace (kept between runs) and the outputs go")
    add_json_option(parser)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(main())
