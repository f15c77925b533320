"""The rule engine: declaring rules, loading and checking them, their options, and running them.

- `api`: `@rule`, `Finding`, `Rule` and the checks made when a rule is declared;
- `loading`: rules from the built-in pack, installed packages, files and modules, checked as they load;
- `lookup` and `retired`: rules by code, name or alias, --select/--ignore, and the retired codes;
- `options`: pyproject.toml's [tool.gpudoctor] and --rule-option, checked against each rule's options;
- `runner`: each rule run in isolation, its findings as records (gpudoctor.bundle.findings), merged and ranked;
- `windows`: a run profiled in several windows, its findings combined across them;
- `project`: a project's rules loaded, checked and selected, with their options, before anything runs;
- `scaffold` (`gpudoctor rules new`) and `docs` (docs/rules.md's per-rule part) are tools, imported on use.
"""

from __future__ import annotations

from gpudoctor.engine.api import (
    CODE_PATTERN,
    NAME_PATTERN,
    REQUIRED_SECTIONS,
    Finding,
    Rule,
    RuleFunction,
    rule,
    rule_of,
)
from gpudoctor.engine.loading import BUILTIN_PREFIX, builtin_rules, doc_warning, load_rules, rules_in
from gpudoctor.engine.lookup import find_rule, select_rules
from gpudoctor.engine.options import (
    ProjectConfig,
    load_project_config,
    parse_cli_options,
    resolve_options,
)
from gpudoctor.engine.project import (
    PreparedRules,
    ProjectRules,
    RuleSelection,
    load_project_rules,
    prepare_rules,
    refuse_project_inside,
)
from gpudoctor.engine.retired import retired_codes, retired_reason
from gpudoctor.engine.runner import EngineResult, finding_key, rank, run_rules
from gpudoctor.engine.windows import RunDiagnosis, WindowStats, diagnose_windows
from gpudoctor.vocabulary import CATEGORIES, ENTRY_POINT_GROUP, SEVERITIES

__all__ = [
    "BUILTIN_PREFIX", "CATEGORIES", "CODE_PATTERN", "ENTRY_POINT_GROUP", "NAME_PATTERN", "REQUIRED_SECTIONS",
    "SEVERITIES", "EngineResult", "Finding", "PreparedRules", "ProjectConfig", "ProjectRules", "Rule", "RuleFunction",
    "RuleSelection", "RunDiagnosis", "WindowStats", "builtin_rules", "diagnose_windows", "doc_warning", "find_rule",
    "finding_key", "load_project_config", "load_project_rules", "load_rules", "parse_cli_options", "prepare_rules",
    "rank", "refuse_project_inside", "resolve_options", "retired_codes", "retired_reason", "rule", "rule_of",
    "rules_in", "run_rules", "select_rules",
]
