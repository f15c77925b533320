"""`gpudoctor diff BEFORE AFTER`: read two runs and compare them (report.diff), then write the comparison.

A run is a run directory or a findings.json. A run directory's findings.json is read when it has one (typed, as
gpudoctor.bundle.findings reads its records); a bundle without one is analysed now, with the project's rules, as
`gpudoctor analyze` would (its outputs are not written). The rules that the project loads also say which codes
and names are aliases of which rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import IO, Annotated

import msgspec

from gpudoctor.bundle import FINDINGS, SCHEMA_VERSION
from gpudoctor.bundle.confined import bundle_file
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.bundle.jsonio import decode_error
from gpudoctor.engine.project import RuleSelection, load_project_rules, prepare_rules, refuse_project_inside
from gpudoctor.errors import BundleError, InputNotFoundError, OutputNotWritableError
from gpudoctor.pipeline.diagnosis import diagnose
from gpudoctor.pipeline.writing import report_of
from gpudoctor.report.diff import RunDiff, RunFindings, Source, canonical_codes, compare
from gpudoctor.report.diff_render import render_diff
from gpudoctor.report.render import findings_document

__all__ = ["compare_runs", "diff_text", "read_run", "write_file"]

MAX_FINDINGS_BYTES = 256 << 20  # findings.json holds at most 1,000 findings per rule: a file this large is not one


class _Version(msgspec.Struct):
    schema_version: int


class _RunFacts(msgspec.Struct, frozen=True):
    """The facts of findings.json's `run` that a comparison shows; the others are not read."""

    median_step_s: Annotated[float, msgspec.Meta(ge=0)] | None
    steps_analysed: Annotated[int, msgspec.Meta(ge=0)]
    step_s: Annotated[float, msgspec.Meta(ge=0)] | None = None  # absent from a findings.json written before it
    command: str | None = None
    script: str | None = None


class _FindingsFile(msgspec.Struct, frozen=True):
    """The part of findings.json (gpudoctor/schemas/findings.schema.json) a comparison reads."""

    schema_version: int
    run: _RunFacts
    findings: list[FindingRecord]


def _decode(path: Path, raw: bytes) -> _FindingsFile:
    try:
        version = msgspec.json.decode(raw, type=_Version).schema_version
        if version != SCHEMA_VERSION:
            raise BundleError(f"{path} was written with findings schema version {version}, and this gpudoctor reads "
                              f"version {SCHEMA_VERSION}: analyse the run again with `gpudoctor analyze`.")
        return msgspec.json.decode(raw, type=_FindingsFile)
    except (msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
        raise decode_error(path, exc) from None
    except msgspec.DecodeError as exc:  # not JSON at all: truncated, empty, another kind of file
        raise BundleError(f"{path} is corrupt: it is not valid JSON ({exc}).") from None


def _read_findings(path: Path) -> _FindingsFile:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FINDINGS_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"{path} cannot be read ({exc.strerror}).") from None
    if len(raw) > MAX_FINDINGS_BYTES:
        raise BundleError(f"{path} is not a findings.json: it is larger than {MAX_FINDINGS_BYTES >> 20} MB.")
    return _decode(path, raw)


def _analysed(run_dir: Path, rule_paths: Sequence[str], progress: IO[str] | None) -> _FindingsFile:
    """A bundle (or a job's run directory) without findings.json, analysed now as `gpudoctor analyze` would, its
    findings read back typed (nothing is written into it, not even its ranks' reports)."""
    diagnosis = diagnose([run_dir], prepare_rules(RuleSelection(paths=tuple(rule_paths))), progress)
    return msgspec.convert(findings_document(report_of(diagnosis)), _FindingsFile)


def _read(path: Path, rule_paths: Sequence[str], progress: IO[str] | None) -> tuple[_FindingsFile, Source]:
    if not path.is_dir():
        return _read_findings(path), "findings.json"
    findings = bundle_file(path, FINDINGS)  # never a link out of the run directory
    if findings is None:
        return _analysed(path, rule_paths, progress), "analysed"
    return _read_findings(findings), "findings.json"


def read_run(path: Path, rule_paths: Sequence[str] = (), progress: IO[str] | None = None) -> RunFindings:
    """A run directory or its findings.json; a directory without findings.json is analysed (see the module)."""
    if not path.exists():
        raise InputNotFoundError(f"{path} does not exist.")
    facts, source = _read(path, rule_paths, progress)
    return RunFindings(path=str(path), source=source, command=facts.run.command or facts.run.script,
                       median_step_s=facts.run.median_step_s, step_s=facts.run.step_s,
                       steps_analysed=facts.run.steps_analysed,
                       findings=tuple(facts.findings))


def compare_runs(before: Path, after: Path, rule_paths: Sequence[str] = (), progress: IO[str] | None = None) -> RunDiff:
    """Read both runs (both paths are checked before either is analysed) and compare them."""
    for path in (before, after):
        if not path.exists():
            raise InputNotFoundError(f"{path} does not exist.")
    refuse_project_inside((before, after))
    canonical = canonical_codes(load_project_rules(rule_paths).rules)
    return compare(read_run(before, rule_paths, progress), read_run(after, rule_paths, progress), canonical)


def diff_text(before: Path, after: Path, rule_paths: Sequence[str], output_format: str,
              progress: IO[str] | None = None) -> str:
    """The comparison of two runs, rendered as text, json or html."""
    return render_diff(compare_runs(before, after, rule_paths, progress), output_format)


def write_file(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write {path} ({exc.strerror}).") from None
