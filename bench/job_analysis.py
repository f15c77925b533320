"""A job of many ranks analysed again: in one process, rank after rank, against its ranks side by side in as many
processes as the cores (gpudoctor.job.parallel), and against its largest rank alone, on the same bundles.

    PYTHONPATH=$PWD python3 bench/job_analysis.py --ranks 8,32,64
    PYTHONPATH=$PWD python3 bench/job_analysis.py --ranks 8 --recorded fixtures/job_bundles/job_loader_straggler_bad

The job is made of a recorded job's rank bundles (fixtures/job_bundles/job_lightning_straggler_bad by default:
two ranks of a Lightning DDP run recorded on two H200s) replicated as rank-0 ... rank-(N-1) (bench/job_bundles.py).
Each command runs in its own process, in turn (one rank alone, then the job in one process, then side by side, and
again: a slow moment of the machine weighs on all of them):

  (a) `gpudoctor analyze RANK_DIR` of the job's largest rank alone: the least a job's analysis can take;
  (b) `gpudoctor analyze JOB_DIR` with GPUDOCTOR_ANALYSIS_PROCESSES=1: the ranks one after another;
  (c) `gpudoctor analyze JOB_DIR`, its processes as gpudoctor chooses them (one per core, up to the ranks).

Printed for each: the least wall time over --repeat runs, the peak memory of its largest process (ru_maxrss) and
the peak memory of all its processes together (their RSS summed, sampled every 20 ms), and the ratios: (b)/(c),
the speed-up, and (c)/(a), how many largest ranks' time the job takes; on C cores, N ranks take at least N/C of
them, so (c)/(a) divided by N/C says how near that floor it came.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from figures import ROOT, Figures, add_json_option
from gpudoctor.job.parallel import usable_cores
from job_bundles import build_job

RECORDED = ROOT / "fixtures" / "job_bundles" / "job_lightning_straggler_bad"
SAMPLE_S = 0.02


def run_sampled(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run `command`: its wall time, the largest RSS of any of its processes, and the most all of them held at once."""
    started = time.perf_counter()
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - read once the command has ended (a pipe would fill and block it)
    process = psutil.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
    largest = together = 0
    while process.poll() is None:
        try:
            tree = [process, *process.children(recursive=True)]
            sizes = []
            for member in tree:
                with contextlib.suppress(psutil.Error):  # it ended meanwhile
                    sizes.append(member.memory_info().rss)
            largest, together = max(largest, *sizes, 0), max(together, sum(sizes))
        except psutil.Error:
            pass
        time.sleep(SAMPLE_S)
    wall = time.perf_counter() - started
    errors.seek(0)
    stderr = errors.read().decode(errors="replace")
    errors.close()
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} exited with {process.returncode}:\n{stderr[-2000:]}")
    return {"wall_s": wall, "largest_mib": largest / 2**20, "together_mib": together / 2**20}


def measure(commands: list[tuple[str, list[str], dict[str, str]]], repeat: int) -> dict[str, dict[str, Any]]:
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in commands}
    for i in range(repeat):
        for label, command, env in commands:
            print(f"running {label} ({i + 1} of {repeat}) ...", file=sys.stderr, flush=True)
            runs[label].append(run_sampled(command, env))
    return {label: {"wall_s": min(r["wall_s"] for r in rs), "largest_mib": max(r["largest_mib"] for r in rs),
                    "together_mib": max(r["together_mib"] for r in rs)} for label, rs in runs.items()}


def largest_rank(job: Path) -> Path:
    ranks = sorted(job.glob("rank-*"), key=lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()))
    return ranks[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="8,32,64", help="comma-separated job sizes")
    parser.add_argument("--recorded", type=Path, default=RECORDED, help="the recorded job whose ranks are replicated")
    parser.add_argument("--repeat", type=int, default=2)
    add_json_option(parser)
    args = parser.parse_args()
    cores = usable_cores()
    figures = Figures("job_analysis", args.json, columns=[
        "ranks", "(a) largest rank alone", "(b) one process", "(c) side by side", "speed-up (b)/(c)",
        "(c)/(a)", "floor N/C", "memory (b)", "memory (c), all processes"])
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    analyze = [sys.executable, "-m", "gpudoctor", "analyze", "--format", "json"]
    print(f"{cores} cores; ranks replicated from {args.recorded}")
    print(f"{'ranks':>5}  {'(a) rank':>9}  {'(b) 1 proc':>10}  {'(c) side by side':>16}  {'(b)/(c)':>7}  "
          f"{'(c)/(a)':>7}  {'N/C':>5}  {'mem (b)':>8}  {'mem (c) all':>11}")
    for ranks in [int(n) for n in args.ranks.split(",") if n.strip()]:
        with tempfile.TemporaryDirectory(prefix=f"job{ranks}-") as folder:
            job = build_job(args.recorded, ranks, Path(folder) / "job")
            rank = largest_rank(job)
            found = measure([("(a)", [*analyze, str(rank)], base),
                             ("(b)", [*analyze, str(job)], {**base, "GPUDOCTOR_ANALYSIS_PROCESSES": "1"}),
                             ("(c)", [*analyze, str(job)], base)], args.repeat)
        a, b, c = found["(a)"], found["(b)"], found["(c)"]
        floor = ranks / min(cores, ranks)
        cells = [ranks, f"{a['wall_s']:.2f} s", f"{b['wall_s']:.2f} s", f"{c['wall_s']:.2f} s",
                 f"{b['wall_s'] / c['wall_s']:.2f}x", f"{c['wall_s'] / a['wall_s']:.1f}", f"{floor:.0f}",
                 f"{b['largest_mib']:.0f} MiB", f"{c['together_mib']:.0f} MiB"]
        figures.row(*cells)
        figures.set(f"ranks_{ranks}", {"a": a, "b": b, "c": c, "cores": cores})
        print(f"{cells[0]:>5}  {cells[1]:>9}  {cells[2]:>10}  {cells[3]:>16}  {cells[4]:>7}  {cells[5]:>7}  "
              f"{cells[6]:>5}  {cells[7]:>8}  {cells[8]:>11}", flush=True)
    figures.write()


if __name__ == "__main__":
    main()
