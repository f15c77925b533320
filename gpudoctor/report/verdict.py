"""The verdict at the top of a run's report: its status, what the fixes save together, and what the report says
where no finding explains the GPU's idle or the run is too short to judge. Wording only; the figures are the run's
and its findings' (report.model assembles the rest)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpudoctor.analysis import Run
from gpudoctor.analysis.budget import IDLE_SLICES, SLICE_LABELS, SLICES_OF_CATEGORY
from gpudoctor.analysis.views import Location, Step
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.bundle.records import first_line
from gpudoctor.report.cards import MAX_SOURCE_LINE
from gpudoctor.report.document import NotMeasuredRow, Status
from gpudoctor.report.units import seconds


def problems(findings: list[FindingRecord]) -> list[FindingRecord]:
    return [f for f in findings if f.severity != "info"]


def status(findings: list[FindingRecord], steps: list[Step], not_measured: list[NotMeasuredRow],
            unexplained: Unexplained | None = None) -> Status:
    """no_steps | problems | unexplained (nothing found, but the GPU idles much of the step with no finding to
    say why) | partial (nothing found, but something was not measured) | healthy."""
    if not steps:
        return "no_steps"
    if problems(findings):
        return "problems"
    if unexplained is not None:
        return "unexplained"
    return "partial" if not_measured else "healthy"


# A GPU that idles this share of the step or more, with no finding claiming the time, is not healthy: the
# verdict says so and names the largest slice no finding claims. Below it lie the healthy recordings (at most 19%:
# healthy_vision's host-side launches); pytorch/examples' dcgan idled 80% of its step with no finding.
UNEXPLAINED_IDLE = 0.25


@dataclass(frozen=True)
class Unexplained:
    """The GPU's idle that no finding claims: `share` of the step in all, the largest slice of it (`label`,
    `slice_share`) and the line of the script that slice is most at, where one is known."""

    share: float
    label: str
    slice_share: float
    where: Location | None


def unexplained_idle(run: Run, findings: list[FindingRecord]) -> Unexplained | None:
    """The budget's idle slices that no finding with a cost claims, when they hold UNEXPLAINED_IDLE of the step."""
    budget = run.budget
    if budget is None:
        return None
    claimed = {name for f in findings if f.impact for name in SLICES_OF_CATEGORY.get(f.category, ())}
    idle = [s for s in budget.slices if s.name in IDLE_SLICES and s.name not in claimed and s.share > 0]
    share = sum(s.share for s in idle)
    if share < UNEXPLAINED_IDLE:
        return None
    largest = max(idle, key=lambda s: s.share)
    return Unexplained(share, SLICE_LABELS[largest.name], largest.share, _slice_line(run, largest.name))


def _slice_line(run: Run, name: str) -> Location | None:
    """The script's line a slice of the budget is most at: the loader's, the longest sync's, the main thread's."""
    if name == "data_wait":
        loader = run.sites.loader.main
        return loader.location if loader is not None else None
    if name == "sync" and run.sites.syncs:
        return max(run.sites.syncs, key=lambda site: site.host_s).location
    if name == "stall":
        return _stall_line(run)
    lines = run.sites.host_lines
    return lines[0][0] if lines else None


def _stall_line(run: Run) -> Location | None:
    """The line of the stall that took the most (a save's, an evaluation's), else the loader's, whose workers start
    again at each epoch."""
    found = run.job_time.stalls
    placed = [stall for stall in (found.stalls if found else ()) if stall.location is not None]
    if placed:
        return max(placed, key=lambda stall: stall.excess_s).location
    loader = run.sites.loader.main
    return loader.location if loader is not None else None


def _unexplained_text(unexplained: Unexplained, of_step: str, cwd: str | None) -> str:
    """'GPU idle 80% of each 28.8 ms step, unexplained: no finding says why; the largest part, GPU idle: host-side
    work (Python, launches), is 50% of the step, most at dcgan.py:231 (main).'"""
    where = unexplained.where
    at = (f", most at {shown_file(where.file, cwd)}:{where.line} ({where.function})" if where is not None else "")
    label = unexplained.label.removeprefix("GPU idle: ")
    return (f"GPU idle {unexplained.share:.0%}{of_step}, unexplained: no finding says why; the largest part, "
            f"{label}, is {unexplained.slice_share:.0%} of the step{at}.")


# A run whose step is timed on few steps after the window, which the profiler slowed (or sped) this much, is too
# short to judge: pytorch/examples' dcgan, 14 steps after a window that ran 2.85x as long.
SHORT_RUN_STEPS = 20
HEAVY_DISTORTION = 2.0


def too_short(run: Run) -> str | None:
    """Why the run is too short to judge its step by, or None."""
    pace, ratio = run.pace, run.distortion.ratio
    if pace.basis != "unprofiled" or pace.steps >= SHORT_RUN_STEPS or ratio is None:
        return None
    if 1 / HEAVY_DISTORTION < ratio < HEAVY_DISTORTION:
        return None
    return (f"only {pace.steps} steps ran after the profiling window, whose steps the profiler made run "
            f"{ratio:.2f}× as long: too few to judge the step by; profile a longer run")


def verdict(idle: float | None, findings: list[FindingRecord], steps: list[Step], status: Status,
             elsewhere: str | None = None, step_s: float | None = None, unexplained: Unexplained | None = None,
             cwd: str | None = None) -> str:
    """What the user gains, in the run's one step figure (`step_s`, the step at the run's pace): '2 problems; fixing
    them saves ~70% of each 10.2 ms step, down to ~3.1 ms.' A GPU's idle share is said only when no saving is:
    beside one, a reader takes it for the cost. `elsewhere` names the processes the script started to do its
    work, when there are any."""
    if not steps and elsewhere:
        return (f"No training step was detected in the script's own process: its work ran in {elsewhere}, which "
                "gpudoctor does not profile.")
    if not steps:
        return "No training step was detected, so there is no step time to break down."
    found = problems(findings)
    of_step = f" of each {seconds(step_s)} step" if step_s else " of each step"
    idle_text = f"GPU idle {idle:.0%}{of_step}" if idle is not None else "GPU activity not measured"
    if not found and unexplained is not None:
        return _unexplained_text(unexplained, of_step, cwd)
    if not found:
        measured = "" if status == "healthy" else " in what was measured"
        return f"{idle_text}; no problems found{measured}."
    count = f"{len(found)} problem" + ("s" if len(found) > 1 else "")
    total = saving_together(found)
    if total <= 0 and idle is None:  # nothing measured of a GPU to say first (a CPU run): what was found
        their = "its" if len(found) == 1 else "their"
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return f"{count}; {their} cost{of_step} is not estimated: {found[0].title.rstrip('.')}{more}."
    apart = _not_of_each_step(found, cwd)
    if total <= 0:
        return f"{idle_text}; {count}" + (f", not a cost of each step: {apart}." if apart else ".")
    after = f", down to ~{seconds(step_s * (1 - total))}" if step_s else ""
    sized = f"{count}; fixing {_which(found)} saves ~{total:.0%}{of_step}{after}."
    return f"{sized} Not in that figure: {apart}." if apart else sized


def _which(found: list[FindingRecord]) -> str:
    """'it', 'them', or where some problems' cost lies outside the step's pace (a rare stall, the start-up), 'the one
    sized per step' or 'the 2 sized per step': the problems the saving is of."""
    sized = [f for f in found if f.impact]
    if not _apart(found):
        return "them" if len(found) > 1 else "it"
    return "the one sized per step" if len(sized) == 1 else f"the {len(sized)} sized per step"


# The problems the verdict names whose cost is not a saving of each step (a rare stall, the start-up).
APART_SHOWN = 2
OUTSIDE_THE_STEP = ("periodic_stall", "startup")


def _not_of_each_step(found: list[FindingRecord], cwd: str | None) -> str:
    """The problems whose cost lies outside the step's pace, by their titles, which give it (an evaluation every
    100th step at 39% of the steps' time, a start-up at 60% of the job), at their lines: 'every 100th step
    stalls 868 ms in an evaluation: 39% of the steps' time (train.py:312)'."""
    apart = _apart(found)
    named = [_lowered(f.title.rstrip(".")) + _at(f, cwd) for f in apart[:APART_SHOWN]]
    more = f"; and {len(apart) - APART_SHOWN} more" if len(apart) > APART_SHOWN else ""
    return "; ".join(named) + more


def _apart(found: list[FindingRecord]) -> list[FindingRecord]:
    """The problems whose cost lies outside the step's pace: no saving of each step, in OUTSIDE_THE_STEP."""
    return [f for f in found if f.impact is None and f.category in OUTSIDE_THE_STEP]


def _lowered(title: str) -> str:
    """A title inside a sentence: its first letter lowered, unless it starts a name (GD101, CUDA, Adam)."""
    first = title.split(" ", 1)[0]
    return title if first[1:2].isupper() or not first[:1].isupper() else title[:1].lower() + title[1:]


def _at(finding: FindingRecord, cwd: str | None) -> str:
    where = finding.location
    return f" ({shown_file(where.file, cwd)}:{where.line})" if where is not None else ""


def saving_together(findings: list[FindingRecord]) -> float:
    """What the findings' fixes save together, as a share of the step: the sum of their savings, which are made of
    disjoint slices of the budget (engine.runner.within_slices) and one per fix (engine.runner.one_claim_per_fix),
    so that two findings of one change count it once, and a fix that another's holds (TF32 under bf16 autocast)
    is in that one's saving."""
    return min(1.0, sum(f.impact or 0.0 for f in problems(findings) if f.counted_in is None))


def _raised(run: Run) -> str | None:
    """'train.py raised KeyError at data.py:31, in load: 'label'.' when the script ended with an exception."""
    ending = run.host.exit
    if not ending.exception:
        return None
    target = run.manifest.target
    where = ending.location
    at = f" at {shown_file(where.file, run.manifest.cwd)}:{where.line}, in {where.function}" if where else ""
    line = first_line(ending.message, MAX_SOURCE_LINE)
    said = f": {line}" if line else ""
    return f"{target.module or target.script or 'the script'} raised {ending.exception}{at}{said}".rstrip(".") + "."


def shown_file(file: str, cwd: str | None) -> str:
    """A file under the run's working directory relative to it, as the user would type it; any other as recorded."""
    if cwd and file.startswith(cwd.rstrip(os.sep) + os.sep):
        return os.path.relpath(file, cwd)
    return file


def with_raised(run: Run, verdict: str) -> str:
    """The verdict, after what the script raised: that comes first, before anything measured or not."""
    raised = _raised(run)
    return f"{raised} {verdict}" if raised else verdict
