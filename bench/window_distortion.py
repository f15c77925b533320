"""The profiling window's distortion on every recorded fixture: its median profiled step over the median step after it.

    PYTHONPATH=$PWD python3 bench/window_distortion.py [--bundles DIR]

Reads the bundles in fixtures/bundles, or in DIR (as findings.json's `run.window_distortion` does) and prints a Markdown
table: each fixture's step source, the median step inside the window and outside it, their ratio, and how the
window was recorded (GPU activity only with detail steps after it, or the earlier CPU + CUDA window with
record_shapes and the hooks on in the profiled steps).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from figures import Figures, add_json_option
from gpudoctor.analysis import Run

BUNDLES = Path(__file__).resolve().parent.parent / "fixtures" / "bundles"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=Path, default=BUNDLES, help="a directory of run bundles")
    add_json_option(parser)
    args = parser.parse_args()
    figures = Figures("window_distortion", args.json,
                      ["fixture", "step source", "profiled step", "step outside", "distortion", "window"])
    print("| fixture | step source | profiled step | step outside | distortion | window |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratios: dict[str, list[float]] = {}
    for bundle in sorted(p for p in args.bundles.iterdir() if (p / "manifest.json").is_file()):
        run = Run.from_bundle(bundle)
        distortion = run.distortion
        settings = run.manifest.window
        light = settings is not None and settings.detail > 0
        kind = "GPU activity only, detail steps after" if light else "CPU + CUDA, shapes, hooks"
        if distortion.ratio is None:
            cells = [bundle.name, run.step_source, "—", "—", f"— ({distortion.reason})", kind]
        else:
            ratios.setdefault(kind, []).append(distortion.ratio)
            cells = [bundle.name, run.step_source, f"{distortion.profiled_s * 1e3:.2f} ms",
                     f"{distortion.unprofiled_s * 1e3:.2f} ms", f"{distortion.ratio:.2f}x", kind]
            figures.set(bundle.name, distortion.ratio)
        figures.row(*cells)
        print(f"| {' | '.join(map(str, cells))} |")
    for kind, values in ratios.items():
        within = sum(1 for r in values if r <= 1.10)
        print(f"\n{kind}: median {statistics.median(values):.2f}x over {len(values)} fixtures, "
              f"{within} at or under 1.10x")
        figures.set(f"median: {kind}", statistics.median(values))
    figures.write()


if __name__ == "__main__":
    main()
