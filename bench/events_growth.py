"""How fast a rank's events.jsonl grows over a long run: per step and per hour, with the step spans and without.

    PYTHONPATH=$PWD python3 bench/events_growth.py [--seconds 60] [--step-ms 2] [--every 20s]

Runs `gpudoctor profile --every EVERY` for real on a small CPU training loop (bench/workload_fast_steps.py: a
linear model, one optimizer step every --step-ms) for --seconds, reads its events.jsonl afterwards and prints:
the steps; the bytes of the first RAW_STEPS steps, written one by one; the bytes of everything after them, and
per step (the losses apart: one record at the end, of at most collect.losses.MAX_LOSSES values); the bytes an
hour that rate makes, against what the same steps would take written one by one (the mean bytes of a plain
step event in the same file, times the steps). A `--every` window's own steps are written whole and counted in
the growth: the figure is a rank's events per hour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from figures import Figures, add_json_option  # noqa: E402 - after the path inserts: runs as a script of bench/
from gpudoctor.bundle.step_spans import RAW_STEPS  # noqa: E402

WORKLOAD = Path(__file__).parent / "workload_fast_steps.py"


def _profile(seconds: float, step_ms: float, every: str, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "gpudoctor", "profile", "--out", str(out), "--every", every,
               str(WORKLOAD), "--seconds", str(seconds), "--step-ms", str(step_ms)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=seconds + 300)
    if done.returncode != 0:
        raise SystemExit(f"gpudoctor profile failed ({done.returncode}):\n{done.stderr}")


def measure(events: Path) -> dict[str, float]:
    """The file's steps, and its bytes up to the end of step RAW_STEPS - 1 and after it."""
    lines = events.read_bytes().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    steps, split, t0, t1 = 0, len(lines), None, 0.0
    plain_bytes = plain_count = 0
    for n, (line, record) in enumerate(zip(lines, records, strict=True)):
        kind = record.get("kind")
        if kind == "step":
            steps, t1 = max(steps, record["step"] + 1), max(t1, record["t1"])
            if record["step"] == RAW_STEPS - 1:
                split, t0 = n + 1, record["t1"]
            if record.get("window") in ("waiting", "closed") and "phases" not in record:
                plain_bytes, plain_count = plain_bytes + len(line), plain_count + 1
        elif kind == "step_span":
            steps, t1 = max(steps, record["last_step"] + 1), max(t1, record["t1"])
    # The losses, read once at the end, are one record of at most collect.losses.MAX_LOSSES values: not growth.
    losses = sum(len(line) for line, record in zip(lines, records, strict=True) if record.get("kind") == "losses")
    after = [line for line, record in zip(lines[split:], records[split:], strict=True)
             if record.get("kind") != "losses"]
    raw_bytes = sum(map(len, lines[:split]))
    return {"steps": steps, "raw_bytes": raw_bytes, "after_bytes": sum(map(len, after)), "losses_bytes": losses,
            "after_steps": max(0, steps - RAW_STEPS), "after_s": t1 - t0 if t0 is not None else 0.0,
            "plain_step_bytes": plain_bytes / plain_count if plain_count else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--every", default="20s")
    add_json_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpudoctor-events-growth-") as scratch:
        out = Path(scratch) / "run"
        _profile(args.seconds, args.step_ms, args.every, out)
        m = measure(out / "events.jsonl")
    per_s = m["after_bytes"] / m["after_s"] if m["after_s"] else 0.0
    rate = m["after_steps"] / m["after_s"] if m["after_s"] else 0.0
    one_by_one_per_h = m["plain_step_bytes"] * rate * 3600
    print(f"run: {m['steps']} steps in about {args.seconds:.0f} s, --every {args.every}; "
          f"{rate:.0f} steps/s after the first {RAW_STEPS}")
    print(f"first {RAW_STEPS} steps, one by one: {m['raw_bytes'] / 1e3:.1f} kB; "
          f"the losses, once at the end: {m['losses_bytes'] / 1e3:.1f} kB")
    print(f"after them: {m['after_bytes'] / 1e3:.1f} kB for {m['after_steps']} steps over {m['after_s']:.1f} s "
          f"({m['after_bytes'] / max(1, m['after_steps']):.1f} B a step, windows included)")
    print(f"per rank per hour: {per_s * 3600 / 1e6:.2f} MB with spans; one by one "
          f"({m['plain_step_bytes']:.0f} B a plain step): {one_by_one_per_h / 1e6:.1f} MB, "
          f"{one_by_one_per_h / max(1.0, per_s * 3600):.0f}x more")
    figures = Figures("events_growth", args.json)
    for key, value in m.items():
        figures.set(key, value)
    figures.set("mb_per_rank_hour", per_s * 3600 / 1e6)
    figures.set("one_by_one_mb_per_rank_hour", one_by_one_per_h / 1e6)
    figures.write()


if __name__ == "__main__":
    main()
