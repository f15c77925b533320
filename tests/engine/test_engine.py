"""The rule engine: isolation, not-evaluated, merging, ranking, validation at declaration, rules as plain
functions, and the finding records."""

import json

import pytest

from gpudoctor import Finding, NotEvaluated, Run, rule
from gpudoctor.analysis.views import Location
from gpudoctor.bundle.findings import FindingRecord, NotEvaluatedRecord, RuleErrorRecord
from gpudoctor.bundle.manifest import Manifest
from gpudoctor.engine import run_rules
from gpudoctor.errors import BundleError, RuleLoadError


def empty_run() -> Run:
    return Run(Manifest(schema_version=1), [], None, [], [], [])


@rule("TST101", "always-fires", category="data_starvation")
def always_fires(run, impact: float = 0.3):
    """Fires once per call with the given impact."""
    yield Finding("fires", impact=impact, location=Location("train.py", 7, "main"))
    yield Finding("fires again", impact=impact, location=Location("train.py", 7, "main"))


@rule("TST102", "raises", category="sync_point")
def raises(run):
    """Raises."""
    raise ValueError("boom")


@rule("TST103", "needs-gpu", category="small_batch")
def needs_gpu(run):
    """Needs a GPU timeline."""
    run.require_gpu()
    yield Finding("never")


@rule("TST104", "small", category="cpu_contention", severity="critical")
def small(run):
    """Fires with a small impact."""
    yield Finding("small", impact=0.05)


def test_a_failing_rule_becomes_an_error_and_the_others_still_run():
    result = run_rules(empty_run(), [raises, always_fires, needs_gpu, small])
    assert [e.code for e in result.errors] == ["TST102"]
    assert "ValueError: boom" in result.errors[0].error
    assert [n.code for n in result.not_evaluated] == ["TST103"]
    assert "no profiler trace" in result.not_evaluated[0].reason
    assert [f.code for f in result.findings] == ["TST101", "TST104"]  # ranked by impact


def test_findings_from_one_call_site_are_merged_with_counts():
    result = run_rules(empty_run(), [always_fires])
    assert len(result.findings) == 1
    assert result.findings[0].count == 2
    assert result.findings[0].to_json()["location"] == {"file": "train.py", "line": 7, "function": "main"}


def test_options_are_overridable():
    result = run_rules(empty_run(), [always_fires], {"TST101": {"impact": 0.9}})
    assert result.findings[0].impact == 0.9


def test_impact_is_clamped_to_a_share_and_a_large_one_is_not_cut_to_a_ceiling():
    assert run_rules(empty_run(), [always_fires], {"TST101": {"impact": 3.0}}).findings[0].impact == 1.0
    assert run_rules(empty_run(), [always_fires], {"TST101": {"impact": 0.99}}).findings[0].impact == 0.99


@pytest.mark.parametrize(
    ("code", "name", "category", "message"),
    [
        ("acme1", "x", "data_starvation", "malformed"),
        ("ACME101", "Not Kebab", "data_starvation", "kebab-case"),
        ("ACME101", "ok-name", "slow_stuff", "category 'slow_stuff' is unknown"),
    ],
)
def test_declaration_errors_name_the_fix(code, name, category, message):
    with pytest.raises(RuleLoadError, match=message):
        rule(code, name, category=category)(always_fires.rule.func)


def test_a_rule_says_where_it_is_defined_without_reading_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file and the line of its first decorator, as inspect.getsourcelines gives them, read from the code:
    declaring a rule reads no source (that took 50 ms of each analysis for the built-in rules)."""
    import inspect

    expected = f"{__file__}:{inspect.getsourcelines(always_fires)[1]}"
    read: list[object] = []
    findsource = inspect.findsource
    monkeypatch.setattr(inspect, "findsource", lambda obj: read.append(obj) or findsource(obj))
    where = always_fires.rule.where
    with pytest.raises(RuleLoadError) as refused:
        rule("bad", "bad-code", category="data_starvation")(always_fires.rule.func)
    monkeypatch.undo()
    assert where == expected and str(refused.value).startswith(f"{expected}: rule code 'bad'")
    assert read == []


def test_an_option_without_a_default_is_refused():
    def no_default(run, threshold):
        """Doc."""

    with pytest.raises(RuleLoadError, match="'threshold' needs a default"):
        rule("ACME102", "no-default", category="data_starvation")(no_default)


def test_a_rule_without_docs_is_refused():
    def undocumented(run):
        return []

    with pytest.raises(RuleLoadError, match="no docstring"):
        rule("ACME103", "undocumented", category="data_starvation")(undocumented)


def test_not_evaluated_is_raised_by_views_not_swallowed_as_pass():
    with pytest.raises(NotEvaluated):
        empty_run().require_steps()


# -- a rule is its function ------------------------------------------------------------------------
def test_a_rule_is_still_its_function_and_can_be_called_on_a_run():
    found = list(always_fires(empty_run(), impact=0.4))
    assert [f.title for f in found] == ["fires", "fires again"]
    assert all(isinstance(f, Finding) and f.impact == 0.4 for f in found)
    assert (always_fires.rule.code, always_fires.rule.func) == ("TST101", always_fires)
    assert always_fires.rule.options == {"impact": 0.3}


def test_run_rules_takes_rules_or_their_functions():
    by_function = run_rules(empty_run(), [always_fires]).findings
    by_rule = run_rules(empty_run(), [always_fires.rule]).findings
    assert by_function == by_rule
    with pytest.raises(TypeError, match="not a rule"):
        run_rules(empty_run(), [lambda run: []])


# -- finding records -------------------------------------------------------------------------------
def test_a_finding_record_is_findings_json_and_back():
    [record] = run_rules(empty_run(), [always_fires]).findings
    as_json = record.to_json()
    assert list(as_json) == ["code", "name", "category", "severity", "title", "impact", "impact_reason", "saving_s",
                             "evidence", "location", "fix", "count", "doc"]  # findings.json's keys, in its order
    assert FindingRecord.from_json(as_json) == record
    assert FindingRecord.from_json(json.loads(json.dumps(as_json))) == record


def test_a_finding_record_with_a_wrong_type_is_refused_in_one_sentence():
    [record] = run_rules(empty_run(), [always_fires]).findings
    with pytest.raises(BundleError) as caught:
        FindingRecord.from_json({**record.to_json(), "impact": "high"})
    assert str(caught.value) == (
        "findings.json: a finding is not valid: expected `float | null`, got `str` at `$.impact`.")
    with pytest.raises(BundleError, match=r"a finding is not valid: .* at `\$.evidence\[0\].value`"):
        FindingRecord.from_json({**record.to_json(), "evidence": [{"name": "x", "value": [1, 2], "unit": None}]})
    with pytest.raises(BundleError, match="a not-evaluated row is not valid: object missing required field `reason`"):
        NotEvaluatedRecord.from_json({"code": "TST103", "name": "needs-gpu"})
    with pytest.raises(BundleError, match="a rule error row is not valid"):
        RuleErrorRecord.from_json({"code": "TST102", "name": "raises", "source": "built-in", "error": 3})


@rule("TST201", "tf32-rung", category="precision")
def tf32_rung(run):
    """A fix of its own: TF32."""
    from gpudoctor import Remedy

    yield Finding("TF32 saves", impact=0.4, remedy=Remedy(matmul_precision="high"))


@rule("TST202", "bf16-rung", category="precision")
def bf16_rung(run):
    """A fix that holds TF32's: bf16 autocast with TF32 on."""
    from gpudoctor import Remedy

    yield Finding("bf16 saves", impact=0.6, remedy=Remedy(autocast="bfloat16", matmul_precision="high"))


def test_a_fix_another_holds_keeps_its_saving_and_is_counted_once_in_the_headline(tmp_path) -> None:
    """Two rungs of one ladder: TF32 alone, and bf16 autocast with TF32. Each keeps the what-if of its own fix; the
    smaller is counted in the larger (counted_in), and together they save the larger's 60%, not 100%."""
    from gpudoctor.report.verdict import saving_together
    from gpudoctor.testing import BundleBuilder

    b = BundleBuilder(tmp_path)
    b.steps(10, wall_s=0.01, gpu_busy_s=0.0095)
    found = {f.code: f for f in run_rules(b.build(), [tf32_rung, bf16_rung]).findings}
    assert found["TST202"].impact == 0.6 and found["TST202"].counted_in is None
    assert found["TST201"].impact == 0.4 and found["TST201"].counted_in == "TST202"
    assert saving_together(list(found.values())) == pytest.approx(0.6)
