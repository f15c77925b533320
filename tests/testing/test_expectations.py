"""`# expect:` comments in fixture scripts: how they are read, how a malformed one is refused, and how findings
are compared with them (gpudoctor.testing.expectations)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpudoctor.testing import (
    Expectation,
    ExpectationError,
    Expectations,
    check_findings,
    parse_expectations,
    read_expectations,
)

SCRIPT = '''"""A training script."""
# expect: GD504 location=none severity=warning impact=0.3..0.6
loader = DataLoader(data)  # num_workers=0  # expect: GD101 severity=critical impact=0.6..0.95 category=data_starvation
x = x.to(device, non_blocking=True)  # expect: GD201 severity=warning; GD202 severity=info count=5
pool = Pool(2)  # expect: GD502 impact=none  # forked after CUDA init
note = "# expect: GD999"
'''


def finding(code: str, line: int | None, *, severity: str = "warning", impact: float | None = 0.5,
            file: str = "/elsewhere/train.py", **fields: Any) -> dict[str, Any]:
    """A finding dict as in findings.json, with only the fields the comparison reads."""
    location = None if line is None else {"file": file, "line": line, "function": "main"}
    return {"code": code, "severity": severity, "impact": impact, "location": location, "category": "data_starvation",
            "impact_reason": None if impact is not None else "a correctness risk", "count": 1, "title": f"{code} here",
            **fields}


def matching() -> list[dict[str, Any]]:
    """The findings SCRIPT expects, as a rule would make them."""
    return [finding("GD504", None, impact=0.4), finding("GD101", 3, severity="critical", impact=0.8),
            finding("GD201", 4), finding("GD202", 4, severity="info", count=5), finding("GD502", 5, impact=None)]


def parsed() -> Expectations:
    return parse_expectations(SCRIPT, "train.py")


def test_each_comment_becomes_a_typed_expectation() -> None:
    expected = parsed()
    assert expected.annotated and expected.codes == {"GD504", "GD101", "GD201", "GD202", "GD502"}
    assert expected.items[0] == Expectation("GD504", None, 2, severity="warning", impact=(0.3, 0.6))
    assert expected.items[1] == Expectation("GD101", 3, 3, severity="critical", impact=(0.6, 0.95),
                                            category="data_starvation")
    assert expected.items[4] == Expectation("GD502", 5, 5, no_impact=True)
    with pytest.raises(AttributeError):
        expected.items[0].line = 7  # type: ignore[misc]  # frozen


def test_several_expectations_on_one_line() -> None:
    on_line_4 = [e for e in parsed().items if e.written_at == 4]
    assert on_line_4 == [Expectation("GD201", 4, 4, severity="warning"),
                         Expectation("GD202", 4, 4, severity="info", count=5)]


def test_a_string_that_looks_like_an_expectation_is_not_one() -> None:
    assert "GD999" not in parsed().codes


def test_expect_none_and_no_comment_at_all_differ() -> None:
    nothing = parse_expectations('"""Healthy."""\n# expect: none\nrun()\n', "healthy.py")
    assert nothing.annotated and not nothing.items
    assert check_findings([], nothing) == []
    silent = parse_expectations("run()\n", "new.py")
    [mismatch] = check_findings([], silent)
    assert not silent.annotated and "no `# expect:` comment" in str(mismatch)


@pytest.mark.parametrize(("comment", "says"), [
    ("# expect: GD101 severity=fatal", "severity=fatal: use one of info, warning, critical"),
    ("# expect: GD101 impact=0.9..0.1", "impact=0.9..0.1: write a range LOW..HIGH"),
    ("# expect: GD101 impact=high", "impact=high"),
    ("# expect: GD101 impact=0.5", "impact=0.5"),
    ("# expect: GD101 severity", "'severity' is not key=value"),
    ("# expect: GD101 line=3", "unknown key 'line'"),
    ("# expect: GD101 severity=info severity=warning", "severity is given twice"),
    ("# expect: GD101 count=0", "count=0: a whole number"),
    ("# expect: GD101 category=slow", "category=slow: use one of"),
    ("# expect: gd101", "'gd101' is not a rule code"),
    ("# expect:", "an empty expectation"),
    ("# expect: GD101;", "an empty expectation"),
    ("# expect: GD101 location=3", "location=3: write none, or FILE:LINE"),
    ("# expect: GD101 location=none", "location=none goes on a comment line of its own"),
    ("# expect: GD101 location=_helpers.py:74", "location=_helpers.py:74 goes on a comment line of its own"),
])
def test_a_malformed_expectation_is_refused_naming_file_and_line(comment: str, says: str) -> None:
    with pytest.raises(ExpectationError) as raised:
        parse_expectations(f"import torch\nloader = DataLoader(data)  {comment}\n", "fixtures/scripts/starved.py")
    assert str(raised.value).startswith("fixtures/scripts/starved.py:2: ")
    assert says in str(raised.value)


def test_a_located_expectation_on_a_line_of_its_own_is_refused() -> None:
    with pytest.raises(ExpectationError, match=r"^train\.py:2: .*on a line of its own, write location=none"):
        parse_expectations("import torch\n# expect: GD101\n", "train.py")


def test_a_finding_in_a_helper_module_is_expected_by_its_file_and_line() -> None:
    expected = parse_expectations("import torch\n# expect: GD311 location=_helpers.py:74 category=precision\n",
                                  "fixtures/scripts/fp32.py")
    in_helper = {"code": "GD311", "severity": "warning", "category": "precision", "impact": 0.6, "title": "fp32",
                 "location": {"file": "/elsewhere/fixtures/scripts/_helpers.py", "line": 74}}
    assert check_findings([in_helper], expected) == []
    other_line = {**in_helper, "location": {**in_helper["location"], "line": 75}}
    assert [str(m) for m in check_findings([other_line], expected)] == [
        ("fixtures/scripts/fp32.py: unexpected GD311 finding at /elsewhere/fixtures/scripts/_helpers.py:75 "
         "(severity=warning impact=0.6): 'fp32'"),
        ("fixtures/scripts/fp32.py:2: expected GD311 location=_helpers.py:74 category=precision, but no GD311 "
         "finding points at _helpers.py:74 (GD311 at: /elsewhere/fixtures/scripts/_helpers.py:75)")]


def test_expect_none_stands_alone() -> None:
    with pytest.raises(ExpectationError, match=r"^train\.py:1: .*line 2 expects GD101"):
        parse_expectations("# expect: none\nrun()  # expect: GD101\n", "train.py")
    with pytest.raises(ExpectationError, match=r"^train\.py:3: .*already written on line 1"):
        parse_expectations("# expect: none\nrun()\n# expect: none\n", "train.py")


def test_a_script_read_from_disk_is_named_in_its_errors(tmp_path: Path) -> None:
    script = tmp_path / "starved.py"
    script.write_text("import torch\n\nrun()  # expect: GD101 severity=loud\n", encoding="utf-8")
    with pytest.raises(ExpectationError, match=rf"^{script}:3: "):
        read_expectations(script)
    script.write_text("def broken(:\n", encoding="utf-8")
    with pytest.raises(ExpectationError, match="not valid Python"):
        read_expectations(script)


def test_findings_that_meet_every_expectation_match() -> None:
    assert check_findings(matching(), parsed()) == []


def test_a_finding_at_another_line_names_both_lines() -> None:
    findings = [f if f["code"] != "GD101" else {**f, "location": {**f["location"], "line": 7}} for f in matching()]
    mismatches = [str(m) for m in check_findings(findings, parsed())]
    assert mismatches == [
        ("train.py:3: expected GD101 severity=critical impact=0.6..0.95 category=data_starvation, but no GD101 finding "
         "points at this line (GD101 at: line 7)"),
        "train.py:7: unexpected GD101 finding (severity=critical impact=0.8): 'GD101 here'",
    ]


def test_a_wrong_field_names_the_script_line_of_its_expectation() -> None:
    findings = [{**f, "severity": "info", "impact": 0.1} if f["code"] == "GD504" else f for f in matching()]
    findings = [{**f, "count": 4} if f["code"] == "GD202" else f for f in findings]
    assert [str(m) for m in check_findings(findings, parsed())] == [
        "train.py:2: GD504: severity 'info', expected 'warning'",
        "train.py:2: GD504: impact 0.1, expected 0.3..0.6",
        "train.py:4: GD202: count 4, expected 5",
    ]


def test_a_rule_that_stops_firing_or_fires_once_more_is_reported() -> None:
    findings = [f for f in matching() if f["code"] != "GD502"] + [finding("GD101", None, title="where?")]
    assert [str(m) for m in check_findings(findings, parsed())] == [
        "train.py: unexpected GD101 finding without a location (severity=warning impact=0.5): 'where?'",
        "train.py:5: expected GD502 impact=none, but GD502 found nothing",
    ]


def test_an_unestimated_impact_must_say_why() -> None:
    findings = [{**f, "impact_reason": None} if f["code"] == "GD502" else f for f in matching()]
    [mismatch] = check_findings(findings, parsed())
    assert str(mismatch) == "train.py:5: GD502: has no impact and no impact_reason saying why"


def test_a_finding_in_another_file_is_not_at_the_script_line() -> None:
    findings = matching()
    findings[1] = finding("GD101", 3, severity="critical", impact=0.8, file="/work/other.py")
    mismatches = [str(m) for m in check_findings(findings, parsed())]
    assert "train.py: unexpected GD101 finding at /work/other.py:3 (severity=critical impact=0.8): 'GD101 here'" \
        in mismatches


def test_codes_restrict_the_comparison_to_the_rules_that_ran() -> None:
    only_gd101 = [f for f in matching() if f["code"] == "GD101"]
    assert check_findings(only_gd101, parsed(), codes={"GD101"}) == []
    assert len(check_findings(only_gd101, parsed())) == 4  # the other four expectations are unmet


def test_the_engines_records_are_compared_as_their_json() -> None:
    class Record:
        def __init__(self, plain: dict[str, Any]) -> None:
            self.plain = plain

        def to_json(self) -> dict[str, Any]:
            return self.plain

    assert check_findings([Record(f) for f in matching()], parsed()) == []
