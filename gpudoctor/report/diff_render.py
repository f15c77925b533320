"""Renderers of a comparison (report.diff.RunDiff): text for a person, JSON for tools, one small HTML page.

They format; they compute nothing. The JSON document's shape is DiffDocument below, and the JSON Schema shipped
beside findings.json's, gpudoctor/schemas/diff.schema.json (see `diff_schema()`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

import jinja2

from gpudoctor._version import __version__
from gpudoctor.bundle.findings import FindingRecord, LocationJson
from gpudoctor.paths import findings_schema
from gpudoctor.report.diff import Remaining, RunDiff, RunFindings, Source
from gpudoctor.report.templates import template_environment
from gpudoctor.report.units import percent, seconds
from gpudoctor.vocabulary import DIFF_FORMATS

__all__ = ["DIFF_FORMATS", "DiffDocument", "diff_document", "diff_schema", "diff_to_html", "diff_to_json",
           "diff_to_text", "render_diff", "speed_phrase", "speed_trend"]

DIFF_SCHEMA_VERSION = 1  # of the diff document's shape (fields may be added; none removed or changed)
SAME_SPEED = 0.005  # a speed-up within half a percent of 1 reads as "the same speed" (it prints as 1.00x)


# -- the JSON document ----------------------------------------------------------------------------------
class DiffRunJson(TypedDict):
    path: str
    source: Source
    command: str | None
    median_step_s: float | None
    step_s: float | None  # the step the speed-up is of (findings.json's run.step_s, or its median step before it)
    steps_analysed: int
    findings: int


class _DiffSideFields(TypedDict):
    code: str
    severity: str
    title: str
    impact: float | None
    count: int


class DiffSideJson(_DiffSideFields, total=False):
    """A finding as one of the two runs had it; in a run whose fixes were tried, the speed-up its try measured."""

    tried_speedup: float | None


class DiffFindingJson(TypedDict):
    """A finding of the comparison: as the later run has it (as the earlier run had it, for a resolved one), and
    as each run had it (None in the run without it)."""

    code: str
    name: str
    category: str
    severity: str
    title: str
    location: LocationJson | None
    fix: str
    before: DiffSideJson | None
    after: DiffSideJson | None


class DiffDocument(TypedDict):
    schema_version: int
    gpudoctor_version: str
    before: DiffRunJson
    after: DiffRunJson
    speedup: float | None
    resolved: list[DiffFindingJson]
    new: list[DiffFindingJson]
    remaining: list[DiffFindingJson]


def diff_schema() -> Path:
    """The JSON Schema (draft 2020-12) of `gpudoctor diff --format json`, shipped beside findings.json's."""
    return findings_schema().with_name("diff.schema.json")


def _run_json(run: RunFindings) -> DiffRunJson:
    return {"path": run.path, "source": run.source, "command": run.command, "median_step_s": run.median_step_s,
            "step_s": run.pace_s, "steps_analysed": run.steps_analysed, "findings": len(run.findings)}


def _side(record: FindingRecord | None) -> DiffSideJson | None:
    if record is None:
        return None
    side: DiffSideJson = {"code": record.code, "severity": record.severity, "title": record.title,
                          "impact": record.impact, "count": record.count}
    if record.tried is not None:
        side["tried_speedup"] = record.tried.speedup
    return side


def _finding_json(before: FindingRecord | None, after: FindingRecord | None) -> DiffFindingJson:
    shown = after or before
    assert shown is not None  # every finding of a comparison is in one run at least
    return {"code": shown.code, "name": shown.name, "category": shown.category, "severity": shown.severity,
            "title": shown.title, "location": shown.location.to_json() if shown.location else None, "fix": shown.fix,
            "before": _side(before), "after": _side(after)}


def _remaining_json(pair: Remaining) -> DiffFindingJson:
    return _finding_json(pair.before, pair.after)


def diff_document(diff: RunDiff) -> DiffDocument:
    return {
        "schema_version": DIFF_SCHEMA_VERSION, "gpudoctor_version": __version__,
        "before": _run_json(diff.before), "after": _run_json(diff.after), "speedup": diff.speedup,
        "resolved": [_finding_json(f, None) for f in diff.resolved], "new": [_finding_json(None, f) for f in diff.new],
        "remaining": [_remaining_json(pair) for pair in diff.remaining],
    }


def diff_to_json(diff: RunDiff) -> str:
    return json.dumps(diff_document(diff), indent=2, allow_nan=False) + "\n"


# -- text -------------------------------------------------------------------------------------------------
def speed_trend(speedup: float | None) -> str:
    """faster, slower, same (within SAME_SPEED) or unknown (a step time not measured)."""
    if speedup is None:
        return "unknown"
    if abs(speedup - 1) < SAME_SPEED:
        return "same"
    return "faster" if speedup > 1 else "slower"


def speed_phrase(speedup: float | None) -> str:
    """'2.09x faster', '1.25x slower', 'the same speed'; 'speed-up unknown' when a step time was not measured."""
    trend = speed_trend(speedup)
    if speedup is None or trend == "unknown":
        return "speed-up unknown"
    if trend == "same":
        return "the same speed"
    return f"{speedup:.2f}x faster" if trend == "faster" else f"{1 / speedup:.2f}x slower"


def _median(value: float | None) -> str:
    return "not measured" if value is None else seconds(value)


def _share(impact: float | None) -> str:
    return "not estimated" if impact is None else "~" + percent(impact)


def _where(record: FindingRecord) -> str:
    return f" at {record.location}" if record.location else ""


def _analysed_note(diff: RunDiff) -> list[str]:
    analysed = [run.path for run in (diff.before, diff.after) if run.source == "analysed"]
    return [f"analysed now, having no findings.json: {', '.join(analysed)}"] if analysed else []


def _finding_line(record: FindingRecord, cost: str) -> str:
    return f"  [{record.severity}] {record.code} {record.title}{_where(record)}{cost}"


def _tried(record: FindingRecord) -> str:
    """What the run's try of the fix measured, said beside the speed-up the later run shows."""
    tried = record.tried
    if tried is None or tried.speedup is None:
        return ""
    return f"; its try measured {speed_phrase(tried.speedup)}"


def _resolved_line(record: FindingRecord) -> str:
    cost = "" if record.impact is None else f"was {_share(record.impact)} of step time"
    said = f"{cost}{_tried(record)}".removeprefix("; ")
    return _finding_line(record, f" ({said})" if said else "")


def _new_line(record: FindingRecord) -> str:
    return _finding_line(record, "" if record.impact is None else f" ({_share(record.impact)} of step time)")


def _remaining_line(pair: Remaining) -> str:
    before, after = pair.before, pair.after
    severity = after.severity if before.severity == after.severity else f"{before.severity} -> {after.severity}"
    cost = f" (step time: {_share(before.impact)} -> {_share(after.impact)})"
    if before.impact is None and after.impact is None:
        cost = ""
    return f"  [{severity}] {after.code} {after.title}{_where(after)}{cost}"


def _section(name: str, lines: list[str]) -> list[str]:
    return [f"{name} ({len(lines)}):", *lines] if lines else [f"{name}: none"]


def diff_to_text(diff: RunDiff) -> str:
    """A few lines a person reads: the step times, the speed-up and the median steps, then the findings resolved,
    new and remaining."""
    steps = f"{_median(diff.before.pace_s)} -> {_median(diff.after.pace_s)}"
    medians = f"{_median(diff.before.median_step_s)} -> {_median(diff.after.median_step_s)}"
    lines = [f"step {steps} ({speed_phrase(diff.speedup)}); median step {medians}"]
    lines += _section("resolved", [_resolved_line(f) for f in diff.resolved])
    lines += _section("new", [_new_line(f) for f in diff.new])
    lines += _section("remaining", [_remaining_line(pair) for pair in diff.remaining])
    return "\n".join(lines + _analysed_note(diff)) + "\n"


# -- HTML -------------------------------------------------------------------------------------------------
def _environment() -> jinja2.Environment:
    env = template_environment()
    env.filters.update(seconds=seconds, percent=percent, median=_median, speed=speed_phrase, trend=speed_trend)
    return env


def diff_to_html(diff: RunDiff) -> str:
    """One self-contained page (no JavaScript, styled as report.html) from the JSON document."""
    return _environment().get_template("diff.html.j2").render(diff=diff_document(diff))


_RENDERERS = {"text": diff_to_text, "json": diff_to_json, "html": diff_to_html}


def render_diff(diff: RunDiff, fmt: str) -> str:
    """The comparison in one of DIFF_FORMATS."""
    return _RENDERERS[fmt](diff)
