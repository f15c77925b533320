"""Running rules over a `Run`, each in isolation: findings become records, merged per call site and ranked.

A rule that raises becomes an error row and one whose data is missing a not-evaluated row; the other rules
still run.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from gpudoctor.analysis import NotEvaluated, Run
from gpudoctor.bundle.findings import (
    Evidence,
    FindingLocation,
    FindingRecord,
    NotEvaluatedRecord,
    RuleErrorRecord,
)
from gpudoctor.engine.api import SEVERITIES, Finding, Rule, RuleFunction, rule_of

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


def _evidence(evidence: Mapping[str, Any]) -> list[Evidence]:
    """`{label: value}` or `{label: (value, unit)}` as rows."""
    rows = []
    for label, value in evidence.items():
        if isinstance(value, tuple) and len(value) == 2:
            rows.append(Evidence(name=label, value=value[0], unit=value[1]))
        else:
            rows.append(Evidence(name=label, value=value, unit=None))
    return rows


def finding_record(r: Rule, finding: Finding) -> FindingRecord:
    impact = None if finding.impact is None else round(min(1.0, max(0.0, float(finding.impact))), 4)
    loc = finding.location
    return FindingRecord(
        code=r.code, name=r.name, category=r.category, severity=finding.severity or r.severity,
        title=finding.title, impact=impact, impact_reason=finding.impact_reason if impact is None else None,
        evidence=_evidence(finding.evidence),
        location=FindingLocation(file=loc.file, line=loc.line, function=loc.function) if loc else None,
        fix=finding.fix, count=finding.count, doc=r.summary,
    )


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


def _error(r: Rule, exc: Exception) -> RuleErrorRecord:
    return RuleErrorRecord(
        code=r.code, name=r.name, source=r.source, error=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)),
    )


def run_rules(run: Run, rules: Iterable[Rule | RuleFunction], options: RuleOptions | None = None) -> EngineResult:
    """Run each rule alone: one that raises becomes an error row; one missing its data, not_evaluated."""
    options = options or {}
    findings: list[FindingRecord] = []
    not_evaluated: list[NotEvaluatedRecord] = []
    errors: list[RuleErrorRecord] = []
    for r in as_rules(rules):
        try:
            produced = list(_call(r, run, options.get(r.code, {})))
        except NotEvaluated as exc:
            not_evaluated.append(NotEvaluatedRecord(code=r.code, name=r.name, reason=str(exc)))
            continue
        except Exception as exc:  # noqa: BLE001 - a rule's bug is an error row; the other rules still run
            errors.append(_error(r, exc))
            continue
        findings.extend(finding_record(r, f) for f in produced)
    return EngineResult(rank(_merge(findings)), not_evaluated, errors)


def _call(r: Rule, run: Run, overrides: Mapping[str, Any]) -> Iterator[Finding]:
    produced = r.func(run, **{**r.options, **overrides})
    if isinstance(produced, Finding):
        raise TypeError(f"rule {r.code} returned a Finding; yield it (or return a list of Findings)")
    for item in produced or ():
        if not isinstance(item, Finding):
            raise TypeError(f"rule {r.code} yielded {type(item).__name__}, not a Finding: "
                            "yield gpudoctor.Finding(title, impact=..., location=...)")
        yield item
