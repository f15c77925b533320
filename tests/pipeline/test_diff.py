"""`gpudoctor diff BEFORE AFTER`: the comparison of two runs, its text, JSON and HTML, and its exit statuses.

The comparison runs on recorded GPU bundles (a starved run and its fix) and on findings.json files made from them,
changed where a test needs other findings. The page in a real browser is tested in test_report_html.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema
import pytest

from conftest import REPO, Gpudoctor, checked_findings
from gpudoctor.bundle.findings import FindingLocation, FindingRecord
from gpudoctor.engine import load_rules
from gpudoctor.paths import findings_schema, templates_dir
from gpudoctor.pipeline import RuleSelection, diagnose, prepare_rules, write
from gpudoctor.pipeline.diffing import compare_runs, read_run
from gpudoctor.report.diff import RunFindings, canonical_codes, compare, speedup
from gpudoctor.report.diff_render import diff_document, diff_schema, diff_to_text, speed_phrase
from gpudoctor.testing import BundleBuilder, fixture_path

BAD, FIXED = "data_starvation_bad", "data_starvation_fixed"
ALIASED_RULES = '''
from gpudoctor import rule


@rule("ACME102", "slow-shard-reader", category="data_starvation", aliases=("ACME101", "slow-reader"))
def slow_shard_reader(run):
    """Shards are read more slowly than the step consumes them.

    What it detects: a reader slower than the step.

    Why it matters: the GPU waits for data.

    Fix: read ahead.
    """
    return []
'''


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """findings.json of the starved run and of its fix, written as `gpudoctor analyze --format json` writes it."""
    written = {}
    for name in (BAD, FIXED):
        diagnosis = diagnose([fixture_path(name)], prepare_rules(RuleSelection()))
        written[name] = write(diagnosis, tmp_path_factory.mktemp(name), ("json",)).files["json"]
    return written


def _document(path: Path) -> dict:
    return checked_findings(path)  # the fixture's findings.json keeps to its schema before a test changes it


def _write(path: Path, document: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def _finding(code: str = "GD101", line: int | None = 10, title: str = "The step waits", impact: float | None = 0.5,
             name: str = "loader-in-main-process", file: str = "train.py") -> FindingRecord:
    location = FindingLocation(file=file, line=line, function="main") if line is not None else None
    return FindingRecord(code=code, name=name, category="data_starvation", severity="warning", title=title,
                         impact=impact, evidence=[], location=location, fix="num_workers=8")


def _run(*findings: FindingRecord, median_s: float | None = 0.1) -> RunFindings:
    return RunFindings(path="run", source="findings.json", command="train.py", median_step_s=median_s,
                       steps_analysed=5, findings=findings)


def _codes(records: tuple[FindingRecord, ...]) -> list[str]:
    return [r.code for r in records]


@functools.cache
def _diff_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(diff_schema().read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _checked_diff(text: str) -> dict:
    document = json.loads(text)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _diff_validator().iter_errors(document)]
    assert not errors, "the diff document breaks its schema: " + "; ".join(errors[:5])
    return document


# -- the comparison, on recorded runs --------------------------------------------------------------
def test_the_fix_of_a_starved_run_resolves_gd101() -> None:
    diff = compare_runs(fixture_path(BAD), fixture_path(FIXED))
    assert "GD101" in _codes(diff.resolved) and "GD101" not in [pair.after.code for pair in diff.remaining]
    assert diff.before.source == diff.after.source == "analysed"  # the recorded bundles have no findings.json
    assert diff.before.step_s and diff.after.step_s
    assert diff.speedup == pytest.approx(diff.before.step_s / diff.after.step_s)
    # The truth is the scripts' own timing of their plain runs (fixtures/measurements.json): 149.0 ms -> 31.7 ms,
    # 4.7x. The fix's median step (4.3 ms) is one its workers fed from their queue: 34x by medians.
    measured = json.loads((REPO / "fixtures" / "measurements.json").read_text())["fixtures"]
    plain = [measured[name]["plain"]["result"]["median_step_s"] for name in (BAD, FIXED)]
    assert diff.speedup == pytest.approx(plain[0] / plain[1], rel=0.15)


def test_an_older_findings_json_is_compared_by_its_median_step(analysed: dict[str, Path], tmp_path: Path) -> None:
    """A findings.json written before run.step_s existed: its median step is the step compared."""
    document = _document(analysed[BAD])
    del document["run"]["step_s"], document["run"]["step_s_basis"], document["run"]["step_s_steps"]
    older = read_run(_write(tmp_path / "older" / "findings.json", document))
    assert older.step_s is None and older.pace_s == document["run"]["median_step_s"]
    diff = compare(older, read_run(analysed[FIXED]))
    assert diff.speedup == pytest.approx(document["run"]["median_step_s"] / diff.after.step_s)


def test_a_run_against_itself_has_only_remaining_findings(analysed: dict[str, Path]) -> None:
    diff = compare_runs(analysed[BAD], analysed[BAD])
    assert diff.speedup == 1.0 and not diff.resolved and not diff.new
    assert [(p.before, p.after) for p in diff.remaining] == [(f, f) for f in diff.before.findings]
    assert diff.remaining and speed_phrase(diff.speedup) == "the same speed"


def test_findings_json_is_read_in_place_of_the_bundle(analysed: dict[str, Path], tmp_path: Path) -> None:
    """A run directory's findings.json, or the file itself, gives the same comparison as analysing the bundle."""
    run_dir = tmp_path / "run"
    _write(run_dir / "findings.json", _document(analysed[FIXED]))
    from_files = compare_runs(analysed[BAD], run_dir)
    from_bundles = compare_runs(fixture_path(BAD), fixture_path(FIXED))
    assert (from_files.before.source, from_files.after.source) == ("findings.json", "findings.json")
    for fate in ("resolved", "new", "remaining"):
        assert getattr(from_files, fate) == getattr(from_bundles, fate), fate
    assert from_files.speedup == pytest.approx(from_bundles.speedup)


# -- matching ----------------------------------------------------------------------------------------
def test_findings_match_by_rule_and_line() -> None:
    moved = _finding(line=11)
    retitled = _finding(title="The step waits less", impact=0.1)
    diff = compare(_run(_finding(), _finding(code="GD102", line=20)),
                   _run(retitled, moved, _finding(code="GD102", line=20, file="other.py")))
    assert [(p.before.title, p.after.title, p.after.impact) for p in diff.remaining] == [
        ("The step waits", "The step waits less", 0.1)]  # same rule, file and line: the same finding, changed
    assert [(f.code, f.location.line if f.location else None) for f in diff.resolved] == [("GD102", 20)]
    assert [(f.code, str(f.location)) for f in diff.new] == [("GD101", "train.py:11"), ("GD102", "other.py:20")]


def test_findings_without_a_location_match_by_title() -> None:
    diff = compare(_run(_finding(line=None, title="Other processes use 14 cores"), _finding(line=None, title="A"),
                        _finding(line=None, title="C")),
                   _run(_finding(line=None, title="A", impact=0.2), _finding(line=None, title="B"),
                        _finding(line=None, title="D")))
    assert [p.after.title for p in diff.remaining] == ["A"]
    assert [f.title for f in diff.resolved] == ["Other processes use 14 cores", "C"]  # two left: which is which?
    assert [f.title for f in diff.new] == ["B", "D"]


def test_a_rules_one_finding_without_a_location_stays_itself_when_its_figures_change() -> None:
    before, after = "2 intra-op threads with 1.0 of 2 cores free", "2 intra-op threads with 0.8 of 2 cores free"
    diff = compare(_run(_finding(code="GD505", line=None, title=before)),
                   _run(_finding(code="GD505", line=None, title=after)))
    assert [p.after.title for p in diff.remaining] == [after]
    assert not diff.resolved and not diff.new


def test_a_renamed_rule_is_the_same_rule(tmp_path: Path) -> None:
    rules_file = tmp_path / "acme_rules.py"
    rules_file.write_text(ALIASED_RULES, encoding="utf-8")
    canonical = canonical_codes(load_rules([str(rules_file)]))
    old_code = _finding(code="ACME101", name="slow-reader")
    old_name = _finding(code="ACME100", name="slow-reader", line=30)  # a code no rule has now, a name it had
    now = (_finding(code="ACME102", name="slow-shard-reader"), _finding(code="ACME102", name="slow-shard-reader",
                                                                        line=30))
    diff = compare(_run(old_code, old_name), _run(*now), canonical)
    assert [(p.before.code, p.after.code) for p in diff.remaining] == [("ACME101", "ACME102"), ("ACME100", "ACME102")]
    assert not diff.resolved and not diff.new
    unaware = compare(_run(old_code, old_name), _run(*now))  # without the rule, the codes differ
    assert len(unaware.resolved) == len(unaware.new) == 2 and not unaware.remaining


def test_the_cli_knows_aliases_from_rules(gd: Gpudoctor, analysed: dict[str, Path]) -> None:
    rules_file = gd.cwd / "acme_rules.py"
    rules_file.write_text(ALIASED_RULES, encoding="utf-8")
    document = _document(analysed[BAD])
    old = {**document["findings"][0], "code": "ACME101", "name": "slow-reader"}
    before = _write(gd.cwd / "before" / "findings.json", {**document, "findings": [old]})
    after = _write(gd.cwd / "after" / "findings.json",
                   {**document, "findings": [{**old, "code": "ACME102", "name": "slow-shard-reader"}]})
    result = gd.run("diff", str(before), str(after), "--rules", str(rules_file), "--format", "json")
    assert result.returncode == 0, result
    diff = _checked_diff(result.stdout)
    assert [(f["before"]["code"], f["after"]["code"]) for f in diff["remaining"]] == [("ACME101", "ACME102")]
    assert not diff["resolved"] and not diff["new"]


def test_speed_phrases() -> None:
    assert speedup(0.0357, 0.0171) == pytest.approx(2.0877, abs=1e-4)
    assert speed_phrase(speedup(0.0357, 0.0171)) == "2.09x faster"
    assert speed_phrase(0.8) == "1.25x slower"
    assert speed_phrase(1.004) == "the same speed"
    assert speedup(None, 0.1) is None and speedup(0.1, 0.0) is None and speed_phrase(None) == "speed-up unknown"


# -- the command line ----------------------------------------------------------------------------------
def test_text_output(gd: Gpudoctor) -> None:
    result = gd.run("diff", str(fixture_path(BAD)), str(fixture_path(FIXED)))
    assert result.returncode == 0 and not result.stderr, result
    lines = result.stdout.splitlines()
    assert lines[0] == "step 145.0 ms -> 28.6 ms (5.06x faster); median step 145.9 ms -> 4.3 ms", lines
    resolved = lines.index("resolved (1):")
    assert lines[resolved + 1].startswith("  [critical] GD101 The GPU idles 84% of each step while the DataLoader")
    assert lines[resolved + 1].endswith("fixtures/scripts/data_starvation_bad.py:74 (was ~84% of step time)")
    assert "new: none" in lines and "remaining: none" in lines
    assert lines[-1] == f"analysed now, having no findings.json: {fixture_path(BAD)}, {fixture_path(FIXED)}"
    assert len(lines) <= 10  # a few lines a person reads


def test_text_output_of_remaining_findings(analysed: dict[str, Path], tmp_path: Path) -> None:
    document = _document(analysed[BAD])
    lighter = [{**f, "impact": 0.2, "severity": "warning"} for f in document["findings"]]
    before = read_run(analysed[BAD])
    after = read_run(_write(tmp_path / "lighter" / "findings.json", {**document, "findings": lighter}))
    text = diff_to_text(compare(before, after))
    assert "remaining (1):\n  [critical -> warning] GD101 " in text
    assert text.splitlines()[4].endswith("data_starvation_bad.py:74 (step time: ~84% -> ~20%)"), text


def test_json_output_keeps_to_its_schema(gd: Gpudoctor, analysed: dict[str, Path]) -> None:
    result = gd.run("diff", str(analysed[BAD].parent), str(analysed[FIXED].parent), "--format", "json")
    assert result.returncode == 0, result
    diff = _checked_diff(result.stdout)
    assert diff["before"]["median_step_s"] > diff["after"]["median_step_s"] > 0
    assert diff["before"]["step_s"] > diff["after"]["step_s"] > 0
    assert diff["speedup"] == pytest.approx(diff["before"]["step_s"] / diff["after"]["step_s"])
    assert [(f["code"], f["category"], f["after"]) for f in diff["resolved"]] == [("GD101", "data_starvation", None)]
    assert diff["new"] == []
    assert diff["remaining"] == [] and diff["before"]["source"] == "findings.json"
    itself = diff_document(compare_runs(analysed[BAD], analysed[BAD]))
    _checked_diff(json.dumps(itself))
    assert itself["speedup"] == 1.0 and [f["before"] == f["after"] for f in itself["remaining"]] == [True]


def test_html_out_file(gd: Gpudoctor, analysed: dict[str, Path]) -> None:
    """--out with .html writes the page (no --format needed) and says so in one line; nothing else on stdout."""
    page = gd.cwd / "compare.html"
    result = gd.run("diff", str(analysed[BAD]), str(analysed[FIXED]), "--out", str(page))
    assert result.returncode == 0 and not result.stdout, result
    assert result.messages == [f"gpudoctor: wrote the comparison to {page}."]
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and "GD101" in html
    assert "5.06x faster: step 145.0 ms → 28.6 ms" in html
    json_out = gd.run("diff", str(analysed[BAD]), str(analysed[FIXED]), "--format", "json", "--out", "d.txt")
    assert json_out.returncode == 0 and _checked_diff((gd.cwd / "d.txt").read_text())["resolved"]


def test_a_missing_path_exits_66(gd: Gpudoctor, analysed: dict[str, Path]) -> None:
    for args in (("nowhere", str(analysed[BAD])), (str(analysed[BAD]), "nowhere/findings.json")):
        result = gd.run("diff", *args)
        assert result.returncode == 66, result
        missing = args[0] if args[0].startswith("nowhere") else args[1]
        assert result.stderr == f"gpudoctor: {missing} does not exist.\n" and not result.stdout


@pytest.mark.parametrize(("what", "corrupt"), [
    ("truncated", lambda doc: json.dumps(doc)[:200].encode()),
    ("a wrong type", lambda doc: json.dumps({**doc, "run": {**doc["run"], "steps_analysed": "five"}}).encode()),
    ("a bad finding", lambda doc: json.dumps({**doc, "findings": [{**doc["findings"][0], "impact": 3}]}).encode()),
    ("another schema version", lambda doc: json.dumps({**doc, "schema_version": 2}).encode()),
    ("not an object", lambda doc: b"[1, 2]"),
    ("not UTF-8", lambda doc: json.dumps(doc).encode().replace(b'"findings"', b'"find\xffings"')),
    ("empty", lambda doc: b""),
])
def test_a_corrupt_findings_json_exits_65(gd: Gpudoctor, analysed: dict[str, Path], what: str, corrupt) -> None:
    bad = gd.cwd / "run" / "findings.json"
    bad.parent.mkdir()
    bad.write_bytes(corrupt(_document(analysed[BAD])))
    for args in ((str(bad.parent), str(analysed[FIXED])), (str(analysed[FIXED]), str(bad))):
        result = gd.run("diff", *args)
        assert result.returncode == 65, (what, result)
        assert len(result.messages) == 1 and result.stderr.count("\n") == 1, (what, result.stderr)
        assert result.first_message.startswith(f"gpudoctor: {bad} ") and result.first_message.endswith("."), what
        assert "Traceback" not in result.stderr and not result.stdout


def test_a_directory_that_is_no_run_exits_65(gd: Gpudoctor, analysed: dict[str, Path]) -> None:
    result = gd.run("diff", str(gd.cwd), str(analysed[FIXED]))
    assert result.returncode == 65, result
    assert result.stderr == f"gpudoctor: {gd.cwd} is not a gpudoctor run directory: it has no manifest.json.\n"


def test_help_names_the_exit_statuses(gd: Gpudoctor) -> None:
    result = gd.run("diff", "--help")
    assert result.returncode == 0
    assert "65   a run that cannot be read" in result.stdout and "66 a path that does not exist" in result.stdout


# -- the report of a run says how to compare it ---------------------------------------------------------
def test_the_report_says_how_to_compare_with_an_earlier_run(gd: Gpudoctor) -> None:
    bundle = fixture_path(BAD)
    result = gd.run("analyze", str(bundle), "--out", "out", "--format", "text,html")
    assert result.returncode == 0, result
    line = f"  compare with an earlier run: gpudoctor diff EARLIER_RUN_DIR {bundle.resolve()}"
    assert result.stderr.splitlines()[-1] == line, result.stderr
    html = (gd.cwd / "out" / "report.html").read_text(encoding="utf-8")
    assert f"Compare with an earlier run: <code>gpudoctor diff EARLIER_RUN_DIR {bundle.resolve()}</code>" in html
    trace_only = gd.run("analyze", str(bundle / "trace.json.gz"), "--out", "trace", "--format", "text,html")
    assert trace_only.returncode == 0 and "compare with" not in trace_only.stderr, trace_only  # diff reads no trace
    assert "Compare with" not in (gd.cwd / "trace" / "report.html").read_text(encoding="utf-8")


def test_a_run_without_a_step_is_not_offered_a_comparison(gd: Gpudoctor, tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path / "stepless")
    b.process(1.0)
    bundle = b.write()
    result = gd.run("analyze", str(bundle), "--out", "out", "--format", "text,html")
    assert result.returncode == 0, result
    assert "No training step was detected" in result.stderr and "compare with" not in result.stderr, result.stderr
    assert "Compare with" not in (gd.cwd / "out" / "report.html").read_text(encoding="utf-8")


def test_the_diff_template_and_schema_ship_with_the_package() -> None:
    """The schema sits beside findings.json's inside the package; the templates are force-included in the wheel."""
    assert diff_schema().is_file() and diff_schema().parent == findings_schema().parent
    assert (templates_dir() / "diff.html.j2").is_file()
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"templates" = "gpudoctor/templates"' in pyproject and 'packages = ["gpudoctor"]' in pyproject
