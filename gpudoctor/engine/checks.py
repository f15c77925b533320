"""What a rule yields, checked before it becomes a record of findings.json: one bad value is the rule's error,
never the run's.

A custom rule may yield `Finding(impact="high")`, a location given as text, an unknown severity, or evidence
that is NaN. Each is refused here with `InvalidFinding`, whose message names the field and what is wrong; the
engine turns it into that rule's error row, and every other rule's findings are still written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpudoctor.analysis import Location
from gpudoctor.bundle.findings import Evidence, EvidenceValue, FindingLocation, FindingRecord
from gpudoctor.engine.api import Finding, Rule
from gpudoctor.remedy import Remedy
from gpudoctor.vocabulary import SEVERITIES


class InvalidFinding(ValueError):
    """A Finding with a value findings.json cannot hold; the message says which and how to fix it."""


def _text(name: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidFinding(f"{name} must be text{' or None' if optional else ''}, not {type(value).__name__}")
    return value


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidFinding(f"{name} must be a number, not {type(value).__name__} ({value!r})")
    if not math.isfinite(value):
        raise InvalidFinding(f"{name} must be a finite number, not {value}")
    return float(value)


def _impact(finding: Finding) -> float | None:
    """The share of step time, kept within 0-1 (an estimate past either end means all or nothing)."""
    if finding.impact is None:
        return None
    return round(min(1.0, max(0.0, _number("impact (a share of step time, 0-1)", finding.impact))), 4)


def _severity(finding: Finding, rule: Rule) -> str:
    if finding.severity is None:
        return rule.severity
    if finding.severity not in SEVERITIES:
        raise InvalidFinding(f"severity must be one of {', '.join(SEVERITIES)}, not {finding.severity!r}")
    return finding.severity


def _location(value: object) -> FindingLocation | None:
    if value is None:
        return None
    if not isinstance(value, Location):
        raise InvalidFinding(f"location must be a gpudoctor.analysis.Location (e.g. run.sites.loader.location) or "
                             f"None, not {type(value).__name__} ({value!r})")
    return FindingLocation(file=value.file, line=value.line, function=value.function)


def _evidence_value(label: str, value: object) -> EvidenceValue:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float)):
        return value if isinstance(value, int) else _number(f"evidence {label!r}", value)
    return str(value)  # an object of another kind (a Path, a numpy number) is shown as its text


def _evidence(evidence: object) -> list[Evidence]:
    """`{label: value}` or `{label: (value, unit)}` as rows."""
    if not isinstance(evidence, Mapping):
        raise InvalidFinding(f"evidence must be a dict of label -> value, not {type(evidence).__name__}")
    rows = []
    for label, given in evidence.items():
        value, unit = given if isinstance(given, tuple) and len(given) == 2 else (given, None)
        rows.append(Evidence(name=str(label), value=_evidence_value(str(label), value),
                             unit=_text(f"the unit of evidence {label!r}", unit, optional=True)))
    return rows


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidFinding(f"count must be a whole number of at least 1, not {value!r}")
    return value


def finding_record(rule: Rule, finding: object) -> FindingRecord:
    """The record of one Finding a rule yielded: TypeError if it is not a Finding, InvalidFinding if one of its
    values does not fit."""
    if not isinstance(finding, Finding):
        raise TypeError(f"rule {rule.code} yielded {type(finding).__name__}, not a Finding: "
                             "yield gpudoctor.Finding(title, impact=..., location=...)")
    impact = _impact(finding)
    return FindingRecord(
        code=rule.code, name=rule.name, category=rule.category, severity=_severity(finding, rule),
        title=_text("title", finding.title) or "", impact=impact,
        impact_reason=_text("impact_reason", finding.impact_reason, optional=True) if impact is None else None,
        evidence=_evidence(finding.evidence), location=_location(finding.location),
        fix=_text("fix", finding.fix) or "", count=_count(finding.count), doc=rule.summary,
        remedy=_remedy(finding.remedy),
    )


def _remedy(value: object) -> Remedy | None:
    if value is not None and not isinstance(value, Remedy):
        raise InvalidFinding(f"remedy must be a gpudoctor.Remedy or None, not {type(value).__name__}")
    return value
