"""Analysis of a long run's many steps: `gpudoctor analyze` on a recorded bundle and on the same bundle grown
to hours of steps, side by side.

    PYTHONPATH=$PWD python3 bench/many_steps.py --steps 360000

`events.jsonl` holds one line per step for the whole run (the profiled windows' steps carry more). This
copies a recorded bundle (data_starvation_late: 700 steps, 4 windows of `--every 4s`, on an H200) and
appends steps after its last one, each a copy of one of its unprofiled steps with its time shifted and
its number following on, until the run has --steps steps. Then it runs `gpudoctor analyze` on the recorded
bundle and on the grown one, each in a fresh process, and prints the wall time and peak memory
(ru_maxrss) of each and what each added step cost.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from figures import Figures, add_json_option
from timing import cpu_model, measure  # after the path insert: each benchmark runs as a script of bench/

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "bundles" / "data_starvation_late"
EVENTS = "events.jsonl"


def grow(fixture: Path, steps: int, out: Path) -> dict[str, Any]:
    """A copy of `fixture` whose run has `steps` steps: the added ones follow its last step."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(fixture, out, ignore=shutil.ignore_patterns("findings.json", "report.html"))
    events = [json.loads(line) for line in (fixture / EVENTS).read_text().splitlines()]
    step_at = [i for i, e in enumerate(events) if e.get("kind") == "step"]
    last = events[step_at[-1]]
    template = next(e for e in reversed(events) if e.get("kind") == "step" and e.get("window") == "closed")
    period = (last["t1"] - events[step_at[0]]["t0"]) / len(step_at)
    added = []
    for n in range(1, max(0, steps - len(step_at)) + 1):
        shift = last["t1"] + (n - 1) * period - template["t0"]
        added.append({**template, "step": last["step"] + n, "t0": template["t0"] + shift,
                      "t1": template["t1"] + shift, "t": template["t"] + shift})
    after = step_at[-1] + 1
    events = events[:after] + added + events[after:]
    with open(out / EVENTS, "w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event, separators=(",", ":")) + "\n")
    return {"steps": len(step_at) + len(added), "events_mb": (out / EVENTS).stat().st_size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=360_000, help="steps in the grown run (10 h at 10 steps/s)")
    parser.add_argument("--fixture", type=Path, default=FIXTURE, help="the recorded bundle to grow")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpudoctor-bench-many-steps"))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (least wall time, largest peak)")
    add_json_option(parser)
    args = parser.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    recorded = args.workdir / "recorded"
    grown = args.workdir / f"grown-{args.steps}"
    sizes = {"recorded": grow(args.fixture, 0, recorded), "grown": grow(args.fixture, args.steps, grown)}
    rows = {}
    for name, path in (("recorded", recorded), ("grown", grown)):
        command = [sys.executable, "-m", "gpudoctor", "analyze", str(path), "--format", "json"]
        rows[name] = {**sizes[name], **measure(f"gpudoctor analyze ({name})", command,
                                                args.workdir / f"{name}.log", args.repeat)}
        if rows[name]["rc"] != 0:
            sys.exit(f"gpudoctor analyze failed on the {name} bundle (status {rows[name]['rc']})")

    print(f"machine: {cpu_model()}; python {sys.version.split()[0]}; fixture {args.fixture.name}")
    print(f"{'bundle':>9} | {'steps':>8} | {'events MB':>9} | {'wall s':>6} | {'peak MB':>7}")
    for name, row in rows.items():
        print(f"{name:>9} | {row['steps']:>8} | {row['events_mb']:>9.1f} | {row['wall_s']:>6.2f} | "
              f"{row['maxrss_kib'] / 1024:>7.0f}")
    small, big = rows["recorded"], rows["grown"]
    extra = big["steps"] - small["steps"]
    if extra > 0:
        per_step_kb = (big["maxrss_kib"] - small["maxrss_kib"]) * 1.024 / extra
        per_step_us = (big["wall_s"] - small["wall_s"]) / extra * 1e6
        print(f"each added step: {per_step_kb:.2f} kB of peak memory, {per_step_us:.1f} us of analysis; "
              f"wall time {big['wall_s'] / small['wall_s']:.2f}x, peak memory "
              f"{big['maxrss_kib'] / small['maxrss_kib']:.2f}x the recorded bundle's")
    figures = Figures("many_steps", args.json, ["bundle", "steps", "events MB", "wall s", "peak MB"])
    for name, row in rows.items():
        figures.row(name, row["steps"], f"{row['events_mb']:.1f}", f"{row['wall_s']:.2f}",
                    f"{row['maxrss_kib'] / 1024:.0f}")
        figures.set(name, row)
    figures.write()


if __name__ == "__main__":
    main()
