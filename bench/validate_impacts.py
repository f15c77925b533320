"""Predicted gain vs measured speed-up, for every bad/fixed fixture pair recorded on a GPU.

    PYTHONPATH=$PWD python3 bench/validate_impacts.py

Predicted: the impact of the pair's rule on the bad fixture (the sum over its findings, at most 1): the
share of step time gpudoctor expects the fix to recover. Measured: 1 - t_fixed / t_bad, from each
script's own timing of its steady-state steps, run plainly (without gpudoctor) on the same machine
(fixtures/measurements.json). For small_batch the time per sample is compared, since the fixed twin
makes its steps larger on purpose. Prints a Markdown table; docs/rules.md holds its output.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpudoctor.engine import run_rules
from gpudoctor.loading import builtin_rules
from gpudoctor.testing import load_fixture

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {
    "data_starvation": "GD101", "data_starvation_workers": "GD102", "data_starvation_cpu_bound": "GD103",
    "blocking_copy": "GD201", "blocking_copy_d2h": "GD203", "sync_point": "GD211", "small_batch": "GD301",
    "gil_contention": "GD501", "cpu_oversubscription": "GD503", "cpu_contention": "GD504",
}
PER_SAMPLE = {"small_batch"}
TOLERANCE = 0.30  # the target: predicted within ±30% of measured, relative


def measured_time(fixtures: dict, name: str, per_sample: bool) -> float:
    result = fixtures[name]["plain"]["result"]
    return result["median_sample_s" if per_sample else "median_step_s"]


def main() -> None:
    fixtures = json.loads((ROOT / "fixtures" / "measurements.json").read_text())["fixtures"]
    rules = {r.code: r for r in builtin_rules()}
    print("| pair | rule | predicted gain | measured gain | relative error | bad | fixed | within ±30% | GPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for pair, code in PAIRS.items():
        per_sample = pair in PER_SAMPLE
        bad, fixed = (measured_time(fixtures, f"{pair}_{twin}", per_sample) for twin in ("bad", "fixed"))
        measured = 1 - fixed / bad
        findings = run_rules(load_fixture(f"{pair}_bad"), [rules[code]]).findings
        predicted = min(1.0, sum(f["impact"] or 0.0 for f in findings))
        error = (predicted - measured) / measured if abs(measured) > 0.01 else None
        close = "yes" if error is not None and abs(error) <= TOLERANCE else "no" if error is not None else "n/a (no gain)"
        unit = "per sample" if per_sample else "per step"
        print(f"| {pair} | {code} | {predicted:.0%} | {measured:.0%} | {'—' if error is None else f'{error:+.0%}'} "
              f"| {bad * 1e3:.2f} ms | {fixed * 1e3:.2f} ms ({unit}) | {close} "
              f"| {fixtures[f'{pair}_bad']['machine'].split(',')[0]} |")


if __name__ == "__main__":
    main()
