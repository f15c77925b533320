"""Runs profiled with `--every`: the rules run on each window, and each finding says how it varied.

A finding from several windows is reported once, as seen in the window where it cost the most, with
one row per window it fired in (`windows`). The report's charts show that window: it is where the
largest problem is.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypedDict, TypeVar

import msgspec

from gpudoctor.analysis import Run
from gpudoctor.bundle.findings import FindingRecord, FindingWindow, NotEvaluatedRecord, RuleErrorRecord
from gpudoctor.engine.api import Rule, RuleFunction
from gpudoctor.engine.isolation import RuleLimits
from gpudoctor.engine.runner import EngineResult, FindingKey, RuleOptions, as_rules, finding_key, rank, run_rules

_NUMBER = re.compile(r"\d[\d.,]*")


class WindowStats(TypedDict):
    """One window's figures, as the report and findings.json show them (the report adds where it opened and
    whether its charts show it)."""

    index: int
    start: float  # seconds since the epoch
    first_step: int
    trace: str | None
    steps_analysed: int
    median_step_s: float | None
    gpu_idle_share: float | None
    findings: dict[str, float | None]  # rule code -> its findings' impact in this window


@dataclass(frozen=True)
class WindowResult:
    run: Run
    result: EngineResult


@dataclass(frozen=True)
class RunDiagnosis:
    """What the rules found in one run: over every window of a run profiled with --every."""

    run: Run  # the window the report's charts show
    result: EngineResult  # over every window
    windows: list[WindowStats]  # one row per window, for the report; none for a run of one window
    # The run seen through each of its windows, as the rules read it, by window; none for a run of one window
    window_runs: dict[int, Run] = field(default_factory=dict)


def diagnose_windows(run: Run, rules: Iterable[Rule | RuleFunction], options: RuleOptions,
                     limits: RuleLimits | None = None) -> RunDiagnosis:
    checked = as_rules(rules)
    if len(run.windows) < 2:
        return RunDiagnosis(run, run_rules(run, checked, options, limits), [])
    windows = [run.for_window(info.index) for info in run.windows]
    per_window = [WindowResult(w, run_rules(w, checked, options, limits)) for w in windows]
    result = across_windows([(w.run.window, w.result) for w in per_window])
    return RunDiagnosis(_chart_window(per_window, result), result, [_window_row(w, run) for w in per_window],
                        {w.run.window: w.run for w in per_window})


def _impact(impact: float | None) -> float:
    """An impact to compare: an unknown one below any known one."""
    return -1.0 if impact is None else impact


def _cause(record: FindingRecord) -> FindingKey:
    """One cause across windows: its numbers (in a title without a call site) change from window to window."""
    code, file, line, title = finding_key(record)
    return code, file, line, None if title is None else _NUMBER.sub("#", title)


def across_windows(results: list[tuple[int, EngineResult]]) -> EngineResult:
    """The rules' results in each window (by window index) as one: each finding once, as seen where it cost the
    most, with a row per window it fired in; a rule not evaluated only where it was in no window."""
    return EngineResult(_findings(results), _not_evaluated(results), _errors(results))


def _findings(results: list[tuple[int, EngineResult]]) -> list[FindingRecord]:
    seen: dict[FindingKey, list[tuple[int, FindingRecord]]] = {}
    for index, result in results:
        for record in result.findings:
            seen.setdefault(_cause(record), []).append((index, record))
    return rank([_combined(occurrences) for occurrences in seen.values()])


def _combined(occurrences: list[tuple[int, FindingRecord]]) -> FindingRecord:
    """The finding as seen where it cost the most, with its impact and severity in each window."""
    _, worst = max(occurrences, key=lambda o: (_impact(o[1].impact), o[0]))
    rows = [FindingWindow(index=index, impact=r.impact, severity=r.severity) for index, r in occurrences]
    return msgspec.structs.replace(worst, windows=rows)


class _HasCode(Protocol):
    @property
    def code(self) -> str: ...


_Row = TypeVar("_Row", bound=_HasCode)


def _not_evaluated(results: list[tuple[int, EngineResult]]) -> list[NotEvaluatedRecord]:
    """Rules that could not be evaluated in any window (one evaluated in some window was evaluated)."""
    everywhere = set.intersection(*({r.code for r in result.not_evaluated} for _, result in results))
    return _first_per_code(r for _, result in results for r in result.not_evaluated if r.code in everywhere)


def _errors(results: list[tuple[int, EngineResult]]) -> list[RuleErrorRecord]:
    return _first_per_code(r for _, result in results for r in result.errors)


def _first_per_code(rows: Iterable[_Row]) -> list[_Row]:
    first: dict[str, _Row] = {}
    for row in rows:
        first.setdefault(row.code, row)
    return list(first.values())


def _chart_window(per_window: list[WindowResult], result: EngineResult) -> Run:
    if result.findings and result.findings[0].windows:
        worst = max(result.findings[0].windows, key=lambda w: (_impact(w.impact), w.index))
        return next(w.run for w in per_window if w.run.window == worst.index)
    return per_window[-1].run


def _window_row(w: WindowResult, whole: Run) -> WindowStats:
    info = next(i for i in whole.windows if i.index == w.run.window)
    steps = w.run.steps
    return {
        "index": info.index, "start": info.start, "first_step": info.first_step, "trace": info.trace,
        "steps_analysed": len(steps),
        "median_step_s": statistics.median(s.wall_s for s in steps) if steps else None,
        "gpu_idle_share": w.run.gpu_work.idle_share, "findings": _impact_per_rule(w.result.findings),
    }


def _impact_per_rule(findings: list[FindingRecord]) -> dict[str, float | None]:
    """Each rule's findings in one window (a rule may find several call sites): their impacts added up."""
    per_rule: dict[str, float | None] = {}
    for record in findings:
        before, impact = per_rule.get(record.code), record.impact
        per_rule[record.code] = before if impact is None else min(1.0, (before or 0.0) + impact)
    return per_rule
