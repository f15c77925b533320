"""Outputs for machines: findings.json against its shipped JSON Schema, --format, and --fail-on's exit status."""

from __future__ import annotations

import json

import jsonschema
import pytest

from conftest import Gpudoctor, Result
from gpudoctor.paths import findings_schema
from gpudoctor.pipeline import RuleSelection, diagnose, prepare_rules, report_of
from gpudoctor.report.render import to_json
from gpudoctor.testing import available_fixtures, fixture_path

FIXTURES = available_fixtures()


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(findings_schema().read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def builtin_rules():
    return prepare_rules(RuleSelection())


def _errors(validator: jsonschema.Draft202012Validator, document: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_every_fixture_is_recorded() -> None:
    assert len(FIXTURES) >= 20, FIXTURES


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_findings_json_matches_the_schema(name: str, validator, builtin_rules) -> None:
    findings = json.loads(to_json(report_of(diagnose([fixture_path(name)], builtin_rules))))
    assert not _errors(validator, findings)


def test_a_real_profile_matches_the_schema(training_run: Result, validator) -> None:
    assert not _errors(validator, training_run.findings())


def test_the_schema_rejects_a_broken_finding(training_run: Result, validator) -> None:
    findings = training_run.findings()
    assert findings["findings"], "the training run should have a finding to break"
    findings["findings"][0] = {**findings["findings"][0], "severity": "fatal", "impact": 1.5}
    assert len(_errors(validator, findings)) == 2


def test_format_selects_what_is_written(gd: Gpudoctor) -> None:
    bundle = str(fixture_path("data_starvation_bad"))
    only_json = gd.run("analyze", bundle, "--out", "a", "--format", "json")
    assert only_json.returncode == 0 and sorted(p.name for p in (gd.cwd / "a").iterdir()) == ["findings.json"]
    assert "gpudoctor:" not in only_json.stderr  # no terminal summary unless text is asked for
    text_only = gd.run("analyze", bundle, "--out", "b", "--format", "text")
    assert text_only.returncode == 0 and not list((gd.cwd / "b").iterdir())
    assert text_only.stderr.startswith("gpudoctor: 1 problem;") and "GD101" in text_only.stderr
    both = gd.run("analyze", bundle, "--out", "c", "--format", "html", "--format", "TEXT,json")
    assert both.returncode == 0 and sorted(p.name for p in (gd.cwd / "c").iterdir()) == ["findings.json", "report.html"]
    assert "report: " in both.stderr
    default = gd.run("analyze", bundle, "--out", "d")
    assert sorted(p.name for p in (gd.cwd / "d").iterdir()) == ["findings.json", "report.html"]
    assert default.stderr.startswith("gpudoctor: ")
    bad = gd.run("analyze", bundle, "--out", "e", "--format", "pdf")
    assert bad.returncode == 2 and "--format takes text, json, html" in bad.stderr


def test_fail_on_exits_10_and_says_so_in_help(gd: Gpudoctor) -> None:
    bundle = str(fixture_path("data_starvation_bad"))  # one critical finding
    assert gd.run("analyze", bundle, "--out", "a", "--fail-on", "critical").returncode == 10
    assert gd.run("analyze", str(fixture_path("healthy_vision")), "--out", "b", "--fail-on", "warning").returncode == 0
    for command in ("profile", "analyze"):
        shown = gd.run(command, "--help").stdout
        assert "Exit status" in shown and "10   --fail-on SEVERITY" in shown, shown
