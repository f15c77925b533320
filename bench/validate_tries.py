"""Tried speed-up beside the predicted one and the fixed twin's measured one, for every recorded pair whose fix
gpudoctor can apply at run time.

On the GPU machine, from the repository root (records DIR/tries.json, one pair after the other):

    PYTHONPATH=$PWD python3 bench/validate_tries.py --record DIR [--only bad1,bad2] [--plain-runs 2]

For each pair: `gpudoctor profile --try-fixes --out DIR/BAD fixtures/scripts/BAD.py` (the diagnosed run and a try
of each fix that can be applied at run time), then the bad script and its fixed twin alone, `--plain-runs` times
each, their last line the script's own steady-state step (median_step_s), as fixtures/record.py measures them.

Anywhere (prints the Markdown table from fixtures/tries.json, or from --from FILE):

    PYTHONPATH=$PWD python3 bench/validate_tries.py

Predicted: the pair's finding's saving as a speed-up, 1 / (1 - impact). Tried: the diagnosed run's step at its
pace over the try's (findings.json's `tried.speedup`). Twin: the bad script's plain step over the fixed twin's,
each the mean of their plain runs' medians. Targets: tried within ±10% of the twin, the predicted saving within ±30%
of the twin's (1 - 1/speed-up) or ±0.05, as bench/validate_impacts.py judges it. The bad script's own step differs
from run to run (a starved loader's more than the rest), and the tried speed-up is over the diagnosed run's: the table
also sets the tried step beside the twin's, the one a fix reaches either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))

from record import PROFILE_OPTIONS, SCRIPTS, machine_facts, run_group, script_result  # noqa: E402

from figures import Figures, add_json_option  # noqa: E402

RECORDED = ROOT / "fixtures" / "tries.json"
TRIED_BAND = 0.10
# The prediction is a saving, judged as bench/validate_impacts.py judges it: within ±30% of the twin's, or ±0.05.
PREDICTED_RELATIVE, PREDICTED_ABSOLUTE = 0.30, 0.05


@dataclass(frozen=True)
class TryPair:
    code: str  # the finding whose fix is tried
    bad: str
    fixed: str
    note: str = ""  # what the row shows besides the targets
    args: tuple[str, ...] = ()  # the scripts' arguments, in every run: enough steps for a steady state
    numerics: bool = False  # the fix changes the numerics: tried with --try-fixes=all
    twin_takes_workers: bool = False  # the twin runs with `--workers N`, N the workers the try gave the loader
    plain_figure: str = "median_step_s"  # the scripts' figure that is set beside the try's pace


TRY_PAIRS = (
    TryPair("GD101", "data_starvation_bad", "data_starvation_fixed"),
    TryPair("GD102", "data_starvation_workers_bad", "data_starvation_workers_fixed"),
    TryPair("GD102", "classifier_few_workers_bad", "classifier_few_workers_fixed",
            "the twin with as many workers as the try gave", args=("--steps", "100"), twin_takes_workers=True),
    # Its default 30 steps are its 16 workers' start-up: their first 32 batches, made while it starts, feed them.
    TryPair("GD503", "cpu_oversubscription_bad", "cpu_oversubscription_fixed", args=("--steps", "200")),
    TryPair("GD502", "fork_after_cuda_bad", "fork_after_cuda_fixed"),
    TryPair("GD201", "loader_pageable_bad", "loader_pageable_fixed"),
    TryPair("GD201", "tensor_dataset_bad", "tensor_dataset_fixed",
            "pinned loader batches; the twin's fix is a BatchSampler (GD101), not this one"),
    TryPair("GD201", "blocking_copy_bad", "blocking_copy_fixed"),
    TryPair("GD201", "inference_pageable_bad", "inference_pageable_fixed"),
    TryPair("GD311", "precision_fp32_bad", "precision_tf32_fixed", "TF32 (its bf16 twin is a what-if)", numerics=True),
    TryPair("GD312", "optimizer_foreach_bad", "optimizer_fused_fixed"),
    TryPair("GD315", "precision_tf32_gpt_bad", "precision_tf32_gpt_bf16_fixed", "bf16 autocast with TF32 on",
            numerics=True),
    TryPair("GD313", "elementwise_eager_bad", "elementwise_compiled_fixed", "compile time reported apart",
            numerics=True),
    TryPair("GD402", "allocator_retries_bad", "allocator_expandable_fixed"),
    TryPair("GD702", "startup_workers_bad", "startup_workers_fixed", "persistent workers, as many in the twin as the "
            "try gave; the steps after the first epoch, as the try's pace leaves the first start of its workers out",
            twin_takes_workers=True, plain_figure="steady_step_s"),
)


# -- recording, on the GPU machine ------------------------------------------------------------------------
def record_pair(pair: TryPair, out: Path, plain_runs: int, timeout_s: float) -> dict[str, Any]:
    bundle = out / pair.bad
    tier = "--try-fixes=all" if pair.numerics else "--try-fixes"
    profiled = run_group([sys.executable, "-m", "gpudoctor", "profile", "--out", str(bundle), tier,
                          *PROFILE_OPTIONS.get(pair.bad, []), str(SCRIPTS / f"{pair.bad}.py"), *pair.args], timeout_s)
    (out / f"{pair.bad}.try.log").write_text(profiled.stdout[-20000:] + "\n---\n" + profiled.stderr[-20000:])
    finding = _finding(bundle / "findings.json", pair.code)
    step_s = _step_s(bundle / "findings.json")
    tried = finding.get("tried") if finding else None
    twin_args = (*pair.args, *_workers_of(tried)) if pair.twin_takes_workers else pair.args
    plain = {name: [_plain_step(name, args, timeout_s, pair.plain_figure) for _ in range(plain_runs)]
             for name, args in ((pair.bad, pair.args), (pair.fixed, twin_args))}
    return {"code": pair.code, "bad": pair.bad, "fixed": pair.fixed, "status": profiled.status,
            "reason": profiled.reason, "step_s": step_s, "impact": finding.get("impact") if finding else None,
            "tried": tried, "plain": plain,
            "args": list(pair.args), "twin_args": list(twin_args),
            "recorded": dt.datetime.now(dt.timezone.utc).isoformat()}


def _workers_of(tried: dict[str, Any] | None) -> tuple[str, ...]:
    """`--workers N`, N the workers the try gave the loader (its `tried.changes`); () where it changed none."""
    changes = (tried or {}).get("changes") or []
    workers = [c["after"] for c in changes if c.get("setting") == "num_workers"]
    return ("--workers", str(workers[0])) if workers else ()


def _finding(path: Path, code: str) -> dict[str, Any] | None:
    try:
        findings = json.loads(path.read_text())["findings"]
    except (OSError, ValueError, KeyError):
        return None
    return next((f for f in findings if f["code"] == code), None)


def _step_s(path: Path) -> float | None:
    """The diagnosed run's step at its pace (findings.json's run.step_s)."""
    try:
        return json.loads(path.read_text())["run"]["step_s"]
    except (OSError, ValueError, KeyError):
        return None


def _plain_step(name: str, args: tuple[str, ...], timeout_s: float, figure: str) -> float | None:
    result = script_result(run_group([sys.executable, str(SCRIPTS / f"{name}.py"), *args], timeout_s).stdout)
    return result.get(figure) if result else None


def _gpu(machine: dict[str, Any]) -> str:
    """The machine's first GPU by name ("NVIDIA H100 80GB HBM3"), or its platform without one."""
    gpus = machine.get("gpus") or []
    return gpus[0].split(",")[0] if gpus else str(machine.get("platform"))


def record(out: Path, only: set[str], plain_runs: int, timeout_s: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rows, machine = [], machine_facts()
    for pair in TRY_PAIRS:
        if only and pair.bad not in only:
            continue
        row = {**record_pair(pair, out, plain_runs, timeout_s), "machine": _gpu(machine)}
        rows.append(row)
        print(f"{pair.bad}: {row['status']}, tried {json.dumps(row['tried'])}, plain {row['plain']}", flush=True)
        (out / "tries.json").write_text(json.dumps({"machines": [machine], "pairs": rows}, indent=1) + "\n")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


# -- the table ---------------------------------------------------------------------------------------------
def _within(value: float | None, truth: float | None, band: float) -> str:
    if value is None or truth is None:
        return "—"
    return "yes" if abs(value / truth - 1) <= band else "no"


def _saving_within(impact: float | None, twin: float | None) -> str:
    """Whether the predicted saving (a share of the step) is the twin's, 1 - 1/speed-up, within the target."""
    if impact is None or not twin:
        return "—"
    measured = 1 - 1 / twin
    close = abs(impact - measured) <= PREDICTED_ABSOLUTE or (
        abs(measured) > 0.01 and abs(impact / measured - 1) <= PREDICTED_RELATIVE)
    return "yes" if close else "no"


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def table_row(row: dict[str, Any], note: str) -> str:
    bad, fixed = ([v for v in row["plain"][name] if v] for name in (row["bad"], row["fixed"]))
    twin_step = statistics.fmean(fixed) if fixed else None
    twin = statistics.fmean(bad) / twin_step if bad and twin_step else None
    impact = row.get("impact")
    predicted = 1 / (1 - impact) if impact is not None and impact < 1 else None
    tried = row.get("tried") or {}
    speedup, tried_step = tried.get("speedup"), tried.get("step_s")
    said = "measured" if tried.get("status") == "measured" else f"{tried.get('status')}: {tried.get('reason')}"
    steps = f"{_ms(row.get('step_s'))} → {_ms(tried_step)} (twin {_ms(twin_step)})"
    return (f"| {row['bad']} → {row['fixed']} | {row.get('machine', '?')} | {row['code']} | {_times(predicted)} | "
            f"{_times(speedup)} | "
            f"{_times(twin)} | {_within(speedup, twin, TRIED_BAND)} | {steps} | "
            f"{_within(tried_step, twin_step, TRIED_BAND)} | {_saving_within(impact, twin)} | "
            f"{said}{'; ' + note if note else ''} |")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.1f} ms"


def table(document: dict[str, Any]) -> str:
    notes = {(p.bad, p.code): p.note for p in TRY_PAIRS}
    lines = [("| pair | machine | finding | predicted | tried | twin | tried within ±10% of twin | "
              "step: diagnosed → tried (twin's) | tried step within ±10% of twin's | "
              "predicted saving within ±30% or ±0.05 of twin's | try |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [table_row(row, notes.get((row["bad"], row["code"]), "")) for row in document["pairs"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, metavar="DIR", help="record the pairs into DIR/tries.json (GPU)")
    parser.add_argument("--only", default="",
                        help="comma-separated bad fixtures (default: every pair)")
    parser.add_argument("--plain-runs", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=240.0, help="time limit of one command")
    parser.add_argument("--from", dest="source", type=Path, default=RECORDED, help="a recorded tries.json")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.record:
        return record(args.record, {n for n in args.only.split(",") if n}, args.plain_runs, args.timeout_s)
    shown = table(json.loads(args.source.read_text()))
    print(shown)
    figures = Figures("validate_tries", args.json)
    figures.markdown(shown.splitlines())
    figures.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
