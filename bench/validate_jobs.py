"""Predicted saving vs measured speed-up for the job rules, on two-rank gloo jobs run here on the CPU, or on the
two-GPU jobs recorded in fixtures/job_bundles/ (--recorded: their bundles analysed now, their plain runs as
fixtures/record_jobs.py measured them).

    PYTHONPATH=$PWD python3 bench/validate_jobs.py [--runs 2]
    PYTHONPATH=$PWD python3 bench/validate_jobs.py --recorded

For each pair (a job with the pathology, and its fixed twin): measured is 1 - t_fixed / t_bad, each time the
mean over `--runs` plain torchrun runs (without gpudoctor, alternating bad and fixed) of rank 0's own timing of
its steps; predicted is the summed impact of the pair's rule in the merged findings of one `gpudoctor profile`
of the bad job. Target, as for the GPU fixtures: within ±30% of the measured gain, relative, or ±0.05 absolute.
Prints a Markdown table; docs/rules.md holds its output.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from figures import Figures, add_json_option

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
WINDOW = ["--wait-steps", "2", "--warmup-steps", "1", "--active-steps", "8", "--detail-steps", "2"]
RELATIVE, ABSOLUTE = 0.30, 0.05


@dataclass(frozen=True)
class JobPair:
    name: str
    rule: str
    script: str
    bad: tuple[str, ...]
    fixed: tuple[str, ...]


PAIRS = (
    JobPair("loader straggler (rank 1 loads in its main process) → two workers on every rank", "GD601",
            "ddp_loader_straggler.py", ("--slow-ranks", "1"), ("--slow-ranks", "")),
    JobPair("accumulation, 4 micro-batches, all-reduced each → under no_sync()", "GD602",
            "ddp_accumulate.py", ("--batch-size", "4"), ("--batch-size", "4", "--no-sync")),
)


def plain_ms(pair: JobPair, args: tuple[str, ...]) -> float:
    """Rank 0's own time per step in one plain run. Its exit status is not checked: torch.distributed's own
    threads can abort a rank at interpreter shutdown, after the timing was printed (about 1 run in 40 here)."""
    done = subprocess.run([*TORCHRUN, str(SCRIPTS / pair.script), *args], check=False, capture_output=True,
                          text=True, timeout=300)
    found = re.search(r"rank 0 .*?([0-9.]+) ms per (optimizer )?step", done.stdout)
    if found is None:
        raise RuntimeError(f"{pair.script} printed no timing:\n{done.stdout}\n{done.stderr[-2000:]}")
    return float(found.group(1))


def predicted(pair: JobPair) -> float:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([*TORCHRUN, "-m", "gpudoctor", "profile", "--out", out, *WINDOW, "--format", "json",
                        str(SCRIPTS / pair.script), *pair.bad], capture_output=True, check=True, timeout=300)
        subprocess.run([sys.executable, "-m", "gpudoctor", "analyze", out, "--format", "json"], capture_output=True,
                       check=True, timeout=300)
        findings = json.loads((Path(out) / "findings.json").read_text())["findings"]
    return min(1.0, sum(f["impact"] or 0.0 for f in findings if f["code"] == pair.rule))


RECORDED = ROOT / "fixtures" / "job_bundles"
# (pathological job, its fixed twin, the rule, how the ranks were launched)
RECORDED_PAIRS = (
    ("job_loader_straggler_bad", "job_loader_straggler_fixed", "GD601", "torchrun, gpudoctor outside"),
    ("job_loader_straggler_inner_bad", "job_loader_straggler_fixed", "GD601", "torchrun, gpudoctor inside"),
    ("job_spawn_straggler_bad", "job_spawn_straggler_fixed", "GD601", "torch.multiprocessing.spawn"),
    ("job_lightning_straggler_bad", "job_lightning_straggler_fixed", "GD601", "Lightning's launcher"),
    ("job_accumulate_bad", "job_accumulate_fixed", "GD602", "torchrun, gpudoctor outside"),
)


def recorded_prediction(name: str, rule: str) -> tuple[float, str]:
    """The rule's summed impact on a recorded job, analysed from a copy; and the merged verdict."""
    import shutil

    with tempfile.TemporaryDirectory() as out:
        shutil.copytree(RECORDED / name, Path(out) / name)
        subprocess.run([sys.executable, "-m", "gpudoctor", "analyze", str(Path(out) / name), "--format", "json"],
                       capture_output=True, check=True, timeout=300)
        merged = json.loads((Path(out) / name / "findings.json").read_text())
    impact = min(1.0, sum(f["impact"] or 0.0 for f in merged["findings"] if f["code"] == rule))
    return impact, merged["summary"]["verdict"]


def print_recorded(say: Callable[[str], None]) -> None:
    measured = json.loads((RECORDED / "measurements.json").read_text())
    jobs, gpus = measured["jobs"], ", ".join(measured["machine"].get("gpus") or [])
    print(f"recorded on {gpus}")
    say("| job → fixed twin | launched by | rule | predicted saving | measured gain | bad, each run "
        "| fixed, each run | within ±30% or ±0.05 |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for bad, fixed, rule, launch in RECORDED_PAIRS:
        bad_s, fixed_s = jobs[bad]["plain"]["step_s"], jobs[fixed]["plain"]["step_s"]
        gain = 1 - statistics.fmean(fixed_s) / statistics.fmean(bad_s)
        guess, _ = recorded_prediction(bad, rule)
        within = abs(guess - gain) <= ABSOLUTE or (gain > 0 and abs(guess - gain) / gain <= RELATIVE)
        say(f"| {bad} → {fixed} | {launch} | {rule} | {guess:.1%} | {gain:.1%} | "
            f"{' / '.join(f'{t * 1e3:.1f} ms' for t in bad_s)} | {' / '.join(f'{t * 1e3:.1f} ms' for t in fixed_s)} "
            f"| {'yes' if within else 'no'} |")
    for fixed in sorted({pair[1] for pair in RECORDED_PAIRS}):
        _, verdict = recorded_prediction(fixed, "GD601")
        print(f"{fixed}: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--recorded", action="store_true", help="the two-GPU jobs of fixtures/job_bundles/")
    add_json_option(parser)
    args = parser.parse_args()
    figures = Figures("validate_jobs", args.json)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line)
        lines.append(line)

    if args.recorded:
        print_recorded(say)
    else:
        measure_here(args.runs, say)
    figures.markdown(lines)
    figures.write()


def measure_here(runs: int, say: Callable[[str], None]) -> None:
    """Each pair run plainly here, `runs` times, beside what its rule predicts."""
    say("| job → fixed twin | rule | predicted saving | measured gain | bad, each run | fixed, each run "
        "| within ±30% or ±0.05 |")
    say("| --- | --- | --- | --- | --- | --- | --- |")
    for pair in PAIRS:
        bad, fixed = [], []
        for _ in range(runs):
            bad.append(plain_ms(pair, pair.bad))
            fixed.append(plain_ms(pair, pair.fixed))
        gain = 1 - statistics.fmean(fixed) / statistics.fmean(bad)
        guess = predicted(pair)
        within = abs(guess - gain) <= ABSOLUTE or (gain > 0 and abs(guess - gain) / gain <= RELATIVE)
        say(f"| {pair.name} | {pair.rule} | {guess:.0%} | {gain:.0%} | {' / '.join(f'{t:.1f} ms' for t in bad)} | "
            f"{' / '.join(f'{t:.1f} ms' for t in fixed)} | {'yes' if within else 'no'} |")


if __name__ == "__main__":
    main()
