"""Running rules over a `Run`, each in isolation (engine.isolation): findings become records (checked by
engine.checks), merged per call site and ranked.

A rule that fails (it raises, yields a Finding findings.json cannot hold, yields without end or runs past its
time limit) becomes an error row, and one whose data is missing a not-evaluated row; the other rules still run.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from gpudoctor.analysis import Run
from gpudoctor.analysis.budget import CLAIMED_WITHIN, SHRINKS_THE_WORK, SLICES_OF_CATEGORY, Budget
from gpudoctor.analysis.shares import claim_budget
from gpudoctor.bundle.findings import FindingRecord, NotEvaluatedRecord, RuleErrorRecord
from gpudoctor.engine.api import Rule, RuleFunction, rule_of
from gpudoctor.engine.isolation import RuleLimits, evaluate_rule
from gpudoctor.vocabulary import SEVERITIES

# A finding that saves less than this share of the step is at most `info`: it is below the run-to-run noise
# of step times (the two plain runs of each recorded fixture differ by 2-5%, fixtures/measurements.json).
NEGLIGIBLE_IMPACT = 0.02
# The rule, and the call site (file and line) or, for a finding without one, its title.
FindingKey = tuple[str, str | None, int | None, str | None]
RuleOptions = Mapping[str, Mapping[str, Any]]  # rule code -> option -> value


@dataclass(frozen=True)
class EngineResult:
    findings: list[FindingRecord]
    not_evaluated: list[NotEvaluatedRecord]
    errors: list[RuleErrorRecord]


def as_rules(rules: Iterable[Rule | RuleFunction]) -> list[Rule]:
    """Rules, given as Rules or as the functions @rule decorated."""
    found = []
    for item in rules:
        declared = rule_of(item)
        if declared is None:
            raise TypeError(f"{item!r} is not a rule: decorate it with @gpudoctor.rule(...)")
        found.append(declared)
    return found


def finding_key(record: FindingRecord) -> FindingKey:
    """What makes two finding records one cause: the rule and the call site (the title, without one)."""
    loc = record.location
    if loc is None:
        return record.code, None, None, record.title
    return record.code, loc.file, loc.line, None


def _merge(records: list[FindingRecord]) -> list[FindingRecord]:
    """One finding per rule and call site: later duplicates add their counts to the first."""
    merged: dict[FindingKey, FindingRecord] = {}
    for record in records:
        key = finding_key(record)
        first = merged.get(key)
        merged[key] = record if first is None else msgspec.structs.replace(first, count=first.count + record.count)
    return list(merged.values())


def _rank_key(record: FindingRecord) -> tuple[float, int, str]:
    """Largest impact first, then the most severe, then by code."""
    return -(record.impact or 0.0), -SEVERITIES.index(record.severity), record.code


def rank(records: list[FindingRecord]) -> list[FindingRecord]:
    return sorted(records, key=_rank_key)


def error_record(r: Rule, exc: BaseException, stack: str) -> RuleErrorRecord:
    trace = stack or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4))
    return RuleErrorRecord(code=r.code, name=r.name, source=r.source, error=f"{type(exc).__name__}: {exc}",
                           traceback=trace)


def run_rules(run: Run, rules: Iterable[Rule | RuleFunction], options: RuleOptions | None = None,
              limits: RuleLimits | None = None) -> EngineResult:
    """Run each rule alone (engine.isolation): one that fails becomes an error row; one missing its data,
    not_evaluated; the others still run."""
    declared = [r for r in as_rules(rules) if r.scope == "run"]  # a job's rules run on the merged ranks
    _ = run.trace  # read before any rule's time is counted: reading it is nobody's rule time; a failed read raises
    found = evaluate_rules(run, declared, options or {}, limits or RuleLimits())
    claims = {r.code: r.claims for r in declared if r.claims}
    # Negligible findings are `info` before the shares are handed out, so that one does not take a share from a
    # larger finding of a lower severity; and again after, where a share cut down becomes negligible.
    merged = _negligible_as_info(_merge(found.findings))
    idle = run.budget is not None
    claimed = one_claim_per_fix(one_claim_per_share(merged, claims), idle)
    findings = with_counted(within_slices([f for f in claimed if f.counted_in is None], claim_budget(run), idle=idle),
                            claimed)
    return EngineResult(rank(sized(findings, run.pace.seconds)), found.not_evaluated, found.errors)


def with_counted(shared: list[FindingRecord], claimed: list[FindingRecord]) -> list[FindingRecord]:
    """The findings whose savings were shared out of the budget, and in their places those that a larger fix's
    finding counts (one_claim_per_fix), each keeping the what-if of its own fix."""
    out, rest = [], iter(shared)
    for record in claimed:
        out.append(record if record.counted_in is not None else next(rest))
    return out


def evaluate_rules(subject: Run | Any, rules: Iterable[Rule], options: RuleOptions, limits: RuleLimits) -> EngineResult:
    """Each rule alone on `subject` (a Run, or a job for a job's rules): its findings as it yielded them, the
    rules not evaluated, and the rules that failed."""
    findings: list[FindingRecord] = []
    not_evaluated: list[NotEvaluatedRecord] = []
    errors: list[RuleErrorRecord] = []
    for r in rules:
        outcome = evaluate_rule(r, subject, options.get(r.code, {}), limits)
        if outcome.not_evaluated is not None:
            not_evaluated.append(NotEvaluatedRecord(code=r.code, name=r.name, reason=outcome.not_evaluated))
        elif outcome.error is not None:
            errors.append(error_record(r, outcome.error, outcome.stack))
        else:
            findings.extend(outcome.records)
    return EngineResult(findings, not_evaluated, errors)


def _claim_order(record: FindingRecord) -> tuple[int, float, str]:
    """Who keeps a shared share of the step first: the most severe, then the largest, then by code."""
    return -SEVERITIES.index(record.severity), -(record.impact or 0.0), record.code


def _pool_order(record: FindingRecord) -> tuple[bool, int, float, str]:
    """Who keeps a share of the budget first: a finding that names a cause within another category's share
    (CLAIMED_WITHIN), then as `_claim_order`."""
    return (record.category not in CLAIMED_WITHIN, *_claim_order(record))


def one_claim_per_share(records: list[FindingRecord], claims: Mapping[str, str]) -> list[FindingRecord]:
    """Of the findings on one line (or without one) whose rules claim the same share of the step, the most severe
    (then the largest) keeps its impact; the others keep their place and evidence, with no impact and a reason
    naming the one that counts that time."""
    def share_key(record: FindingRecord) -> tuple[str, str | None, int | None] | None:
        share, loc = claims.get(record.code), record.location
        return (share, loc.file if loc else None, loc.line if loc else None) if share else None

    holders: dict[tuple[str, str | None, int | None], FindingRecord] = {}
    # The most severe first (GD201's pageable copy before GD202's note on the same line), then the largest.
    for record in sorted(records, key=_claim_order):
        key = share_key(record)
        if key is not None and record.impact is not None:
            holders.setdefault(key, record)
    out = []
    for record in records:
        key = share_key(record)
        holder = holders.get(key) if key is not None else None
        if holder is None or holder is record or record.impact is None:
            out.append(record)
            continue
        out.append(msgspec.structs.replace(record, impact=None, saving_s=None,
                                           impact_reason=f"counted in {holder.code}'s finding: the same time"))
    return out


def within_slices(records: list[FindingRecord], budget: Budget | None, idle: bool = True) -> list[FindingRecord]:
    """Findings with impacts that add up to no more than the budget's slices they claim (analysis.budget.
    SLICES_OF_CATEGORY): every share of the step is claimed once, by one finding, whatever their categories (a host
    short of CPU and a loader in the main process both claim the wait for data), and no fix saves more than the
    time it removes. As in `one_claim_per_share`, the most severe (then the largest) takes its share first, from
    the slices no finding after it claims first; the others get what is left, and one left nothing has no impact and
    a reason naming the finding that counts that time. Rules that size a cost on the host's time (a copy's blocked
    seconds) can overshoot the GPU idle it leaves: inference_pageable_bad's two copies blocked the host for 53% and
    30% of the step beside 70% of GPU idle in copies and syncs. `idle`: the budget's slices are the GPU's idle (a
    run without GPU activity has a budget of the host's time, analysis.shares.claim_budget)."""
    if budget is None:
        return records
    left = {s.name: s.share for s in budget.slices}
    holders: dict[str, FindingRecord] = {}
    kept: dict[int, FindingRecord] = {}
    ordered = sorted(enumerate(records), key=lambda item: _pool_order(item[1]))
    for position, (index, record) in enumerate(ordered):
        later = {name for _, other in ordered[position + 1:] if other.impact is not None
                 for name in _claimed(other.category, idle)}
        names = sorted(_claimed(record.category, idle), key=lambda name: name in later)  # theirs last
        if record.impact is None or not names:
            continue
        room = sum(left[name] for name in names)
        taken = min(record.impact, room)
        _take(left, names, taken)
        for name in names:
            holders.setdefault(name, record)
        if record.impact <= room + 1e-4:  # impacts are rounded to 4 places: within that, it fits
            continue
        share = round(max(0.0, room), 4)  # as every impact is rounded: within 0.00005 of the slices
        if share > 0:
            kept[index] = msgspec.structs.replace(record, impact=share)
            continue
        holder = next((holders[name] for name in names if holders[name] is not record), None)
        time = "idle time" if idle else "time"
        reason = (f"counted in {holder.code}'s finding: the same {time}" if holder is not None else
                  "the budget has no GPU idle in the part of the step this kind of finding claims" if idle else
                  "the step has no time left in the part this kind of finding claims")
        kept[index] = msgspec.structs.replace(record, impact=None, saving_s=None, impact_reason=reason)
    return [kept.get(index, record) for index, record in enumerate(records)]


def one_claim_per_fix(records: list[FindingRecord], idle: bool = True) -> list[FindingRecord]:
    """Findings whose fixes are one change, or of which one holds the other (gpudoctor.remedy.Remedy.contains), and
    whose savings are made of the same slices of the budget, are one claim.

    Two findings of the same remedy are two estimates of what one change saves, not two savings: the first in
    `_pool_order` (the one that names the cause within the other's share: GD313's compiled kernels before GD301's
    launches) keeps its impact; the others keep their place and evidence, with no impact and a reason naming it.
    elementwise_eager_bad: GD313 predicted 80% and GD301 the 12% left of the host's idle, both by compiling the
    model; compiled, its twin measured 80%.

    A finding whose fix another's holds (a rung of the precision ladder below the next: TF32 under bf16 autocast with
    TF32) keeps its own what-if, a saving of its own fix, and is counted in the larger fix's (`counted_in`), which
    what the fixes save together takes once (report.verdict.saving_together). One fix whose parts save different
    slices (a loader's persistent workers: the wait for data, and the workers' start at each epoch) stays the sum
    of its parts."""
    holders: dict[int, FindingRecord] = {}  # by position: the first finding of each fix
    replaced: dict[int, FindingRecord] = {}
    for index, record in sorted(enumerate(records), key=lambda item: _pool_order(item[1])):
        if record.impact is None or record.remedy is None or record.counted_in is not None:
            continue
        same = next((h for h in holders.values() if _one_claim(h, record, idle) and h.remedy == record.remedy), None)
        if same is not None:
            replaced[index] = msgspec.structs.replace(record, impact=None, saving_s=None,
                                                      impact_reason=f"counted in {same.code}'s finding: the same fix")
            continue
        holders[index] = record
    for index, record in holders.items():
        assert record.remedy is not None
        larger = next((h for at, h in holders.items() if at != index and _one_claim(h, record, idle)
                       and h.remedy is not None and h.remedy.contains(record.remedy)), None)
        if larger is not None:
            replaced[index] = msgspec.structs.replace(record, counted_in=larger.code)
    return [replaced.get(index, record) for index, record in enumerate(records)]


def _one_claim(holder: FindingRecord, record: FindingRecord, idle: bool) -> bool:
    """Whether two findings' fixes are one change, or one holds the other, and they save the same slices."""
    assert holder.remedy is not None and record.remedy is not None
    if not (holder.remedy.contains(record.remedy) or record.remedy.contains(holder.remedy)):
        return False
    return bool(set(_claimed(holder.category, idle)) & set(_claimed(record.category, idle)))


def _claimed(category: str, idle: bool) -> tuple[str, ...]:
    """The slices a finding of `category` claims; of a host's budget (`idle` False), its one slice of time that
    fixes of a wait can take (analysis.budget.host_budget), which holds all a GPU's idle would be split into, and
    for a fix that shrinks the work itself, the host's own work too."""
    names = SLICES_OF_CATEGORY.get(category, ())
    if idle or not names:
        return names
    return ("host", "gpu_busy") if category in SHRINKS_THE_WORK else ("host",)


def _take(left: dict[str, float], names: list[str], seconds_share: float) -> None:
    for name in names:
        take = min(seconds_share, left[name])
        left[name] -= take
        seconds_share -= take


def sized(records: list[FindingRecord], step_s: float | None) -> list[FindingRecord]:
    """Each finding with its saving also in seconds of a `step_s` step, and at most `info` when that is negligible.
    No saving is cut to a ceiling: each is its rule's what-if of the step, within the budget's slices it claims
    (`within_slices`), so that a stall of 99% of the steps' time is said as 99% (checkpoint_stall_bad: its twin,
    saving once, measured 99%; startup_workers_bad's GD702 98% against 96%)."""
    return _negligible_as_info(_with_savings(records, step_s))


def _negligible_as_info(records: list[FindingRecord]) -> list[FindingRecord]:
    """A warning or critical finding whose fix would save a negligible share of the step becomes `info`."""
    return [msgspec.structs.replace(r, severity="info")
            if r.impact is not None and r.impact < NEGLIGIBLE_IMPACT and r.severity != "info" else r
            for r in records]


def _with_savings(records: list[FindingRecord], step_s: float | None) -> list[FindingRecord]:
    """Each impact (a share of the step) also as seconds per step, of the step the report shows: the step at the
    run's pace (analysis.timebase.step_time)."""
    if not step_s:
        return records
    return [r if r.impact is None else msgspec.structs.replace(r, saving_s=round(r.impact * step_s, 6))
            for r in records]
