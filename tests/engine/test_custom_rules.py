"""Custom rules as a team writes them: loading (files, directories, modules, pyproject.toml, installed
packages), the messages of every load failure, isolation of a rule that crashes, `gpudoctor rules
list / explain / new`, renamed rules (aliases), retired codes and the sections of a rule's docstring."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpudoctor
import gpudoctor.analysis
import gpudoctor.cli
import gpudoctor.engine.retired
import gpudoctor.job
from conftest import REPO, Gpudoctor, env_with
from gpudoctor.engine import builtin_rules, load_rules, run_rules
from gpudoctor.errors import RuleLoadError
from gpudoctor.pipeline import RuleSelection, prepare_rules
from gpudoctor.testing import BundleBuilder, load_fixture, run_rule

STARVED = str(REPO / "fixtures" / "bundles" / "data_starvation_bad")

RULE = '''\
"""ACME rules used by the tests."""

from gpudoctor import Finding, rule


@rule("ACME101", "slow-loader-wait", category="data_starvation")
def slow_loader_wait(run, max_wait_s: float = 0.2, steps: int = 1, strict: bool = False,
                     functions: tuple = ("training_step",)):
    """Steps wait more than `max_wait_s` for data.

    What it detects: waits.

    Why it matters: idle GPU.

    Example: NFS.

    Fix: cache.
    """
    slow = [s for s in run.step_view.steady_steps if s.data_wait_s > max_wait_s]
    if len(slow) >= steps:
        yield Finding(f"{len(slow)} steps waited over {max_wait_s} s", impact=0.1, location=run.sites.loader.location)
'''


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


# the sections every rule has
DOC = "Doc.\n\n    What it detects: a test.\n\n    Why it matters: tests.\n\n    Fix: none.\n    "


def a_rule(code: str = "ACME101", name: str = "slow-loader-wait", signature: str = "run", body: str = "return []",
           decorator: str = 'category="data_starvation"') -> str:
    """The source of a rule file with one rule, for the load-failure tests."""
    return (f'from gpudoctor import Finding, rule\n\n\n@rule("{code}", "{name}", {decorator})\n'
            f'def the_rule({signature}):\n    """{DOC}"""\n    {body}\n')


def load_error(*specs: str) -> str:
    with pytest.raises(RuleLoadError) as caught:
        load_rules(specs)
    return str(caught.value)


# -- where rules come from -------------------------------------------------------------------------
def test_rules_list_shows_rules_from_pyproject_and_the_command_line_with_their_source(gd: Gpudoctor) -> None:
    write(gd.cwd, "team_rules/acme.py", RULE)
    write(gd.cwd, "extra.py", a_rule("ACME201", "extra-check"))
    write(gd.cwd, "acme_module_rules.py", a_rule("ACME301", "module-check"))
    write(gd.cwd, "pyproject.toml", """\
        [tool.gpudoctor]
        rules = ["team_rules/"]
        ignore = ["GD202"]
    """)
    result = gd.run("rules", "list", "--rules", "extra.py", "--rules", "acme_module_rules",
                    env=env_with(PYTHONPATH=f"{REPO}:{gd.cwd}"))
    assert result.returncode == 0, result
    rows = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert rows["GD101"].endswith("built-in")
    assert rows["ACME101"].split()[1:] == ["slow-loader-wait", "data_starvation", f"file:{gd.cwd}/team_rules/acme.py"]
    assert rows["ACME201"].endswith("file:extra.py")
    assert rows["ACME301"].endswith("module:acme_module_rules")
    assert "(off:" in rows["GD202"] and "(off:" not in rows["GD201"]


def test_rules_explain_shows_the_documentation_options_and_what_the_project_sets(gd: Gpudoctor) -> None:
    write(gd.cwd, "team_rules/acme.py", RULE)
    write(gd.cwd, "pyproject.toml", """\
        [tool.gpudoctor.rules]
        paths = ["team_rules/"]

        [tool.gpudoctor.rules.ACME101]
        max_wait_s = 0.1
    """)
    result = gd.run("rules", "explain", "ACME101")
    assert result.returncode == 0, result
    out = result.stdout
    assert out.startswith(f"ACME101 slow-loader-wait (data_starvation, warning) from file:{gd.cwd}/team_rules/acme.py")
    assert "What it detects: waits." in out
    assert f"  max_wait_s = 0.2  # {gd.cwd}/pyproject.toml sets 0.1" in out.splitlines()
    assert "  steps = 1" in out.splitlines()


def test_a_file_named_by_pyproject_and_by_rules_is_loaded_once(tmp_path: Path) -> None:
    rule_file = write(tmp_path, "team_rules/acme.py", RULE)
    write(tmp_path, "pyproject.toml", '[tool.gpudoctor]\nrules = ["team_rules/acme.py"]\n')
    prepared = prepare_rules(RuleSelection(paths=(str(rule_file),)), project_dir=tmp_path)
    assert [r.code for r in prepared.rules].count("ACME101") == 1


def test_rules_from_an_installed_package_entry_point(gd: Gpudoctor, tmp_path: Path) -> None:
    """A real `pip install --target` of a package declaring the entry point, found by `rules list`."""
    source = tmp_path / "acme-rules"
    write(source, "pyproject.toml", """\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "acme-rules"
        version = "0.1.0"

        [project.entry-points."gpudoctor.rules"]
        acme = "acme_rules"
    """)
    write(source, "acme_rules/__init__.py", RULE)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(source)], check=True, capture_output=True, cwd=tmp_path)
    assert (site / "acme_rules-0.1.0.dist-info" / "entry_points.txt").is_file()
    result = gd.run("rules", "list", env=env_with(PYTHONPATH=f"{REPO}:{site}"))
    assert result.returncode == 0, result
    row = next(line for line in result.stdout.splitlines() if line.startswith("ACME101"))
    assert row.split()[-1] == "package:acme-rules"


# -- validation at load: each failure names the file, the rule and what to change -----------------
def test_a_malformed_code(tmp_path: Path) -> None:
    path = write(tmp_path, "bad_code.py", a_rule(code="acme1"))
    message = load_error(str(path))
    assert message.startswith(f"{path}:4: rule code 'acme1' is malformed")
    assert "e.g. ACME101" in message


def test_the_gd_prefix_is_reserved_for_built_in_rules(tmp_path: Path) -> None:
    path = write(tmp_path, "gd_rule.py", a_rule(code="GD901", name="mine"))
    message = load_error(str(path))
    assert message.startswith(f"file:{path}: rule GD901 (mine) uses the prefix GD")
    assert "their own prefix, e.g. ACME101" in message


def test_a_duplicate_code(tmp_path: Path) -> None:
    first = write(tmp_path, "first.py", a_rule("ACME101", "first-rule"))
    second = write(tmp_path, "second.py", a_rule("ACME101", "second-rule"))
    message = load_error(str(first), str(second))
    assert message == (f"file:{second}: rule code ACME101 (second-rule) is already used by first-rule from "
                       f"file:{first}; give one of them another code.")


def test_a_code_already_taken_by_a_built_in_rule_is_refused_by_its_prefix(tmp_path: Path) -> None:
    path = write(tmp_path, "copy.py", a_rule("GD101", "loader-in-main-process"))
    assert "prefix GD" in load_error(str(path))


@pytest.mark.parametrize(("where", "origin"), [("pyproject", "pyproject.toml"), ("cli", "--rule-option")])
def test_an_unknown_option(tmp_path: Path, where: str, origin: str) -> None:
    rule_file = write(tmp_path, "team_rules/acme.py", RULE)
    selection = RuleSelection(paths=(str(rule_file),))
    if where == "pyproject":
        write(tmp_path, "pyproject.toml", "[tool.gpudoctor.rules.ACME101]\nmax_wait = 0.1\n")
    else:
        selection.options = ("ACME101.max_wait=0.1",)
    with pytest.raises(RuleLoadError) as caught:
        prepare_rules(selection, project_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / origin) if where == "pyproject" else origin)
    assert (f"rule ACME101 (slow-loader-wait, from file:{rule_file}) has no option 'max_wait'; use one of its "
            "options: max_wait_s, steps, strict, functions.") in message


def test_options_for_a_rule_that_is_not_loaded(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", "[tool.gpudoctor.rules.ACME999]\nmax_wait_s = 0.1\n")
    with pytest.raises(RuleLoadError, match=r"pyproject.toml: sets options for rule ACME999, but no loaded rule "
                                            r"has that code; fix the code, or load the rule with --rules"):
        prepare_rules(RuleSelection(), project_dir=tmp_path)


@pytest.mark.parametrize(
    ("toml", "cli", "message"),
    [
        ('max_wait_s = "fast"', None, "ACME101.max_wait_s: expects a float like 0.2, got 'fast'."),
        ("max_wait_s = true", None, "ACME101.max_wait_s: expects a float like 0.2, got True."),
        ("steps = 2.5", None, "ACME101.steps: expects an int like 1, got 2.5."),
        ('strict = "yes"', None, "ACME101.strict: expects a bool like False, got 'yes'."),
        (None, "ACME101.max_wait_s=fast", "--rule-option: ACME101.max_wait_s: expects a float like 0.2, got 'fast'."),
        (None, "ACME101.steps=0.5", "--rule-option: ACME101.steps: expects an int like 1, got '0.5'."),
        (None, "ACME101.strict=maybe", "--rule-option: ACME101.strict: expects a bool like False, got 'maybe'."),
    ],
)
def test_a_wrong_option_type(tmp_path: Path, toml: str | None, cli: str | None, message: str) -> None:
    rule_file = write(tmp_path, "acme.py", RULE)
    if toml:
        write(tmp_path, "pyproject.toml", f"[tool.gpudoctor.rules.ACME101]\n{toml}\n")
    selection = RuleSelection(paths=(str(rule_file),), options=(cli,) if cli else ())
    with pytest.raises(RuleLoadError) as caught:
        prepare_rules(selection, project_dir=tmp_path)
    assert str(caught.value).endswith(message)
    if toml:
        assert str(caught.value).startswith(str(tmp_path / "pyproject.toml"))


def test_option_values_take_the_type_of_their_default(tmp_path: Path) -> None:
    rule_file = write(tmp_path, "acme.py", RULE)
    write(tmp_path, "pyproject.toml", '[tool.gpudoctor.rules.ACME101]\nmax_wait_s = 1\nfunctions = ["step"]\n')
    selection = RuleSelection(paths=(str(rule_file),),
                              options=("ACME101.steps=3", "ACME101.strict=true", "ACME101.functions=a, b"))
    options = prepare_rules(selection, project_dir=tmp_path).options["ACME101"]
    assert options == {"max_wait_s": 1.0, "steps": 3, "strict": True, "functions": ("a", "b")}
    assert isinstance(options["max_wait_s"], float)


@pytest.mark.parametrize(
    ("signature", "message"),
    [
        ("", "rule ACME101 must take the run as its first parameter: def the_rule(run, ...)."),
        ("*, max_wait_s=0.2", "rule ACME101 must take the run as its first parameter"),
        ("run, max_wait_s", ("rule ACME101 parameter 'max_wait_s' needs a default value: every parameter after `run` "
                             "is an option (e.g. max_wait_s: float = 0.25).")),
        ("run, **options", "rule ACME101 parameter 'options' needs a default value"),
    ],
)
def test_a_wrong_signature(tmp_path: Path, signature: str, message: str) -> None:
    path = write(tmp_path, "signature.py", a_rule(signature=signature))
    assert load_error(str(path)).startswith(f"{path}:4: {message}")


def test_a_file_that_fails_to_import(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", "import gpudoctor\n\nTHRESHOLD = undefined_name * 2\n")
    message = load_error(str(path))
    assert message == (f"{path}:3: failed to import: NameError: name 'undefined_name' is not defined. Fix the file, "
                       "or leave it out of --rules and of [tool.gpudoctor] in pyproject.toml.")


def test_a_file_with_a_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "syntax.py", "from gpudoctor import rule\n\ndef broken(:\n    pass\n")
    assert load_error(str(path)).startswith(f"{path}:3: failed to import: SyntaxError")


def test_a_file_without_rules(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.py", "def helper(run):\n    return []\n")
    assert load_error(str(path)) == f"{path}: defines no rules; decorate a function with @gpudoctor.rule(...)."


def test_a_missing_file_or_module() -> None:
    assert load_error("no_such_rules.py") == "no_such_rules.py: no such rule file or directory."
    assert load_error("no_such_rules_module").startswith(
        "no_such_rules_module: not a file, directory or importable module")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('yield "slow loader"', "TypeError: rule ACME101 yielded str, not a Finding: yield gpudoctor.Finding(title, "),
        ('return Finding("slow loader")', "TypeError: rule ACME101 returned a Finding; yield it"),
    ],
)
def test_a_rule_that_yields_something_else_becomes_an_error_row(tmp_path: Path, body: str, error: str) -> None:
    path = write(tmp_path, "yields.py", a_rule(body=body))
    b = BundleBuilder(tmp_path / "bundle")
    b.steps(3)
    result = run_rules(b.build(), load_rules([str(path)], builtins=False))
    assert result.findings == []
    assert [e.code for e in result.errors] == ["ACME101"]
    assert result.errors[0].error.startswith(error)
    assert result.errors[0].source == f"file:{path}"


def test_a_load_error_stops_analyze_before_it_runs_with_status_2(gd: Gpudoctor) -> None:
    write(gd.cwd, "bad.py", a_rule(code="GD901"))
    result = gd.run("analyze", STARVED, "--out", "out", "--rules", "bad.py")
    assert result.returncode == 2
    assert result.first_message.startswith("gpudoctor: file:bad.py: rule GD901 (slow-loader-wait) uses the prefix GD")
    assert not (gd.cwd / "out").exists()


# -- a rule that crashes while running ------------------------------------------------------------
def test_a_crashing_rule_is_an_error_row_and_every_built_in_finding_is_still_there(gd: Gpudoctor) -> None:
    write(gd.cwd, "crashing.py", a_rule("ACME666", "crashes", body='raise KeyError("num_workers")'))
    result = gd.run("analyze", STARVED, "--out", "out", "--rules", "crashing.py")
    assert result.returncode == 0, result
    report = json.loads((gd.cwd / "out" / "findings.json").read_text())
    [error] = report["errors"]
    assert (error["code"], error["name"], error["source"]) == ("ACME666", "crashes", "file:crashing.py")
    assert error["error"] == "KeyError: 'num_workers'"
    assert "crashing.py" in error["traceback"]
    expected = run_rules(load_fixture("data_starvation_bad"), builtin_rules()).findings
    assert [(f["code"], f["title"]) for f in report["findings"]] == [(f.code, f.title) for f in expected]
    assert expected
    html = (gd.cwd / "out" / "report.html").read_text()
    assert "ACME666" in html and "KeyError: &#39;num_workers&#39;" in html
    assert "rule ACME666 failed: KeyError: 'num_workers'" in result.stderr


# -- gpudoctor rules new -----------------------------------------------------------------------------
def test_rules_new_writes_a_documented_rule_and_a_test_that_passes(gd: Gpudoctor) -> None:
    result = gd.run("rules", "new", "acme101", "--name", "nfs-wait", "--category", "data_starvation",
                    "--dir", "team_rules")
    assert result.returncode == 0, result
    rule_file, test_file = gd.cwd / "team_rules" / "acme101.py", gd.cwd / "team_rules" / "test_acme101.py"
    assert result.stdout.startswith("wrote team_rules/acme101.py and team_rules/test_acme101.py")
    [new] = load_rules([str(rule_file)], builtins=False, packages=False)
    assert (new.code, new.name, new.category, list(new.options)) == ("ACME101", "nfs-wait", "data_starvation",
                                                                     ["max_wait_s"])
    for section in ("What it detects", "Why it matters", "Example", "Fix"):
        assert section in new.doc
    assert _gpudoctor_imports(rule_file) <= {("gpudoctor", "Finding"), ("gpudoctor", "Run"), ("gpudoctor", "rule")}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                           cwd=gd.cwd, env=env_with(), capture_output=True, text=True, timeout=120)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout
    listed = gd.run("rules", "list", "--rules", "team_rules")
    assert "ACME101   nfs-wait" in listed.stdout


def test_rules_new_refuses_a_gd_code_and_an_existing_file(gd: Gpudoctor) -> None:
    refused = gd.run("rules", "new", "GD150")
    assert refused.returncode == 2
    assert refused.first_message == (
        "gpudoctor: rule code GD150 uses the prefix GD, which is reserved for gpudoctor's built-in rules; give your "
        "team's rules their own prefix, e.g. ACME101.")
    write(gd.cwd, "acme101.py", "# our own\n")
    existing = gd.run("rules", "new", "ACME101")
    assert existing.returncode == 73
    assert existing.first_message == ("gpudoctor: acme101.py already exists; choose another code or --dir, "
                                      "or move the file away.")
    assert (gd.cwd / "acme101.py").read_text() == "# our own\n"
    assert not (gd.cwd / "test_acme101.py").exists()


# -- the public API ----------------------------------------------------------------------------------
def _gpudoctor_imports(path: Path) -> set[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpudoctor"):
            imported |= {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {(alias.name, "") for alias in node.names if alias.name.startswith("gpudoctor")}
    return imported


def test_built_in_rules_use_only_the_public_api() -> None:
    public = {("gpudoctor", name) for name in gpudoctor.__all__}
    public |= {(module, name) for module in ("gpudoctor.analysis", "gpudoctor.analysis.views")
               for name in gpudoctor.analysis.__all__}
    public |= {("gpudoctor.job", name) for name in gpudoctor.job.__all__}  # what a job rule reads
    for path in sorted((REPO / "rules").glob("*.py")):
        assert _gpudoctor_imports(path) <= public, f"{path.name} uses {_gpudoctor_imports(path) - public}"


def test_the_public_api_is_typed_and_importable() -> None:
    assert (Path(gpudoctor.__file__).parent / "py.typed").is_file()
    from gpudoctor import Finding, NotEvaluated, Run, rule  # noqa: F401
    from gpudoctor.analysis import CopySite, LoaderInfo, Location, Step, SyncSite  # noqa: F401

    for name in gpudoctor.analysis.__all__:  # documented by hand, not dataclass's generated "Step(index: int, ...)"
        assert not getattr(gpudoctor.analysis, name).__doc__.startswith(f"{name}("), name


# -- renamed rules: their old codes and names (aliases) work everywhere ------------------------------
RENAMED = RULE.replace('@rule("ACME101", "slow-loader-wait", category="data_starvation")',
                       '@rule("ACME201", "long-data-wait", category="data_starvation", '
                       'aliases=("ACME101", "slow-loader-wait"))')


def test_select_and_ignore_match_a_renamed_rules_old_code(tmp_path: Path) -> None:
    rule_file = str(write(tmp_path, "renamed.py", RENAMED))
    selected = prepare_rules(RuleSelection(paths=(rule_file,), select=("ACME1",)), project_dir=tmp_path).rules
    assert [r.code for r in selected] == ["ACME201"]
    ignored = prepare_rules(RuleSelection(paths=(rule_file,), ignore=("ACME101", "GD")), project_dir=tmp_path).rules
    assert ignored == []


def test_options_set_under_an_old_code_reach_the_renamed_rule(tmp_path: Path) -> None:
    rule_file = write(tmp_path, "renamed.py", RENAMED)
    write(tmp_path, "pyproject.toml", "[tool.gpudoctor.rules.ACME101]\nmax_wait_s = 0.1\nsteps = 2\n")
    selection = RuleSelection(paths=(str(rule_file),), options=("ACME101.max_wait_s=0.3", "slow-loader-wait.strict=1"))
    options = prepare_rules(selection, project_dir=tmp_path).options
    assert options == {"ACME201": {"max_wait_s": 0.3, "steps": 2, "strict": True}}


def test_rules_explain_finds_a_renamed_rule_by_its_old_code(gd: Gpudoctor) -> None:
    write(gd.cwd, "renamed.py", RENAMED)
    result = gd.run("rules", "explain", "ACME101", "--rules", "renamed.py")
    assert result.returncode == 0, result
    assert result.stdout.startswith("ACME201 long-data-wait (data_starvation, warning) from file:renamed.py  "
                                    "(formerly ACME101, slow-loader-wait)")


def test_gpudoctor_testing_finds_a_renamed_rule_by_its_old_code(tmp_path: Path, monkeypatch) -> None:
    from gpudoctor.testing import assertions

    [renamed] = load_rules([str(write(tmp_path, "renamed.py", RENAMED))], builtins=False, packages=False)
    monkeypatch.setattr(assertions, "load_rules", lambda specs=(): [renamed])
    b = BundleBuilder(tmp_path / "bundle")
    b.loader(num_workers=2, site=("train.py", 40, "main"))
    b.steps(4, wall_s=0.5, data_wait_s=0.3)
    for old in ("ACME101", "slow-loader-wait", "acme201"):
        assert [f["code"] for f in run_rule(old, b.build())] == ["ACME201"]


def test_an_alias_that_is_another_rules_code_is_refused(tmp_path: Path) -> None:
    renamed = write(tmp_path, "renamed.py", RENAMED)
    other = write(tmp_path, "other.py", a_rule("ACME101", "other-rule"))
    assert load_error(str(renamed), str(other)) == (
        f"file:{other}: rule ACME101 (other-rule) and rule ACME201 (long-data-wait, from file:{renamed}) both answer "
        "to ACME101 (a code or an alias); give one of them another.")


# -- retired codes ---------------------------------------------------------------------------------
WHY = "It fired on every run with workers; ACME201 (long-data-wait) replaces it."


@pytest.fixture
def retired_acme150(monkeypatch) -> str:
    """ACME150 in the table of retired codes, for the length of a test."""
    monkeypatch.setitem(gpudoctor.engine.retired.RETIRED, "ACME150", WHY)
    return "ACME150"


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`gpudoctor ARGS` in this process (so that a monkeypatched table holds): its exit status, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["gpudoctor", *args])
    with pytest.raises(SystemExit) as ended:
        gpudoctor.cli.main()
    captured = capsys.readouterr()
    return ended.value.code, captured.out, captured.err


@pytest.mark.parametrize(("selection", "message"), [
    (RuleSelection(select=("ACME150",)), ("select: ACME150 is a retired rule code and selects no rule; remove it "
                                          "from --select and from [tool.gpudoctor] select in pyproject.toml. ")),
    (RuleSelection(ignore=("acme150",)), ("ignore: ACME150 is a retired rule code and ignores no rule; remove it "
                                          "from --ignore and from [tool.gpudoctor] ignore in pyproject.toml. ")),
    (RuleSelection(options=("ACME150.max_wait_s=0.1",)), ("--rule-option: ACME150 is a retired rule code and has no "
                                                           "options; remove the options set for ACME150. ")),
])
def test_a_retired_code_is_refused_in_select_ignore_and_options(tmp_path: Path, retired_acme150: str,
                                                                selection: RuleSelection, message: str) -> None:
    with pytest.raises(RuleLoadError) as caught:
        prepare_rules(selection, project_dir=tmp_path)
    assert str(caught.value) == message + WHY


def test_a_retired_code_in_pyproject_options_is_refused(tmp_path: Path, retired_acme150: str) -> None:
    write(tmp_path, "pyproject.toml", "[tool.gpudoctor.rules.ACME150]\nmax_wait_s = 0.1\n")
    with pytest.raises(RuleLoadError, match=r"pyproject\.toml: ACME150 is a retired rule code and has no options"):
        prepare_rules(RuleSelection(), project_dir=tmp_path)


def test_a_retired_code_is_never_given_to_another_rule(tmp_path: Path, retired_acme150: str) -> None:
    path = write(tmp_path, "reuse.py", a_rule("ACME150", "new-rule"))
    assert load_error(str(path)) == (f"file:{path}: rule ACME150 (new-rule) uses the retired code ACME150, which is "
                                     f"never given to another rule; choose another code. {WHY}")


def test_rules_explain_refuses_a_retired_code_with_status_2(tmp_path: Path, monkeypatch, capsys,
                                                            retired_acme150: str) -> None:
    monkeypatch.chdir(tmp_path)
    status, out, err = _cli(monkeypatch, capsys, "rules", "explain", "acme150")
    assert (status, out) == (2, "")
    assert err == f"gpudoctor: rules explain: ACME150 is a retired rule code and names no rule. {WHY}\n"


def test_rules_list_shows_the_retired_codes(tmp_path: Path, monkeypatch, capsys, retired_acme150: str) -> None:
    monkeypatch.chdir(tmp_path)
    status, out, _ = _cli(monkeypatch, capsys, "rules", "list")
    assert status == 0
    assert out.splitlines()[-1] == f"ACME150   {'(retired)':<34} {WHY}"


# -- the documentation's sections ---------------------------------------------------------------------
@pytest.mark.parametrize("section", ["What it detects", "Why it matters", "Fix"])
def test_a_rule_whose_docstring_lacks_a_section_loads_and_rules_check_says_so(tmp_path: Path, section: str,
                                                                               monkeypatch, capsys) -> None:
    source = a_rule().replace(f"{section}:", f"{section} -")
    path = write(tmp_path, "undocumented.py", source)
    [loaded] = [r for r in load_rules([str(path)]) if r.code == "ACME101"]
    monkeypatch.chdir(tmp_path)
    status, out, _ = _cli(monkeypatch, capsys, "rules", "check", "--rules", str(path))
    assert status == 0
    warning = (f"warning: {path}:4: rule ACME101 (slow-loader-wait) has no '{section}:' section in its docstring; "
               "`gpudoctor rules explain` and the report show its docstring as it is. The built-in rules have a "
               "summary line, then paragraphs starting 'What it detects:', 'Why it matters:' and 'Fix:'.")
    assert out.splitlines() == [
        warning, "1 rule of your own loaded; 0 documented as the built-in rules are, 1 with warnings."]
    assert loaded.doc.startswith("Doc.")


ONE_LINE = '''\
from gpudoctor import Finding, rule


@rule("ACME901", "loader-starves-gpu", category="data_starvation", severity="warning")
def loader_starves_gpu(run, max_wait_share: float = 0.25):
    """GPU idles while the next batch is loaded. Fix: raise num_workers, set pin_memory=True."""
    waits = [s for s in run.step_view.steady_steps if s.data_wait_s > max_wait_share * s.wall_s]
    if waits:
        yield Finding(f"{len(waits)} of {len(run.step_view.steady_steps)} steps wait for the DataLoader", impact=0.5,
                      location=run.sites.loader.location)
'''


@pytest.mark.e2e
def test_a_rule_with_a_one_line_docstring_runs_under_profile(tmp_path: Path) -> None:
    rule_file = write(tmp_path, "one_line.py", ONE_LINE)
    gd = Gpudoctor(tmp_path)
    result = gd.run("profile", "--out", "run", "--rules", str(rule_file), "--select", "ACME", "--format", "json",
                    str(REPO / "examples" / "starved_training.py"), "--epochs", "1", "--samples", "256")
    assert result.returncode == 0, result
    findings = json.loads((tmp_path / "run" / "findings.json").read_text())["findings"]
    assert [f["code"] for f in findings] == ["ACME901"]


def test_the_test_helpers_warn_of_an_undocumented_rule(tmp_path: Path) -> None:
    from gpudoctor.testing import UndocumentedRuleWarning, assert_fires

    namespace: dict = {}
    exec(compile(textwrap.dedent(ONE_LINE), "one_line.py", "exec"), namespace)
    b = BundleBuilder(tmp_path)
    b.loader()
    b.steps(5, wall_s=0.1, data_wait_s=0.08)
    with pytest.warns(UndocumentedRuleWarning, match="ACME901 .* has no 'What it detects:', 'Why it matters:'"):
        assert_fires(namespace["loader_starves_gpu"], b.build(), count=1)
