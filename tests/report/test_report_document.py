"""The Report's TypedDicts (gpudoctor.report.document) describe the very dicts the report is made of.

mypy checks the code that builds and reads them; these tests check the dicts themselves against the types at run
time: every key the types require is there with a value of its type, and no key is there that they do not declare
(msgspec drops unknown keys, so the round trip would differ).
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import msgspec
import pytest

from gpudoctor.analysis import Run
from gpudoctor.bundle.findings import FindingJson
from gpudoctor.pipeline import PreparedRules, RuleSelection, diagnose, diagnose_run, prepare_rules, report_of
from gpudoctor.report.document import FindingsDocument, Report
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import findings_document, to_json
from gpudoctor.testing import available_fixtures, fixture_path

FIXTURES = available_fixtures()


@pytest.fixture(scope="module")
def builtin_rules() -> PreparedRules:
    return prepare_rules(RuleSelection())


def _typed_as(value: object, kind: type) -> object:
    """`value` as its type sees it: every declared key, checked; undeclared keys dropped."""
    return msgspec.to_builtins(msgspec.convert(value, kind, strict=True))


@pytest.mark.parametrize("name", FIXTURES)
def test_a_fixtures_report_is_exactly_a_report(name: str, builtin_rules: PreparedRules, tmp_path: Path) -> None:
    report = link_outputs(report_of(diagnose([fixture_path(name)], builtin_rules)), tmp_path)
    assert _typed_as(report, Report) == report


def test_a_trace_only_report_is_exactly_a_report(builtin_rules: PreparedRules) -> None:
    report = report_of(diagnose_run(Run.from_trace(fixture_path("healthy_trainer") / "trace.json.gz"), builtin_rules))
    assert report["run"]["trace_only"]
    assert _typed_as(report, Report) == report


def test_findings_of_several_windows_have_their_windows(builtin_rules: PreparedRules) -> None:
    report = report_of(diagnose([fixture_path("data_starvation_late")], builtin_rules))
    assert len(report["windows"]) > 1 and all("windows" in f for f in report["findings"])
    assert [_typed_as(f, FindingJson) for f in report["findings"]] == report["findings"]


def test_findings_json_holds_the_documents_keys_in_order(builtin_rules: PreparedRules) -> None:
    report = report_of(diagnose([fixture_path("data_starvation_bad")], builtin_rules))
    written = json.loads(to_json(report))
    assert list(written) == list(typing.get_type_hints(FindingsDocument))
    assert written == json.loads(json.dumps(findings_document(report), default=str))
    assert _typed_as(written, FindingsDocument) == written
