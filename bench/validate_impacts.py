"""Predicted saving vs measured speed-up, for every bad/fixed fixture pair recorded on a GPU.

    PYTHONPATH=$PWD python3 bench/validate_impacts.py

Predicted: the summed impact of the pair's rules on the bad fixture (at most 1), the share of step time gpudoctor
expects the fix to save; for a pair compared per sample (the twin grows the batch), the saving per sample of a
larger batch that GD301's evidence gives. Headline: what the verdict says the fixes of every problem save together;
judged against the twin where the twin applies all of them (`FixturePair.together`). Measured: 1 - t_fixed / t_bad,
each time the mean of the script's own timings of its steady-state steps over its plain runs (without gpudoctor) on
the recording machine (fixtures/measurements.json, one to six runs each, and those of earlier recordings of the same
script with as many steps, all shown); for a cost paid once (`FixturePair.startup_phase`), the seconds that
start-up phase took in each fixture's recorded bundle. The pairs, and which compare time per sample, are in
gpudoctor/testing/pairs.py. Target: within ±30% of the measured gain, relative, or ±0.05 absolute. Tried: the saving
gpudoctor measured when it applied the fix to the bad script itself (`--try-fixes`, recorded by
bench/validate_tries.py in fixtures/tries.json), or why it was not tried. Prints a Markdown table; docs/rules.md
holds its output.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from figures import Figures, add_json_option
from gpudoctor.engine import builtin_rules, run_rules
from gpudoctor.report.verdict import saving_together
from gpudoctor.testing import load_fixture
from gpudoctor.testing.pairs import PAIRS, FixturePair
from rules.kernels import SAMPLE_SAVING

ROOT = Path(__file__).resolve().parent.parent
RELATIVE, ABSOLUTE = 0.30, 0.05


def measured_times(fixtures: dict[str, Any], name: str, per_sample: bool) -> list[float]:
    """The step (or sample) time of each plain run of one fixture script: those of its recording, then those of
    earlier recordings of the same script with as many steps (`earlier_repeats`), oldest first."""
    plain = fixtures[name]["plain"]
    key = "median_sample_s" if per_sample else "median_step_s"
    runs = [r[key] for r in plain.get("repeats", ()) if key in r] or [plain["result"][key]]
    steps = plain.get("repeat_steps") or plain["result"].get("steps")
    earlier = plain.get("earlier_repeats") or []
    for recording in [earlier] if isinstance(earlier, dict) else earlier:
        if steps is not None and recording.get("steps") == steps:
            runs += [r[key] for r in recording.get("runs", ()) if key in r]
    return runs


def predicted_gain(pair: FixturePair, rules: dict[str, Any]) -> tuple[float, str]:
    """The pair's rules' impacts among all the rules' findings, as the report gives them (a share that another
    rule's finding on the same line counts is not counted again: engine.runner.one_claim_per_share); per sample,
    GD301's saving per sample of a larger batch. With what the figure is."""
    findings = [f for f in run_rules(load_fixture(pair.bad), list(rules.values())).findings if f.code in pair.rules]
    if pair.per_sample:
        savings = [(item.value / 100, item.name) for f in findings for item in f.evidence
                   if item.name.startswith(SAMPLE_SAVING)]
        return savings[0] if savings else (0.0, "no saving per sample")
    if pair.share_of is not None:  # a cost of the job's time, not of each step, given as evidence
        shares = [item.value for f in findings for item in f.evidence if item.name == pair.share_of]
        if not shares or not isinstance(shares[0], int | float):
            return 0.0, f"no {pair.share_of}"
        return shares[0] / 100, pair.share_of
    if pair.what_if is not None:  # the step after another fix, given as evidence, against the run's step
        steps = [item.value for f in findings for item in f.evidence if item.name == pair.what_if]
        step_s = load_fixture(pair.bad).pace.seconds
        if not steps or not isinstance(steps[0], int | float) or not step_s:
            return 0.0, f"no {pair.what_if}"
        return max(0.0, 1 - steps[0] / 1e3 / step_s), pair.what_if
    return min(1.0, sum(f.impact or 0.0 for f in findings)), "impact"


def headline_gain(pair: FixturePair, rules: dict[str, Any]) -> float:
    """What the verdict says the fixes of every problem save together (report.verdict.saving_together)."""
    return saving_together(run_rules(load_fixture(pair.bad), list(rules.values())).findings)


def within(predicted: float, measured: float) -> bool:
    error = (predicted - measured) / measured if abs(measured) > 0.01 else None
    return abs(predicted - measured) <= ABSOLUTE or (error is not None and abs(error) <= RELATIVE)


def tried_gain(pair: FixturePair, tries: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The gain the pair's fix measured when gpudoctor applied it to the bad script (bench/validate_tries.py,
    fixtures/tries.json), as a saving of the step; why not, where it was not tried."""
    if pair.per_sample:
        return "—"
    row = next((tries[(pair.bad, code)] for code in pair.rules if (pair.bad, code) in tries), None)
    tried = (row or {}).get("tried") or {}
    if tried.get("status") == "measured":
        return f"{1 - 1 / tried['speedup']:.0%}".replace("-0%", "0%")  # a loss under half a percent
    return str(tried.get("status", "—")).replace("_", " ")


def startup_phase_times(name: str, phase: str) -> list[float]:
    """The seconds one start-up phase took in a fixture's recorded bundle (a cost paid once, which the script's
    own figure of its steps does not hold)."""
    startup = load_fixture(name).job_time.startup
    return [startup.phases.get(phase, 0.0)] if startup is not None else [float("nan")]


def row(pair: FixturePair, fixtures: dict[str, Any], rules: dict[str, Any],
        tries: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    if pair.startup_phase is not None:
        bad, fixed = (startup_phase_times(name, pair.startup_phase) for name in (pair.bad, pair.fixed))
    else:
        bad, fixed = (measured_times(fixtures, name, pair.per_sample) for name in (pair.bad, pair.fixed))
    measured = 1 - statistics.fmean(fixed) / statistics.fmean(bad)
    predicted, basis = predicted_gain(pair, rules)
    error = (predicted - measured) / measured if abs(measured) > 0.01 else None
    close = within(predicted, measured)
    together = headline_gain(pair, rules)
    headline = f"{together:.0%}" + ("" if not pair.together else " (yes)" if within(together, measured) else " (no)")
    unit = "per sample" if pair.per_sample else f"{pair.startup_phase}, once" if pair.startup_phase else "per step"
    rules_shown = ", ".join(pair.rules) + ("" if basis == "impact" else f" ({basis})")

    def times(values: list[float]) -> str:
        if pair.startup_phase is not None:
            return " / ".join(f"{v:.2f}" for v in values) + " s"
        return " / ".join(f"{v * 1e3:.2f}" for v in values) + " ms"

    machine = str(fixtures[pair.bad].get("machine") or "").split(",")[0]
    return [f"{pair.bad} → {pair.fixed}", rules_shown, f"{predicted:.0%}", headline if not pair.per_sample else "—",
            tried_gain(pair, tries), f"{measured:.0%}",
            "—" if error is None else f"{error:+.0%}", times(bad), f"{times(fixed)} ({unit})",
            "yes" if close else "no", machine]


COLUMNS = ["bad → fixed", "rules", "predicted saving", "headline (all fixes; judged where the twin applies them)",
           "tried (--try-fixes)", "measured gain", "relative error",
           "bad, each run", "fixed, each run", "within ±30% or ±0.05", "GPU"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser)
    figures = Figures("validate_impacts", parser.parse_args().json, COLUMNS)
    fixtures = json.loads((ROOT / "fixtures" / "measurements.json").read_text())["fixtures"]
    rules = {r.code: r for r in builtin_rules()}
    recorded = json.loads((ROOT / "fixtures" / "tries.json").read_text())["pairs"]
    tries = {(r["bad"], r["code"]): r for r in recorded}
    print(f"| {' | '.join(COLUMNS)} |")
    print(f"|{' --- |' * len(COLUMNS)}")
    for pair in PAIRS:
        cells = row(pair, fixtures, rules, tries)
        print(f"| {' | '.join(cells)} |")
        figures.row(*cells)
    figures.write()


if __name__ == "__main__":
    main()
