"""What a fixture script expects its run to be diagnosed with, written in the script, on the line concerned.

A recorded fixture is a script (say fixtures/scripts/starved.py) profiled into a bundle. The script says
what the rules must find in `# expect:` comments, at the end of the line each finding must point at::

    loader = DataLoader(dataset, batch_size=64)  # expect: GD101 severity=critical impact=0.6..0.95

An expectation is a rule code and, optionally, checks on the finding, each `key=value`:

    severity=info|warning|critical
    impact=LOW..HIGH   the estimated impact (a share of step time) lies in [LOW, HIGH]
    impact=none        the finding has no impact estimate, and says why (its impact_reason)
    category=NAME      the rule's category, e.g. data_starvation
    count=N            the finding's count: how many times its cause was seen
    location=none      the finding points at no line; the comment then stands on a line of its own
    location=FILE:LINE the finding points at line LINE of FILE (a helper module beside the script, by its
                       name: `_helpers.py:74`); the comment then stands on a line of its own

Several expectations on one line are separated by `;` (`# expect: GD202 severity=info; GD201`), and a
further `#` starts free text. A finding points at line N of the script when its location's line is N
and its file has the script's name (a bundle keeps the path of the machine it was recorded on).

The expectations are the whole list: `check_findings` reports each expectation that no finding meets and
each finding that no expectation describes, so a rule that stops firing, fires twice, or points at
another line fails. A script on which nothing may be found says so with `# expect: none`, alone in the
script. A script with no `# expect:` comment at all is not taken to expect nothing: `check_findings`
reports it as not annotated, so that a new fixture cannot pass unchecked.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpudoctor.engine import CATEGORIES, CODE_PATTERN, SEVERITIES
from gpudoctor.errors import GpudoctorError

__all__ = ["Expectation", "ExpectationError", "Expectations", "FindingLike", "Mismatch", "check_findings",
           "parse_expectations", "read_expectations"]

_MARKER = re.compile(r"#\s*expect:([^#]*)")
_KEYS = ("severity", "impact", "category", "count", "location")
_NOTHING = "none"
_ELSEWHERE = re.compile(r"^[\w.-]+\.py:\d+$")
_Bad = Callable[[str], "ExpectationError"]  # makes the error for one malformed clause


class ExpectationError(GpudoctorError):
    """A malformed `# expect:` comment; the message names the script, the line and what is wrong."""


@dataclass(frozen=True)
class Expectation:
    """One finding a script expects: its rule and, for each field given, the value it must have."""

    code: str
    line: int | None  # the line the finding points at; None: a finding without a location
    written_at: int  # the script line the comment is on
    severity: str | None = None
    impact: tuple[float, float] | None = None  # (low, high), both included
    no_impact: bool = False  # impact=none
    category: str | None = None
    count: int | None = None
    elsewhere: str | None = None  # "FILE:LINE": the line of another file the finding points at

    def __str__(self) -> str:
        checks = [f"location={self.elsewhere}" if self.elsewhere else "location=none" if self.line is None else "",
                  f"severity={self.severity}" if self.severity else "",
                  "impact=none" if self.no_impact else "",
                  f"impact={self.impact[0]:g}..{self.impact[1]:g}" if self.impact else "",
                  f"category={self.category}" if self.category else "",
                  f"count={self.count}" if self.count is not None else ""]
        return " ".join([self.code, *filter(None, checks)])


@dataclass(frozen=True)
class Expectations:
    """Every `# expect:` comment of one script."""

    script: Path
    items: tuple[Expectation, ...] = ()
    annotated: bool = False  # the script has at least one `# expect:` comment, `# expect: none` included

    @property
    def codes(self) -> frozenset[str]:
        return frozenset(e.code for e in self.items)


@dataclass(frozen=True)
class Mismatch:
    """A difference between the findings and the expectations, about one line of the script (or none)."""

    script: Path
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.script}:{self.line}: {self.message}" if self.line else f"{self.script}: {self.message}"


# -- reading -----------------------------------------------------------------------------------------
def read_expectations(script: str | os.PathLike[str]) -> Expectations:
    """The expectations written in the script at `script`; ExpectationError for a malformed one."""
    path = Path(script)
    return parse_expectations(path.read_text(encoding="utf-8"), path)


def parse_expectations(source: str, script: str | os.PathLike[str] = "<string>") -> Expectations:
    """The expectations written in `source`, the text of the script `script` (named in errors)."""
    path = Path(script)
    items: list[Expectation] = []
    nothing_at: int | None = None
    for line, text, alone in _expect_comments(source, path):
        where = f"{path}:{line}"
        if text.strip() == _NOTHING:
            if nothing_at is not None:
                raise ExpectationError(f"{where}: `# expect: none` is already written on line {nothing_at}.")
            nothing_at = line
            continue
        items.extend(_parse_clause(clause, line, alone, where) for clause in text.split(";"))
    if nothing_at is not None and items:
        raise ExpectationError(f"{path}:{nothing_at}: `# expect: none` says no rule finds anything, but line "
                               f"{items[0].written_at} expects {items[0].code}; keep one or the other.")
    return Expectations(path, tuple(items), annotated=bool(items) or nothing_at is not None)


def _expect_comments(source: str, path: Path) -> Iterable[tuple[int, str, bool]]:
    """(line, text after `expect:`, whether the comment is alone on its line) of each `# expect:` comment."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise ExpectationError(f"{path}: its comments cannot be read, as it is not valid Python: {exc}") from None
    for token in tokens:
        if token.type == tokenize.COMMENT:
            match = _MARKER.search(token.string)
            if match:
                yield token.start[0], match.group(1), token.line.lstrip().startswith("#")


def _parse_clause(clause: str, line: int, alone: bool, where: str) -> Expectation:
    words = clause.split()
    if not words:
        raise ExpectationError(f"{where}: an empty expectation: write a rule code, e.g. `# expect: GD101`, "
                               "and separate several with `;`.")
    code, pairs = words[0], words[1:]

    def bad(reason: str) -> ExpectationError:
        return ExpectationError(f"{where}: malformed expectation {clause.strip()!r}: {reason}")

    if not CODE_PATTERN.match(code):
        raise bad(f"{code!r} is not a rule code (capital letters and three digits, e.g. GD101).")
    values = _pairs(pairs, bad)
    location = values.pop("location", None)
    located = location is None
    if located == alone:
        raise bad("a finding with a location is expected at the end of the line it points at; on a line of its "
                  "own, write location=none." if alone else f"location={location} goes on a comment line of its own.")
    elsewhere = location if location not in (None, _NOTHING) else None
    return Expectation(code, line if located else None, line, elsewhere=elsewhere, **_checks(values, bad))


def _pairs(pairs: Sequence[str], bad: _Bad) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value:
            raise bad(f"{pair!r} is not key=value.")
        if key not in _KEYS:
            raise bad(f"unknown key {key!r}; the keys are {', '.join(_KEYS)}.")
        if key in values:
            raise bad(f"{key} is given twice.")
        if key == "location" and value != _NOTHING and not _ELSEWHERE.match(value):
            raise bad(f"location={value}: write none, or FILE:LINE for a line of another file; a located "
                      "finding's line in the script is the line the comment ends.")
        values[key] = value
    return values


def _checks(values: Mapping[str, str], bad: _Bad) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    if "severity" in values:
        if values["severity"] not in SEVERITIES:
            raise bad(f"severity={values['severity']}: use one of {', '.join(SEVERITIES)}.")
        checks["severity"] = values["severity"]
    if "category" in values:
        if values["category"] not in CATEGORIES:
            raise bad(f"category={values['category']}: use one of {', '.join(CATEGORIES)}.")
        checks["category"] = values["category"]
    if "count" in values:
        if not values["count"].isdigit() or int(values["count"]) < 1:
            raise bad(f"count={values['count']}: a whole number of at least 1.")
        checks["count"] = int(values["count"])
    if "impact" in values:
        checks.update(_impact(values["impact"], bad))
    return checks


def _impact(value: str, bad: _Bad) -> dict[str, Any]:
    if value == _NOTHING:
        return {"no_impact": True}
    low, sep, high = value.partition("..")
    try:
        bounds = (float(low), float(high))
    except ValueError:
        bounds = (-1.0, -1.0)
    if not sep or not 0.0 <= bounds[0] <= bounds[1] <= 1.0:
        raise bad(f"impact={value}: write a range LOW..HIGH of shares of step time, 0 <= LOW <= HIGH <= 1 "
                  "(e.g. 0.4..0.8), or none.")
    return {"impact": bounds}


# -- checking ----------------------------------------------------------------------------------------
class FindingLike(Protocol):
    """A finding record as the engine makes it: its `to_json()` is the dict findings.json holds."""

    def to_json(self) -> dict[str, Any]: ...


def check_findings(findings: Iterable[Mapping[str, Any] | FindingLike], expected: Expectations, *,
                   codes: Iterable[str] | None = None) -> list[Mismatch]:
    """What differs between `findings` (dicts as in findings.json, or the engine's records) and the script's
    expectations.

    With `codes`, only the findings and expectations of those rules are compared (for findings made by
    running only some rules). An empty list means the findings are exactly the ones expected.
    """
    wanted = None if codes is None else frozenset(codes)
    if not expected.annotated:
        return [Mismatch(expected.script, None, "the script has no `# expect:` comment: write each expected "
                                                "finding at the end of its line, or `# expect: none`.")]
    plain = (f if isinstance(f, Mapping) else f.to_json() for f in findings)
    pool = [f for f in plain if wanted is None or f["code"] in wanted]
    used: set[int] = set()
    mismatches: list[Mismatch] = []
    for e in expected.items:
        if wanted is None or e.code in wanted:
            mismatches.extend(_meet(e, pool, used, expected.script))
    mismatches.extend(_unexpected(f, expected.script) for i, f in enumerate(pool) if i not in used)
    return sorted(mismatches, key=lambda m: m.line or 0)


def _points_at(finding: Mapping[str, Any], script: Path) -> int | str | None:
    """The script line the finding points at; None without a location; "FILE:LINE" in another file."""
    location = finding.get("location")
    if not location:
        return None
    if os.path.basename(str(location["file"])) == script.name:
        return int(location["line"])
    return f"{location['file']}:{location['line']}"


def _at(finding: Mapping[str, Any], script: Path) -> int | str | None:
    """Where the finding points, as an expectation says it: a line of the script, "FILE:LINE" by the file's name
    elsewhere, or None."""
    where = _points_at(finding, script)
    if isinstance(where, str):
        file, _, line = where.rpartition(":")
        return f"{os.path.basename(file)}:{line}"
    return where


def _wanted(e: Expectation) -> int | str | None:
    return e.elsewhere or e.line


def _meet(e: Expectation, pool: list[Mapping[str, Any]], used: set[int], script: Path) -> list[Mismatch]:
    """Pair the expectation with a finding of its rule at its line, preferring one that passes every check."""
    here = [i for i, f in enumerate(pool) if i not in used and f["code"] == e.code and _at(f, script) == _wanted(e)]
    if not here:
        return [Mismatch(script, e.written_at, f"expected {e}, but {_elsewhere(e, pool, script)}")]
    problems = {i: _problems(e, pool[i]) for i in here}
    chosen = next((i for i in here if not problems[i]), here[0])
    used.add(chosen)
    return [Mismatch(script, e.written_at, f"{e.code}: {problem}") for problem in problems[chosen]]


def _elsewhere(e: Expectation, pool: list[Mapping[str, Any]], script: Path) -> str:
    where = [_points_at(f, script) for f in pool if f["code"] == e.code]
    if not where:
        return f"{e.code} found nothing"
    shown = ", ".join("no location" if w is None else f"line {w}" if isinstance(w, int) else str(w) for w in where)
    said = f"points at {e.elsewhere}" if e.elsewhere else "points at this line" if e.line else "is without a location"
    return f"no {e.code} finding {said} ({e.code} at: {shown})"


def _problems(e: Expectation, finding: Mapping[str, Any]) -> list[str]:
    impact = finding.get("impact")
    problems = []
    if e.severity is not None and finding.get("severity") != e.severity:
        problems.append(f"severity {finding.get('severity')!r}, expected {e.severity!r}")
    if e.impact is not None and (impact is None or not e.impact[0] <= impact <= e.impact[1]):
        problems.append(f"impact {impact}, expected {e.impact[0]:g}..{e.impact[1]:g}")
    if e.no_impact and (impact is not None or not finding.get("impact_reason")):
        problems.append(f"impact {impact}, expected none" if impact is not None
                        else "has no impact and no impact_reason saying why")
    if e.category is not None and finding.get("category") != e.category:
        problems.append(f"category {finding.get('category')!r}, expected {e.category!r}")
    if e.count is not None and finding.get("count") != e.count:
        problems.append(f"count {finding.get('count')}, expected {e.count}")
    return problems


def _unexpected(finding: Mapping[str, Any], script: Path) -> Mismatch:
    where = _points_at(finding, script)
    at = "" if isinstance(where, int) else " without a location" if where is None else f" at {where}"
    impact = "none" if finding.get("impact") is None else f"{finding['impact']:g}"
    return Mismatch(script, where if isinstance(where, int) else None,
                    f"unexpected {finding['code']} finding{at} (severity={finding.get('severity')} impact={impact}): "
                    f"{finding.get('title')!r}")
