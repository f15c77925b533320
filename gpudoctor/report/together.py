"""What the fixes do together, as the verdict says it: one figure for every fix, measured where a fix was tried.

Without a try, the findings' savings add up (engine.runner gives each slice of the budget to one finding, and
findings of one change one claim): '2 problems; fixing them saves ~80% of each 18.7 ms step, down to ~3.7 ms'.

With a measured try, the try's own step replaces the prediction for the fix it applied, and what is left is
sized on that step: the problems the try's own run still shows, from the diagnosis of its bundle
(`LeftAfterTry`), less those the try's fix holds (its remedy contains theirs). No combined step is then said below
the measured one for the fix it measured, and the words say which figure is measured and which estimated:
'Tried GD312's fix: measured 35.8 → 18.0 ms/step, 2.0× (predicted ~18.9 ms). With it, 1 problem is left:
fixing it saves ~40% more of the 18.0 ms step, down to ~10.8 ms (estimated).'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.report.document import AfterTryJson
from gpudoctor.report.tried import tried_lead
from gpudoctor.report.units import seconds
from gpudoctor.report.verdict import saving_together


@dataclass(frozen=True)
class LeftAfterTry:
    """The lead try (the measured try with the largest speed-up) and what its own run still shows: `findings`,
    its diagnosis's problems whose fix is not the one tried, sized on `step_s`, the try's step."""

    code: str  # the finding whose fix the try applied
    step_s: float
    bundle: str  # the try's run directory, relative to the diagnosed run's
    findings: tuple[FindingRecord, ...]

    def to_json(self) -> AfterTryJson:
        return {"code": self.code, "step_s": self.step_s, "bundle": self.bundle,
                "saving": saving_together(list(self.findings)),
                "findings": [{"code": f.code, "title": f.title, "impact": f.impact, "saving_s": f.saving_s}
                             for f in self.findings]}


def lead_try(findings: Sequence[FindingRecord]) -> FindingRecord | None:
    """The finding whose measured try was the fastest: the one the verdict leads with."""
    measured = [f for f in findings if f.tried is not None and f.tried.status == "measured" and f.tried.step_s]
    if not measured:
        return None
    return max(measured, key=lambda f: ((f.tried.speedup if f.tried else None) or 0.0, f.saving_s is not None))


def left_after(lead: FindingRecord, found_in_try: Sequence[FindingRecord], step_s: float) -> LeftAfterTry:
    """What the try of `lead`'s fix leaves, from the findings of the try's own run (`found_in_try`, at its step
    `step_s`): its problems, less those whose fix the tried one holds (the same fix found again)."""
    tried = lead.tried
    assert tried is not None
    left = tuple(f for f in found_in_try if f.severity != "info" and not _held_by(lead, f))
    return LeftAfterTry(lead.code, step_s, tried.bundle or "", left)


def _held_by(lead: FindingRecord, finding: FindingRecord) -> bool:
    """Whether the lead try's fix makes the finding's (its remedy contains the finding's)."""
    return lead.remedy is not None and finding.remedy is not None and lead.remedy.contains(finding.remedy)


def left_text(left: LeftAfterTry) -> str:
    """'With it, 1 problem is left: fixing it saves ~40% more of the 18.0 ms step, down to ~10.8 ms (estimated).'"""
    problems = list(left.findings)
    if not problems:
        return "With it, gpudoctor finds no other problem in the run it measured."
    count = f"{len(problems)} problem" + ("s are" if len(problems) > 1 else " is")
    them = "them" if len(problems) > 1 else "it"
    total = saving_together(problems)
    if total <= 0:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return f"With it, {count} left, its cost not estimated: {problems[0].title.rstrip('.')}{more}."
    after = seconds(left.step_s * (1 - total))
    return (f"With it, {count} left: fixing {them} saves ~{total:.0%} more of the {seconds(left.step_s)} step, "
            f"down to ~{after} (estimated).")


def headline(verdict: str, step_s: float | None, findings: Sequence[FindingRecord],
             left: LeftAfterTry | None) -> str:
    """The verdict, led by the fastest measured try where one was made, and followed by what that try leaves
    (`left`); where the try's own run could not be diagnosed, by the other problems as sized before the fix."""
    lead = lead_try(findings)
    if lead is None or not step_s:
        return verdict
    shown = tried_lead(step_s, [f.to_json() for f in findings])
    if left is not None and left.code == lead.code:
        return f"{shown} {left_text(left)}"
    others = [f for f in findings if f.severity != "info" and f.impact and f is not lead and not _held_by(lead, f)]
    if not others:
        return shown
    sized = ", ".join(f"{f.code} ~{f.impact:.0%}" for f in others[:3]) + (" and more" if len(others) > 3 else "")
    return f"{shown} Sized on the {seconds(step_s)} step before it, the other problems save: {sized} (estimated)."
