"""`gpudoctor rules list|explain|check|new`: the rules, their documentation, what a rule's docs lack, and a starter
rule."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor.cli.app import (
    RulesOption,
    _Command,
    rules_app,
)
from gpudoctor.errors import InputNotFoundError
from gpudoctor.vocabulary import CATEGORIES

if TYPE_CHECKING:
    from gpudoctor.engine import Rule

# The commands import the engine and the rules when they run: `gpudoctor --help` answers without them.


@rules_app.command("list", cls=_Command, short_help="List the rules, where each comes from, and the retired codes.")
def rules_list(rules: RulesOption = None) -> None:
    """List every rule: code, name, category and where it comes from (built-in, package:, file:, module:); then the
    retired codes, with why."""
    from gpudoctor.engine import RuleSelection, load_project_rules, retired_codes

    project = load_project_rules(rules or ())
    selected = {r.code for r in project.selected(RuleSelection())}
    for r in sorted(project.rules, key=lambda r: (r.source != "built-in", r.code)):
        off = "" if r.code in selected else "  (off: [tool.gpudoctor] select/ignore)"
        print(f"{r.code:<9} {r.name:<34} {r.category:<22} {r.source}{off}{_formerly(r)}")
    for code, why in sorted(retired_codes().items()):
        print(f"{code:<9} {'(retired)':<34} {why}")


def _formerly(r: Rule) -> str:
    return f"  (formerly {', '.join(r.aliases)})" if r.aliases else ""


@rules_app.command("explain", cls=_Command, short_help="Show a rule's documentation and its options.")
def rules_explain(
    code: Annotated[str, typer.Argument(metavar="CODE", help="The rule's code or name, e.g. GD101.")],
    rules: RulesOption = None,
) -> None:
    """Show a rule's documentation, its options with their defaults, and the values pyproject.toml sets."""
    from gpudoctor.engine import find_rule, load_project_rules

    project = load_project_rules(rules or ())
    r = find_rule(project.rules, code, "rules explain")
    if r is None:
        raise InputNotFoundError(f"no rule has the code or name {code!r}; `gpudoctor rules list` shows them all.")
    severity = f"{r.severity} by default, see Severity below" if "Severity:" in r.doc else r.severity
    print(f"{r.code} {r.name} ({r.category}, {severity}) from {r.source}{_formerly(r)}\n\n{r.doc}")
    if r.options:
        print("\nOptions (default):")
        project_sets = project.options.get(r.code, {})
        for name, default in r.options.items():
            note = f"  # {project.config.source} sets {project_sets[name]!r}" if name in project_sets else ""
            print(f"  {name} = {default!r}{note}")


@rules_app.command("check", cls=_Command, short_help="Check your rules load, and say what their docs lack.")
def rules_check(rules: RulesOption = None) -> None:
    """Load your team's rules (--rules, pyproject.toml's [tool.gpudoctor], installed packages) as `profile` does,
    and say, rule by rule, which sections of the built-in rules' documentation each docstring lacks ('What it
    detects:', 'Why it matters:', 'Fix:'). A rule without them still loads and runs: these are warnings."""
    from gpudoctor.engine import doc_warning, load_project_rules

    project = load_project_rules(rules or ())
    custom = [r for r in project.rules if r.source != "built-in"]
    warnings = [w for w in (doc_warning(r) for r in custom) if w is not None]
    for warning in warnings:
        print(f"warning: {warning}")
    documented = len(custom) - len(warnings)
    print(f"{len(custom)} rule{'' if len(custom) == 1 else 's'} of your own loaded; {documented} documented as the "
          f"built-in rules are, {len(warnings)} with warnings.")


@rules_app.command("new", cls=_Command, short_help="Write a starter rule and its test.")
def rules_new(
    code: Annotated[str, typer.Argument(
        metavar="CODE", help="The rule's code: your team's prefix and three digits, e.g. ACME101.")],
    name: Annotated[str | None, typer.Option(
        "--name", metavar="NAME", show_default=False,
        help="The rule's kebab-case name (default: the starter's, long-data-wait).")] = None,
    category: Annotated[str, typer.Option(
        "--category", metavar="CATEGORY", help=f"One of: {', '.join(CATEGORIES)}.")] = "data_starvation",
    directory: Annotated[Path, typer.Option(
        "--dir", metavar="DIR", help="Where to write the rule and its test.")] = Path("."),
) -> None:
    """Write a starter rule, DIR/<code>.py, and its test, DIR/test_<code>.py."""
    from gpudoctor.engine.scaffold import DEFAULT_NAME, new_rule

    rule_file, test_file = new_rule(code, name or DEFAULT_NAME, category, directory)
    print(f"wrote {rule_file} and {test_file}\n"
          f"  list it:  gpudoctor rules list --rules {rule_file}\n"
          f"  test it:  python -m pytest {test_file}\n"
          f"  run it:   gpudoctor analyze RUN_DIR --rules {rule_file}")
