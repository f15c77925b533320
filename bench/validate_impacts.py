"""Predicted gain vs measured speed-up, for every bad/fixed fixture pair recorded on a GPU.

    PYTHONPATH=$PWD python3 bench/validate_impacts.py

Predicted: the impact of the pair's rule on the bad fixture (the sum over its findings, at most 1): the
share of step time gpudoctor expects the fix to recover. Measured: 1 - t_fixed / t_bad, from each
script's own timing of its steady-state steps, run plainly (without gpudoctor) on the same machine
(fixtures/measurements.json). For GD301 the time per sample is compared, since the fixed twin
makes its steps larger on purpose. Prints a Markdown table; docs/rules.md holds its output.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpudoctor.engine import builtin_rules, run_rules
from gpudoctor.testing import load_fixture

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {  # rule: (bad fixture, fixed fixture)
    "GD101": ("data_starvation_bad", "data_starvation_fixed"),
    "GD102": ("data_starvation_workers_bad", "data_starvation_workers_fixed"),
    "GD103": ("data_starvation_cpu_bound_bad", "data_starvation_cpu_bound_fixed"),
    "GD201": ("blocking_copy_bad", "blocking_copy_fixed"),
    "GD203": ("blocking_copy_d2h_bad", "blocking_copy_d2h_fixed"),
    "GD204": ("blocking_copy_fixed", "blocking_copy_prefetch"),
    "GD211": ("sync_point_bad", "sync_point_fixed"),
    "GD301": ("small_batch_bad", "small_batch_fixed"),
    "GD501": ("gil_contention_bad", "gil_contention_fixed"),
    "GD503": ("cpu_oversubscription_bad", "cpu_oversubscription_fixed"),
    "GD504": ("cpu_contention_bad", "cpu_contention_fixed"),
}
PER_SAMPLE = {"GD301"}
TOLERANCE = 0.30  # the target: predicted within ±30% of measured, relative


def measured_time(fixtures: dict, name: str, per_sample: bool) -> float:
    result = fixtures[name]["plain"]["result"]
    return result["median_sample_s" if per_sample else "median_step_s"]


def main() -> None:
    fixtures = json.loads((ROOT / "fixtures" / "measurements.json").read_text())["fixtures"]
    rules = {r.code: r for r in builtin_rules()}
    print("| bad → fixed | rule | predicted gain | measured gain | relative error | bad | fixed | within ±30% | GPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for code, (bad_name, fixed_name) in PAIRS.items():
        per_sample = code in PER_SAMPLE
        bad, fixed = (measured_time(fixtures, name, per_sample) for name in (bad_name, fixed_name))
        measured = 1 - fixed / bad
        findings = run_rules(load_fixture(bad_name), [rules[code]]).findings
        predicted = min(1.0, sum(f.impact or 0.0 for f in findings))
        error = (predicted - measured) / measured if abs(measured) > 0.01 else None
        close = "n/a (no gain)" if error is None else "yes" if abs(error) <= TOLERANCE else "no"
        unit = "per sample" if per_sample else "per step"
        error_text = "—" if error is None else f"{error:+.0%}"
        print(f"| {bad_name} → {fixed_name} | {code} | {predicted:.0%} | {measured:.0%} | {error_text} "
              f"| {bad * 1e3:.2f} ms | {fixed * 1e3:.2f} ms ({unit}) | {close} "
              f"| {fixtures[bad_name]['machine'].split(',')[0]} |")


if __name__ == "__main__":
    main()
