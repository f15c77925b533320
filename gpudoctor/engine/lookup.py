"""Finding rules by what users type: a code, a name or an alias for `rules explain`, options and tests; code
prefixes for --select and --ignore. Old codes and names (aliases) work everywhere; retired codes are refused."""

from __future__ import annotations

from collections.abc import Iterable

from gpudoctor.engine.api import CODE_PATTERN, Rule
from gpudoctor.engine.retired import refuse_retired


def matches(r: Rule, key: str) -> bool:
    """`key` is the rule's code (in any case), its name, or one of its aliases."""
    return key.upper() in r.codes or key in (r.name, *r.aliases)


def find_rule(rules: Iterable[Rule], key: str, origin: str = "rule") -> Rule | None:
    """The rule that `key` names; None when none does. A retired code raises RuleLoadError."""
    refuse_retired(key, origin, "names no rule")
    return next((r for r in rules if matches(r, key)), None)


def _refuse_retired_prefixes(prefixes: tuple[str, ...], setting: str) -> None:
    """A whole code that is retired (a shorter prefix may still match other rules)."""
    for prefix in prefixes:
        if CODE_PATTERN.match(prefix.upper()):
            refuse_retired(prefix, setting, f"{setting}s no rule; remove it from --{setting} and from "
                                            f"[tool.gpudoctor] {setting} in pyproject.toml")


def _starts_with(r: Rule, prefixes: tuple[str, ...]) -> bool:
    return any(code.startswith(prefixes) for code in r.codes)


def select_rules(rules: list[Rule], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[Rule]:
    """Keep rules whose code (or an old code, an alias) starts with a selected prefix and with no ignored one."""
    select, ignore = tuple(select), tuple(ignore)
    _refuse_retired_prefixes(select, "select")
    _refuse_retired_prefixes(ignore, "ignore")
    return [r for r in rules if (not select or _starts_with(r, select)) and not _starts_with(r, ignore)]
