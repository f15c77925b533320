"""A job's tried fix beside the same setting applied by hand: the straggler jobs of fixtures/jobs/ on two GPUs.

On a machine with two GPUs, from the repository root:

    PYTHONPATH=$PWD python3 bench/validate_job_tries.py --out DIR [--only lightning,torchrun,spawn] [--plain-runs 2]

For each job (a rank that loads its batches without workers, the others with them): `gpudoctor profile --try-fixes`
of the job as its launcher starts it (fixtures/record_jobs.py's commands), which diagnoses the straggler (GD601) and
tries its slow rank's loader fix (GD101) on every rank; then, alternating, the job plainly as it is and its twin with
the try's settings by hand: each rank's loader as the try's own bundle read it back (`tried.changes`): the slow
rank's workers by `--slow-workers N`, and `--workers M` where the try changed the other ranks' too, `--plain-runs`
times each. Tried: the diagnosed run's step over the try's (findings.json's `tried.speedup`, the straggler's);
twin: the plain job's step over the twin's, each the mean of its runs (a job's step is its slowest rank's, as the
ranks time themselves). Target: tried within ±10% of the twin. The table also says what the try changed on each
rank, and where the try is not the predicted fix, what each figure assumes.

Writes DIR/job_tries.json after each job, and the run directories (their reports) in DIR/<job>/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))

from record_jobs import CUDA_WINDOW, job_command, job_step_s, rank_results, run_job_group, said  # noqa: E402

from figures import Figures, add_json_option  # noqa: E402

JOBS = {"lightning": "job_lightning_straggler_bad", "torchrun": "job_loader_straggler_bad",
        "spawn": "job_spawn_straggler_bad"}
BAND = 0.10


def _straggler(run_dir: Path) -> dict[str, Any] | None:
    """The merged findings' GD601 (the straggler, which carries its slow rank's try), else the first GD101."""
    try:
        findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    except (OSError, ValueError, KeyError):
        return None
    return next((f for code in ("GD601", "GD101") for f in findings if f.get("code") == code and f.get("tried")), None)


def _pace(run_dir: Path) -> float | None:
    try:
        return json.loads((run_dir / "findings.json").read_text())["run"]["step_s"]
    except (OSError, ValueError, KeyError):
        return None


def _twin_args(finding: dict[str, Any] | None) -> list[str] | None:
    """The script's arguments that give each rank the loader workers the try ran it with (tried.changes, as the
    try's bundle read them back): the slow rank's, which had none, by --slow-workers; the others' by --workers,
    where the try changed them too. None where the try changed no rank's workers."""
    changes = ((finding or {}).get("tried") or {}).get("changes") or []
    workers = [c for c in changes if c.get("setting") == "num_workers" and isinstance(c.get("after"), int)]
    slow = [c["after"] for c in workers if c.get("before") == 0]
    others = [c["after"] for c in workers if c.get("before") != 0]
    if not slow:
        return None
    return ["--slow-workers", str(max(slow)), *(["--workers", str(max(others))] if others else [])]


def _plain(name: str, nproc: int, args: list[str], timeout_s: float) -> tuple[float | None, str]:
    cmd, env = job_command(name, nproc, args)
    result = run_job_group(cmd, timeout_s, env)
    return job_step_s(rank_results(result.stdout)), said(cmd, env)


def validate(launch: str, out: Path, nproc: int, plain_runs: int, timeout_s: float,
             keep: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The job's try, then its plain and twin runs; `keep` is given the row as it grows, after each run, so that a
    recording cut short keeps what it measured."""
    name = JOBS[launch]
    run_dir = out / launch
    cmd, env = job_command(name, nproc, [], ["--out", str(run_dir), "--try-fixes", *CUDA_WINDOW])
    profiled = run_job_group(cmd, timeout_s, env)
    (out / f"{launch}.log").write_text(said(cmd, env) + "\n" + profiled.stdout[-20000:] + "\n---\n"
                                       + profiled.stderr[-20000:])
    finding = _straggler(run_dir)
    twin_args = _twin_args(finding)
    row: dict[str, Any] = {"launch": launch, "job": name, "status": profiled.status, "reason": profiled.reason,
                           "step_s": _pace(run_dir), "finding": finding and finding["code"],
                           "impact": finding and finding.get("impact"), "tried": finding and finding.get("tried"),
                           "twin_args": twin_args, "as_it_is": [], "twin": []}
    keep(row)
    if twin_args is None:
        return row
    for _ in range(plain_runs):  # alternating, so that a drift of the host's load reaches both alike
        row["as_it_is"].append(_plain(name, nproc, [], timeout_s)[0])
        keep(row)
        step, row["twin_command"] = _plain(name, nproc, twin_args, timeout_s)
        row["twin"].append(step)
        keep(row)
    return row


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v]
    return statistics.fmean(kept) if kept else None


def table_row(row: dict[str, Any]) -> str:
    tried = row.get("tried") or {}
    bad, twin_step = _mean(row["as_it_is"]), _mean(row["twin"])
    twin = bad / twin_step if bad and twin_step else None
    speedup = tried.get("speedup") if tried.get("status") == "measured" else None
    impact = row.get("impact")
    predicted = 1 / (1 - impact) if impact is not None and impact < 1 else None
    within = "—" if speedup is None or twin is None else "yes" if abs(speedup / twin - 1) <= BAND else "no"
    said_ = "measured" if speedup is not None else f"{tried.get('status')}: {tried.get('reason')}"
    return (f"| {row['launch']} | {row.get('finding') or '—'} | {_x(predicted)} | {_x(speedup)} | {_x(twin)} | "
            f"{within} | {' '.join(row.get('twin_args') or []) or '—'} | {tried.get('applied') or '—'} | "
            f"{tried.get('not_as_predicted') or '—'} | {said_} |")


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [("| job | finding | predicted | tried | twin (same setting by hand) | tried within ±10% | "
              "twin's arguments | applied | not the predicted fix | try |"), "| --- " * 10 + "|"]
    return "\n".join(lines + [table_row(row) for row in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default=",".join(JOBS), help=f"comma-separated launches, of {', '.join(JOBS)}")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--plain-runs", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=240.0, help="time limit of one run")
    add_json_option(parser)
    args = parser.parse_args(argv)
    launches = [n for n in args.only.split(",") if n]
    unknown = [n for n in launches if n not in JOBS]
    if unknown:
        parser.error(f"unknown launch(es) {', '.join(unknown)}; known: {', '.join(JOBS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    def keep(row: dict[str, Any]) -> None:
        (args.out / "job_tries.json").write_text(json.dumps([*rows, row], indent=1) + "\n")

    for launch in launches:
        rows.append(validate(launch, args.out, args.nproc, args.plain_runs, args.timeout_s, keep))
        (args.out / "job_tries.json").write_text(json.dumps(rows, indent=1) + "\n")
        print(table_row(rows[-1]), flush=True)
    shown = table(rows)
    print(shown)
    figures = Figures("validate_job_tries", args.json)
    figures.markdown(shown.splitlines())
    figures.write()
    return 0 if all(r["tried"] and r["tried"].get("status") == "measured" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
