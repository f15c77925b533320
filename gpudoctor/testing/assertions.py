"""Run one rule on a `Run` and check what it found: `run_rule`, `assert_fires`, `assert_silent`, ..."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import TypedDict

from gpudoctor.analysis import NotEvaluated, Run
from gpudoctor.bundle.findings import FindingJson, LocationJson
from gpudoctor.engine import EngineResult, Rule, RuleFunction, doc_warning, find_rule, load_rules, rule_of, run_rules
from gpudoctor.testing.sites import SITE_DEFAULT, Site, site_dict

# A rule as a test names it: the decorated function, its Rule, or a built-in rule's code, name or old code.
RuleLike = RuleFunction | Rule | str


class _WantedFields(TypedDict):
    file: str
    line: int


class _Wanted(_WantedFields, total=False):
    """The location a test expects: "file:line" says no function."""

    function: str


class UndocumentedRuleWarning(UserWarning):
    """A rule under test lacks a section of the documentation the built-in rules have (it still runs)."""


class RuleRaised(AssertionError):
    """The rule raised an exception (the engine would have reported it as an error row)."""


def _resolve(rule: RuleLike) -> Rule:
    if not isinstance(rule, str):
        declared = rule_of(rule)
        if declared is None:
            raise TypeError(f"{rule!r} is not a rule: decorate it with @gpudoctor.rule(...)")
        warning = doc_warning(declared)
        if warning is not None:  # a rule runs without them; its test is where its author sees what the docs lack
            warnings.warn(warning, UndocumentedRuleWarning, stacklevel=4)
        return declared
    found = find_rule(load_rules(()), rule)
    if found is None:
        raise LookupError(f"no rule has the code or name {rule!r}")
    return found


def evaluate(rule: RuleLike, run: Run, **options: object) -> EngineResult:
    """Run one rule through the engine, with option overrides; the full result (findings, not_evaluated, errors)."""
    r = _resolve(rule)
    unknown = set(options) - set(r.options)
    if unknown:
        raise TypeError(f"rule {r.code} has no option(s) {', '.join(sorted(unknown))}; its options: "
                        f"{', '.join(r.options) or 'none'}")
    return run_rules(run, [r], {r.code: options})


def run_rule(rule: RuleLike, run: Run, **options: object) -> list[FindingJson]:
    """The finding dicts (as in findings.json) that one rule produces on `run`.

    Raises NotEvaluated when the rule had not the data it needs, and RuleRaised (an AssertionError, with
    the rule's traceback) when the rule itself failed: neither is the same as "no finding".
    """
    result = evaluate(rule, run, **options)
    if result.errors:
        error = result.errors[0]
        raise RuleRaised(f"rule {error.code} raised {error.error}\n{error.traceback}")
    if result.not_evaluated:
        raise NotEvaluated(result.not_evaluated[0].reason)
    return [f.to_json() for f in result.findings]


def assert_fires(rule: RuleLike, run: Run, *, count: int | None = None, severity: str | None = None,
                 impact: float | tuple[float, float] | None = None, title: str | None = None,
                 location: Site | str = SITE_DEFAULT,
                 options: Mapping[str, object] | None = None) -> list[FindingJson]:
    """Assert the rule produces findings (exactly `count`, when given) and return them.

    Each check applies to the first finding: `severity`; `impact` as a value (to within 0.02) or a
    (low, high) range; `title`, a substring of the title; `location`, a (file, line, function) tuple,
    a "file:line" string, or None for "no location". A file given as a bare name matches its basename.
    """
    findings = _findings_for_assert(rule, run, options)
    name = _resolve(rule).code
    assert findings, f"rule {name} found nothing; expected {count or 'at least one'} finding(s)"
    if count is not None:
        made = f"rule {name} made {len(findings)} findings, expected {count}: "
        assert len(findings) == count, made + _titles(findings)
    first = findings[0]
    if severity is not None:
        assert first["severity"] == severity, f"rule {name}: severity {first['severity']!r}, expected {severity!r}"
    if impact is not None:
        _check_impact(name, first["impact"], impact)
    if title is not None:
        assert title in first["title"], f"rule {name}: title {first['title']!r} does not contain {title!r}"
    if location is not SITE_DEFAULT:
        _check_location(name, first["location"], location)
    return findings


def assert_silent(rule: RuleLike, run: Run, *, options: Mapping[str, object] | None = None) -> None:
    """Assert the rule ran (it was evaluated, and did not raise) and found nothing."""
    findings = _findings_for_assert(rule, run, options)
    assert not findings, f"rule {_resolve(rule).code} should be silent but found: " + _titles(findings)


def assert_not_evaluated(rule: RuleLike, run: Run, reason: str | None = None, *,
                         options: Mapping[str, object] | None = None) -> str:
    """Assert the rule was not evaluated (its data is missing); `reason` is a substring of its reason."""
    result = evaluate(rule, run, **(options or {}))
    name = _resolve(rule).code
    assert not result.errors, f"rule {name} raised instead: {result.errors[0].error}"
    found = [f.to_json() for f in result.findings]
    assert result.not_evaluated, f"rule {name} was evaluated (findings: {_titles(found) or 'none'})"
    said = result.not_evaluated[0].reason
    assert reason is None or reason in said, f"rule {name}: reason {said!r} does not contain {reason!r}"
    return said


def _findings_for_assert(rule: RuleLike, run: Run, options: Mapping[str, object] | None) -> list[FindingJson]:
    try:
        return run_rule(rule, run, **(options or {}))
    except NotEvaluated as exc:
        raise AssertionError(f"rule {_resolve(rule).code} was not evaluated: {exc}") from None


def _titles(findings: list[FindingJson]) -> str:
    return "; ".join(repr(f["title"]) for f in findings)


def _check_impact(name: str, actual: float | None, expected: float | tuple[float, float]) -> None:
    assert actual is not None, f"rule {name}: impact is None, expected {expected}"
    if isinstance(expected, tuple):
        low, high = expected
        assert low <= actual <= high, f"rule {name}: impact {actual} outside [{low}, {high}]"
    else:
        assert abs(actual - expected) <= 0.02, f"rule {name}: impact {actual}, expected {expected} (±0.02)"


def _wanted(expected: Site | str) -> _Wanted:
    if isinstance(expected, str):
        file, _, line = expected.rpartition(":")
        return {"file": file, "line": int(line)}
    site = site_dict(expected) or {}
    return {"file": site["file"], "line": site["line"], "function": site["function"]}


def _check_location(name: str, actual: LocationJson | None, expected: Site | str) -> None:
    if expected is None:
        assert actual is None, f"rule {name}: location {actual}, expected none"
        return
    assert actual is not None, f"rule {name}: no location, expected {expected}"
    want = _wanted(expected)
    got_file = str(actual["file"])
    file_ok = got_file == want["file"] or ("/" not in want["file"] and os.path.basename(got_file) == want["file"])
    line_ok = int(actual["line"]) == int(want["line"])
    function_ok = "function" not in want or not want["function"] or actual.get("function") == want["function"]
    assert file_ok and line_ok and function_ok, f"rule {name}: location {actual}, expected {want}"

