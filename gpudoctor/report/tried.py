"""How a tried fix reads beside its finding: first, on the finding's own line and at the head of the verdict, when
it was measured ('measured 664.2 → 48.4 ms/step, 13.7×; predicted ~122.0 ms'); then what the try changed, its
step beside the prediction, and where the try is not the fix the prediction assumes, what each figure assumes.
Formatting only: the figures are the finding's `tried` (gpudoctor.trying).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpudoctor.report.numerics import numerics_note
from gpudoctor.report.units import seconds

# A try is shown as a gain (in words and in the report's green) only from this speed-up: two runs of the same
# command on a shared host differ by a few percent in their mean step (the CPU tests' twins: 2-4%), so less than 5%
# is not told apart from no change.
GAIN = 1.05


def gained(finding: Mapping[str, Any]) -> bool:
    """Whether the finding's try was measured, and faster by at least GAIN."""
    tried = finding.get("tried") or {}
    return tried.get("status") == "measured" and (tried.get("speedup") or 0.0) >= GAIN


def pace_text(speedup: float) -> str:
    """'13.7× faster'; 'no faster (1.02×)' under GAIN; '1.06× slower'."""
    if speedup >= GAIN:
        return f"{speedup:.2f}× faster"
    if speedup > 1 / GAIN:
        return f"no faster ({speedup:.2f}×)"
    return f"{1 / speedup:.2f}× slower"


def _factor(speedup: float) -> str:
    """'13.7×' (a gain), 'no faster', '1.06× slower': a try's speed-up as the first line gives it."""
    if speedup >= GAIN:
        return f"{speedup:.3g}×"
    return "no faster" if speedup > 1 / GAIN else f"{1 / speedup:.3g}× slower"


def predicted_s(step_s: float | None, finding: Mapping[str, Any]) -> float | None:
    saving = finding.get("saving_s")
    return max(step_s - saving, 0.0) if step_s and saving is not None else None


def tried_head(step_s: float | None, finding: Mapping[str, Any]) -> str:
    """'measured 664.2 → 48.4 ms/step, 13.7×; predicted ~122.0 ms', for the finding's first line; empty where its
    fix was not measured."""
    tried = finding.get("tried")
    if not tried or tried["status"] != "measured" or not step_s:
        return ""
    before, after = seconds(step_s), seconds(tried["step_s"])
    if before.endswith(" ms") and after.endswith(" ms"):
        before = before.removesuffix(" ms")
    predicted = predicted_s(step_s, finding)
    expected = f"; predicted ~{seconds(predicted)}" if predicted is not None else ""
    return f"measured {before} → {after}/step, {_factor(tried['speedup'])}{expected}{_workers_start(tried)}"


def _workers_start(tried: Mapping[str, Any]) -> str:
    """'; the workers' start 1.62 → 0.20 s' for a try of the loader's workers, whose start the step does not show."""
    start = tried.get("workers_start_s")
    return f"; the workers' start {start[0]:.2f} → {start[1]:.2f} s" if start else ""


def tried_text(step_s: float | None, finding: Mapping[str, Any]) -> str:
    """A tried fix beside the prediction: 'predicted ~5.7 ms/step, measured 6.1 ms/step with the fix (1.7× faster)';
    why it failed or was not tried; empty for a finding whose fix was not tried."""
    tried = finding.get("tried")
    if not tried:
        return ""
    if tried["status"] != "measured":
        verb = "tried, failed" if tried["status"] == "failed" else "not tried"
        return f"{verb}: {tried['reason']}"
    predicted = predicted_s(step_s, finding)
    expected = f"predicted ~{seconds(predicted)}/step, " if predicted is not None else ""
    pace = pace_text(tried["speedup"])
    return (f"{expected}measured {seconds(tried['step_s'])}/step with the fix ({pace})" + _workers_start(tried)
            + numerics_note(tried))


def tried_applied(finding: Mapping[str, Any]) -> str:
    """What the try changed: 'GD101's fix: rank 0: num_workers 6 → 15; rank 1: 0 → 15'; empty where it says
    nothing."""
    tried = finding.get("tried") or {}
    applied, of = tried.get("applied"), tried.get("fix_of")
    if not applied:
        return f"{of}'s fix" if of else ""
    return f"{of}'s fix: {applied}" if of else str(applied)


def tried_lead(step_s: float | None, findings: Sequence[Mapping[str, Any]]) -> str:
    """The verdict's first sentence where a fix was measured: 'Tried GD101's fix: measured 664.2 → 48.4 ms/step,
    13.7× (GD601 predicted ~122.0 ms).'; the largest speed-up, a finding with a prediction before one without;
    empty where no fix was measured."""
    measured = [f for f in findings if (f.get("tried") or {}).get("status") == "measured"]
    if not measured or not step_s:
        return ""
    best = max(measured, key=lambda f: (f["tried"]["speedup"], f.get("saving_s") is not None))
    tried = best["tried"]
    of = tried.get("fix_of") or best["code"]
    before, after = seconds(step_s), seconds(tried["step_s"])
    if before.endswith(" ms") and after.endswith(" ms"):
        before = before.removesuffix(" ms")
    predicted = predicted_s(step_s, best)
    by = f"{best['code']} " if of != best["code"] else ""
    expected = f" ({by}predicted ~{seconds(predicted)})" if predicted is not None else ""
    factor = _factor(tried["speedup"])
    return f"Tried {of}'s fix: measured {before} → {after}/step, {factor}{expected}{_workers_start(tried)}."


def with_tried_lead(verdict: str, step_s: float | None, findings: Sequence[Mapping[str, Any]]) -> str:
    lead = tried_lead(step_s, findings)
    return f"{lead} {verdict}" if lead else verdict
