"""docs/rules.md: its per-rule part is generated from the rules (docstrings, categories, severities, option
defaults) and must be up to date; the hand-written threshold table names only options the rules have."""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from gpudoctor.engine import builtin_rules
from gpudoctor.engine.docs import BEGIN, COMMAND, END, main, rule_section, with_rules

PAGE = REPO / "docs" / "rules.md"


def test_the_rules_part_of_docs_rules_md_is_up_to_date() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert page == with_rules(page, builtin_rules()), (
        f"docs/rules.md is out of date with the rules' docstrings or options: run `{COMMAND}` and commit the result")


def test_a_rules_section_shows_its_documentation_and_option_defaults() -> None:
    gd101 = next(r for r in builtin_rules() if r.code == "GD101")
    section = rule_section(gd101)
    assert section.startswith(f"### GD101 loader-in-main-process\n\n{gd101.summary}\n\n")
    assert "**What it detects:** `num_workers=0`" in section and "**Fix:**" in section
    for name, default in gd101.options.items():
        assert f"| `{name}` | `{default!r}` |" in section


def test_only_the_part_between_the_markers_is_rewritten(tmp_path) -> None:
    page = tmp_path / "rules.md"
    page.write_text(f"# by hand\n\n{BEGIN}\nstale\n{END}\n\nalso by hand\n", encoding="utf-8")
    assert main(["--check", str(page)]) == 1
    assert main([str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# by hand\n\n") and text.endswith(f"{END}\n\nalso by hand\n") and "stale" not in text
    assert main(["--check", str(page)]) == 0
    page.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no generated part"):
        main([str(page)])


def test_the_threshold_table_names_only_options_its_rules_have() -> None:
    hand_written = PAGE.read_text(encoding="utf-8").split(BEGIN)[0]
    rules = {r.code: r for r in builtin_rules()}
    rows = re.findall(r"^\| (GD\d{3}) [a-z0-9-]+ \| ([^|]*) \|", hand_written, re.MULTILINE)
    assert {code for code, _ in rows} == set(rules)
    for code, compared in rows:
        for name in re.findall(r"`([a-z_]+)`", compared):
            assert name in rules[code].options, f"docs/rules.md: {code} has no option {name}"
