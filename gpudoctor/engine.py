"""Rules: the `@rule` decorator, `Finding`, and running a set of rules over a `Run`, each in isolation."""

from __future__ import annotations

import inspect
import re
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.analysis import NotEvaluated, Run
from gpudoctor.analysis.views import Location
from gpudoctor.errors import RuleLoadError

CATEGORIES = (
    "data_starvation", "blocking_copy", "sync_point", "gil_contention", "small_batch", "fork_after_cuda",
    "cpu_oversubscription", "cpu_contention", "host_memory_pressure",
)
SEVERITIES = ("info", "warning", "critical")
CODE_PATTERN = re.compile(r"^[A-Z][A-Z0-9]{0,7}[0-9]{3}$")
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclass
class Finding:
    """What a rule yields: one problem, with the number that matters in its title.

    `impact` is the estimated share of step time (0-1) that fixing it would recover, or None with
    `impact_reason` saying why it cannot be estimated. `evidence` maps a label to a value, or to a
    (value, unit) pair. `severity` overrides the rule's default for this one finding.
    """

    title: str
    impact: float | None = None
    location: Location | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    impact_reason: str | None = None
    severity: str | None = None
    count: int = 1


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    category: str
    severity: str
    func: Callable[..., Iterable[Finding]]
    options: dict[str, Any]
    doc: str
    aliases: tuple[str, ...] = ()
    source: str = "built-in"

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    def with_source(self, source: str) -> Rule:
        return Rule(self.code, self.name, self.category, self.severity, self.func, self.options, self.doc,
                    self.aliases, source)


def _where(func: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(func)}:{inspect.getsourcelines(func)[1]}"
    except (OSError, TypeError):
        return getattr(func, "__module__", "?")


def _rule_options(func: Callable[..., Any], code: str) -> dict[str, Any]:
    """The rule's options: keyword parameters with defaults after the first parameter, `run`."""
    params = list(inspect.signature(func).parameters.values())
    where = _where(func)
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise RuleLoadError(f"{where}: rule {code} must take the run as its first parameter: def {func.__name__}(run, ...).")
    options = {}
    for param in params[1:]:
        if param.default is inspect.Parameter.empty or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise RuleLoadError(
                f"{where}: rule {code} parameter '{param.name}' needs a default value: every parameter after "
                f"`run` is an option (e.g. {param.name}: float = 0.25)."
            )
        options[param.name] = param.default
    return options


def rule(code: str, name: str, *, category: str, severity: str = "warning",
         aliases: Iterable[str] = ()) -> Callable[[Callable[..., Iterable[Finding]]], Rule]:
    """Declare a rule: `@rule("ACME101", "loader-starves-gpu", category="data_starvation")`.

    The decorated function takes a `Run` and yields `Finding`s; its docstring is the rule's
    documentation; its keyword parameters (with defaults) are its options.
    """

    def decorate(func: Callable[..., Iterable[Finding]]) -> Rule:
        where = _where(func)
        if not CODE_PATTERN.match(code):
            raise RuleLoadError(f"{where}: rule code '{code}' is malformed: use a prefix of capital letters and three digits, e.g. ACME101.")
        if not NAME_PATTERN.match(name):
            raise RuleLoadError(f"{where}: rule {code} name '{name}' must be kebab-case, e.g. loader-starves-gpu.")
        if category not in CATEGORIES:
            raise RuleLoadError(f"{where}: rule {code} category '{category}' is unknown; use one of: {', '.join(CATEGORIES)}.")
        if severity not in SEVERITIES:
            raise RuleLoadError(f"{where}: rule {code} severity '{severity}' is unknown; use info, warning or critical.")
        if not (func.__doc__ or "").strip():
            raise RuleLoadError(f"{where}: rule {code} has no docstring; its docstring is the documentation users read.")
        return Rule(code, name, category, severity, func, _rule_options(func, code), inspect.cleandoc(func.__doc__ or ""),
                    tuple(aliases))

    return decorate


# -- running -------------------------------------------------------------------------------------
@dataclass
class EngineResult:
    findings: list[dict[str, Any]]
    not_evaluated: list[dict[str, Any]]
    errors: list[dict[str, Any]]


def _evidence_rows(evidence: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for label, value in evidence.items():
        if isinstance(value, tuple) and len(value) == 2:
            rows.append({"name": label, "value": value[0], "unit": value[1]})
        else:
            rows.append({"name": label, "value": value, "unit": None})
    return rows


def _finding_record(r: Rule, finding: Finding) -> dict[str, Any]:
    impact = None if finding.impact is None else round(min(1.0, max(0.0, float(finding.impact))), 4)
    return {
        "code": r.code, "name": r.name, "category": r.category, "severity": finding.severity or r.severity,
        "title": finding.title, "impact": impact,
        "impact_reason": finding.impact_reason if impact is None else None,
        "evidence": _evidence_rows(finding.evidence),
        "location": finding.location.to_dict() if finding.location else None,
        "fix": finding.fix, "count": finding.count, "doc": r.summary,
    }


def finding_key(record: dict[str, Any]) -> tuple:
    """What makes two finding records one cause: the rule and the call site (the title, without one)."""
    loc = record["location"] or {}
    return record["code"], loc.get("file"), loc.get("line"), None if loc else record["title"]


def _merge(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One finding per rule and call site: later duplicates add their counts to the first."""
    merged: dict[tuple, dict[str, Any]] = {}
    for record in records:
        key = finding_key(record)
        if key in merged:
            merged[key]["count"] += record["count"]
        else:
            merged[key] = record
    return list(merged.values())


def rank(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    severity_rank = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    return sorted(records, key=lambda f: (-(f["impact"] or 0.0), severity_rank[f["severity"]], f["code"]))


def run_rules(run: Run, rules: Iterable[Rule], options: dict[str, dict[str, Any]] | None = None) -> EngineResult:
    """Run each rule alone: one that raises becomes an error row; one missing its data, not_evaluated."""
    options = options or {}
    findings, not_evaluated, errors = [], [], []
    for r in rules:
        try:
            produced = list(_call(r, run, options.get(r.code, {})))
        except NotEvaluated as exc:
            not_evaluated.append({"code": r.code, "name": r.name, "reason": str(exc)})
            continue
        except Exception as exc:
            errors.append({
                "code": r.code, "name": r.name, "source": r.source,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)),
            })
            continue
        findings.extend(_finding_record(r, f) for f in produced)
    return EngineResult(rank(_merge(findings)), not_evaluated, errors)


def _call(r: Rule, run: Run, overrides: dict[str, Any]) -> Iterator[Finding]:
    produced = r.func(run, **{**r.options, **overrides})
    if isinstance(produced, Finding):
        raise TypeError(f"rule {r.code} returned a Finding; yield it (or return a list of Findings)")
    for item in produced or ():
        if not isinstance(item, Finding):
            raise TypeError(f"rule {r.code} yielded {type(item).__name__}, not a Finding: "
                            "yield gpudoctor.Finding(title, impact=..., location=...)")
        yield item
