"""Nothing a custom rule does can take the run down: a Finding findings.json cannot hold, a rule that never ends or
never stops yielding, each becomes one error row naming the rule; every other rule's findings and the report are
still written, findings.json stays strict and schema-valid, and the script's exit status is untouched."""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, Gpudoctor, checked_findings, script
from gpudoctor.engine import builtin_rules, load_rules, run_rules
from gpudoctor.engine.isolation import RULE_THREAD_PREFIX, RuleLimits
from gpudoctor.testing import load_fixture

STARVED = REPO / "fixtures" / "bundles" / "data_starvation_bad"
DOC = "A rule under test.\n\n    What it detects: a test.\n\n    Why it matters: tests.\n\n    Fix: none.\n    "


def rule_file(directory: Path, body: str, code: str = "ACME101") -> Path:
    path = directory / f"{code.lower()}.py"
    header = (f'import math\n\nfrom gpudoctor import Finding, rule\n\n\n@rule("{code}", "a-rule", '
              f'category="data_starvation")\ndef a_rule(run):\n    """{DOC}"""\n')
    path.write_text(header + textwrap.indent(body, "    ") + "\n", encoding="utf-8")
    return path


BAD_FINDINGS = {
    'yield Finding("x", impact="high")': "impact (a share of step time, 0-1) must be a number, not str",
    'yield Finding("x", location="x.py:3")': "location must be a gpudoctor.analysis.Location",
    'yield Finding("x", severity="apocalyptic")': "severity must be one of info, warning, critical",
    'yield Finding("x", evidence={"wait": math.nan})': "evidence 'wait' must be a finite number, not nan",
    'yield Finding("x", evidence={"wait": (math.inf, "ms")})': "evidence 'wait' must be a finite number, not inf",
    'yield Finding("x", impact=math.nan)': "must be a finite number, not nan",
    'yield Finding(42)': "title must be text, not int",
    'yield Finding("x", count=0)': "count must be a whole number of at least 1",
}


@pytest.mark.parametrize("body", sorted(BAD_FINDINGS))
def test_a_finding_that_findings_json_cannot_hold_is_the_rules_error(tmp_path: Path, body: str) -> None:
    rules = [*builtin_rules(), *load_rules([str(rule_file(tmp_path, body))], builtins=False)]
    result = run_rules(load_fixture("data_starvation_bad"), rules)
    assert [e.code for e in result.errors] == ["ACME101"]
    assert BAD_FINDINGS[body] in result.errors[0].error, result.errors[0].error
    assert "GD101" in {f.code for f in result.findings}  # the built-in rules' findings are all still there


def test_a_rule_that_does_not_end_is_left_behind_at_its_time_limit(tmp_path: Path) -> None:
    # It sleeps rather than spins, so that what is left behind costs the rest of this test session nothing;
    # a spinning rule (`while True: pass`) is left behind the same way in the analyze test below. The test waits
    # for it to end: a rule's thread still running keeps a job's ranks from being forked (job.parallel), and the
    # tests of that ran after this one, within its sleep, when the end-to-end tests were left out.
    body = "import time\ntime.sleep(10)\nyield"
    rules = load_rules([str(rule_file(tmp_path, body))], builtins=False)
    started = time.monotonic()
    result = run_rules(load_fixture("data_starvation_bad"), rules, limits=RuleLimits(time_s=0.5))
    assert time.monotonic() - started < 8
    (error,) = result.errors
    assert error.error.startswith("RuleTimedOut: rule ACME101 was still running after 0.5 s")
    assert "a_rule" in error.traceback  # where it was when it was left behind
    left = [t for t in threading.enumerate() if t.name.startswith(RULE_THREAD_PREFIX)]
    assert left and all(t.is_alive() for t in left)
    for thread in left:
        thread.join(30)


def test_a_rule_that_never_stops_yielding_is_cut_at_the_cap(tmp_path: Path) -> None:
    rules = load_rules([str(rule_file(tmp_path, 'while True:\n    yield Finding("again")'))], builtins=False)
    result = run_rules(load_fixture("data_starvation_bad"), rules, limits=RuleLimits(max_findings=50))
    assert result.findings == []
    assert result.errors[0].error.startswith("TooManyFindings: rule ACME101 yielded more than 50 findings")


def test_analyze_writes_everything_else_and_exits_0(tmp_path: Path, gd: Gpudoctor) -> None:
    rule_file(gd.cwd, 'yield Finding("x", impact="high")')
    rule_file(gd.cwd, "while True:\n    pass\nyield", code="ACME102")
    (gd.cwd / "pyproject.toml").write_text("[tool.gpudoctor]\nrule_timeout = 1\n", encoding="utf-8")
    result = gd.run("analyze", str(STARVED), "--out", "out", "--rules", "acme101.py", "--rules", "acme102.py")
    assert result.returncode == 0, result
    findings = checked_findings(gd.cwd / "out" / "findings.json")
    assert {e["code"] for e in findings["errors"]} == {"ACME101", "ACME102"}
    assert "GD101" in {f["code"] for f in findings["findings"]}
    assert (gd.cwd / "out" / "report.html").is_file()
    assert "rule ACME101 failed" in result.stderr and "rule ACME102 failed" in result.stderr


def test_under_profile_the_scripts_status_is_untouched(gd: Gpudoctor) -> None:
    rule_file(gd.cwd, 'yield Finding("x", severity="apocalyptic")')
    result = gd.profile(script("train_loop.py"), "--steps", "6", options=(
        "--wait-steps", "1", "--warmup-steps", "1", "--active-steps", "2", "--rules", "acme101.py"))
    assert result.returncode == 0, result
    assert [e["code"] for e in result.findings()["errors"]] == ["ACME101"]


def test_a_rule_timeout_that_is_not_a_number_is_refused_before_anything_runs(gd: Gpudoctor) -> None:
    (gd.cwd / "pyproject.toml").write_text('[tool.gpudoctor]\nrule_timeout = "soon"\n', encoding="utf-8")
    result = gd.run("analyze", str(STARVED), "--out", "out")
    assert result.returncode == 2
    assert "rule_timeout must be a number of seconds above 0" in result.first_message


def test_the_command_line_sets_the_rule_time_limit(gd: Gpudoctor) -> None:
    rule_file(gd.cwd, "import time\ntime.sleep(30)\nyield")
    started = time.monotonic()
    result = gd.run("analyze", str(STARVED), "--out", "out", "--rules", "acme101.py", "--rule-timeout", "0.5")
    assert result.returncode == 0, result
    assert time.monotonic() - started < 25
    (error,) = checked_findings(gd.cwd / "out" / "findings.json")["errors"]
    assert error["error"].startswith("RuleTimedOut: rule ACME101 was still running after 0.5 s")
