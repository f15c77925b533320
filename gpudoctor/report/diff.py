"""Two runs compared: the step time before and after, the speed-up, and each finding resolved, new or remaining.

Pure analysis over findings.json's records (gpudoctor.bundle.findings): gpudoctor.pipeline.diffing reads the runs, and
report.diff_render formats the result as text, JSON or HTML. A finding in one run is the same finding in the other
when its rule and its call site match, as the engine merges findings (engine.finding_key): the rule's code, and the
file and line, or the title for a finding without a location (failing that, a rule's one finding without a
location left in each run: such titles hold figures that change from run to run). A rule renamed since the
earlier run is the same rule: its aliases (the codes and names it had before) count as its code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.engine import Rule, finding_key
from gpudoctor.engine.runner import FindingKey

__all__ = ["Remaining", "RunDiff", "RunFindings", "Source", "canonical_codes", "compare", "speedup"]

Source = Literal["findings.json", "analysed"]  # read from the run's findings.json, or analysed from its bundle


@dataclass(frozen=True)
class RunFindings:
    """One run as the comparison sees it: where it was read from, its step times and its findings, ranked."""

    path: str  # as the user named it
    source: Source
    command: str | None
    median_step_s: float | None  # None: no step was measured
    steps_analysed: int
    findings: tuple[FindingRecord, ...]
    step_s: float | None = None  # the step at the run's pace (findings.json's run.step_s); None in an older one

    @property
    def pace_s(self) -> float | None:
        """The step the speed-up is of: the step time, or the median step of a findings.json written before it.
        A median alone misleads on a loader that starves in bursts: its median step is a fed one."""
        return self.step_s if self.step_s is not None else self.median_step_s


@dataclass(frozen=True)
class Remaining:
    """A finding both runs have, as each run had it (its impact, severity and title may have changed)."""

    before: FindingRecord
    after: FindingRecord


@dataclass(frozen=True)
class RunDiff:
    before: RunFindings
    after: RunFindings
    speedup: float | None  # before's step time / after's: above 1 is faster; None when either is not measured
    resolved: tuple[FindingRecord, ...]  # in before only, in before's order
    new: tuple[FindingRecord, ...]  # in after only, in after's order
    remaining: tuple[Remaining, ...]  # in both, in after's order


def canonical_codes(rules: Iterable[Rule]) -> dict[str, str]:
    """Every code and name a rule answers to (its own, and its aliases) -> its code today."""
    return {key: r.code for r in rules for key in (r.code, r.name, *r.aliases)}


def speedup(before_s: float | None, after_s: float | None) -> float | None:
    """How many times faster the later step is; None when either was not measured (or is zero)."""
    if before_s is None or after_s is None or before_s <= 0 or after_s <= 0:
        return None
    return before_s / after_s


def _key(record: FindingRecord, canonical: Mapping[str, str]) -> FindingKey:
    """The engine's key for the finding, with its rule's code of today (an old code or name is an alias)."""
    code = canonical.get(record.code) or canonical.get(record.name) or record.code
    return (code, *finding_key(record)[1:])


def _matches(before: Iterable[FindingRecord], after: Iterable[FindingRecord],
             canonical: Mapping[str, str]) -> dict[int, int]:
    """Index in `after` -> index in `before` of each finding both have; duplicates pair up in their order."""
    waiting: dict[FindingKey, list[int]] = {}
    for index, record in enumerate(before):
        waiting.setdefault(_key(record, canonical), []).append(index)
    pairs = {}
    for index, record in enumerate(after):
        candidates = waiting.get(_key(record, canonical))
        if candidates:
            pairs[index] = candidates.pop(0)
    # A finding without a location is keyed by its title, whose figures change from run to run ("1.0 of 2
    # cores free"): a rule's only one left over in each run is the same finding.
    left: dict[str, list[int]] = {}
    for key, indices in waiting.items():
        if key[1] is None:
            left.setdefault(key[0], []).extend(indices)
    new: dict[str, list[int]] = {}
    for index, record in enumerate(after):
        if index not in pairs and record.location is None:
            new.setdefault(_key(record, canonical)[0], []).append(index)
    for code, indices in new.items():
        if len(indices) == 1 and len(left.get(code, ())) == 1:
            pairs[indices[0]] = left[code][0]
    return pairs


def compare(before: RunFindings, after: RunFindings, canonical: Mapping[str, str] | None = None) -> RunDiff:
    """What changed from `before` to `after`; `canonical` maps the codes and names of rules to their codes of
    today (see canonical_codes), so that a renamed rule's findings still match."""
    pairs = _matches(before.findings, after.findings, canonical or {})
    matched = set(pairs.values())
    return RunDiff(
        before=before, after=after, speedup=speedup(before.pace_s, after.pace_s),
        resolved=tuple(f for i, f in enumerate(before.findings) if i not in matched),
        new=tuple(f for i, f in enumerate(after.findings) if i not in pairs),
        remaining=tuple(Remaining(before.findings[pairs[i]], f) for i, f in enumerate(after.findings) if i in pairs),
    )
