"""Project settings from pyproject.toml's [tool.gpudoctor] table, and rule options from the command line.

A rule's options may be set under its code or under a code or name it had before (an alias); a retired code is
refused.

    [tool.gpudoctor]
    rules = ["team_rules/"]          # rule files, directories or modules, relative to pyproject.toml
    select = ["GD1", "ACME"]
    ignore = ["GD202"]

    [tool.gpudoctor.rules.ACME101]   # options of one rule (TOML cannot also hold `rules = [...]`:
    max_wait = 0.2                   # then list the paths as `paths = [...]` in [tool.gpudoctor.rules])
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.engine.api import Rule
from gpudoctor.engine.lookup import find_rule
from gpudoctor.engine.retired import refuse_retired
from gpudoctor.errors import RuleLoadError
from gpudoctor.paths import find_pyproject

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


@dataclass
class ProjectConfig:
    source: Path | None = None
    rule_paths: list[str] = field(default_factory=list)
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    rule_timeout_s: float | None = None  # [tool.gpudoctor] rule_timeout: seconds a rule may run


def load_project_config(start: Path | None = None) -> ProjectConfig:
    path = find_pyproject((start or Path.cwd()).resolve())
    if path is None:
        return ProjectConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RuleLoadError(f"{path}: is not valid TOML ({exc}).") from None
    table = data.get("tool", {}).get("gpudoctor", {})
    rules = table.get("rules", [])
    paths = rules if isinstance(rules, list) else rules.get("paths", [])
    options: dict[str, dict[str, Any]] = {}
    if isinstance(rules, dict):
        options = {code: value for code, value in rules.items() if isinstance(value, dict)}
    return ProjectConfig(
        source=path, rule_paths=[_relative_to(path.parent, p) for p in paths],
        select=list(table.get("select", [])), ignore=list(table.get("ignore", [])), options=options,
        rule_timeout_s=_rule_timeout(path, table.get("rule_timeout")),
    )


def _rule_timeout(path: Path, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise RuleLoadError(f"{path}: [tool.gpudoctor] rule_timeout must be a number of seconds above 0, "
                            f"not {value!r}.")
    return float(value)


def _relative_to(root: Path, spec: str) -> str:
    """A path-like spec is taken relative to pyproject.toml; a module name stays as it is."""
    candidate = root / spec
    return str(candidate) if candidate.exists() or spec.endswith(".py") or "/" in spec else spec


def parse_cli_options(items: list[str]) -> dict[str, dict[str, str]]:
    """`CODE.option=value` items from --rule-option; values are converted once the rule is known."""
    options: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        code, dot, name = key.partition(".")
        if not sep or not dot or not code or not name:
            raise RuleLoadError(
                f"--rule-option {item!r} must look like CODE.option=value, e.g. GD101.min_wait_share=0.2."
            )
        options.setdefault(code, {})[name] = value
    return options


def _convert(value: Any, default: Any, where: str) -> Any:
    """`value` (from TOML, or a string from the command line) as the type of the option's default."""
    try:
        if isinstance(value, str) and not isinstance(default, str):
            return _parse(value, default)
        return _coerce(value, default)
    except (TypeError, ValueError, OverflowError):
        kind = type(default).__name__
        raise RuleLoadError(f"{where}: expects {'an' if kind[0] in 'aeiou' else 'a'} {kind} like {default!r}, "
                            f"got {value!r}.") from None


def _parse(text: str, default: Any) -> Any:
    """A command-line value: true/false for a flag, comma-separated items for a list or tuple."""
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(text)
        return text.lower() in ("true", "1")
    if isinstance(default, (list, tuple)):
        return type(default)(item.strip() for item in text.split(",") if item.strip())
    return type(default)(text) if default is not None else text


def _coerce(value: Any, default: Any) -> Any:
    """A TOML value: an int where a float is expected is fine, a float with a fraction where an int is, not."""
    if default is None:
        return value
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(value)
        if isinstance(default, int) and value != int(value):
            raise ValueError(value)
        return type(default)(value)
    if isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)
    if type(value) is not type(default):
        raise TypeError(value)
    return value


OptionLayer = tuple[str, Mapping[str, Mapping[str, Any]]]  # where the values come from, and code -> option -> value


def _rule_for(rules: list[Rule], key: str, origin: str) -> Rule:
    """The rule that an options table names, by its code or an alias."""
    refuse_retired(key, origin, f"has no options; remove the options set for {key.upper()}")
    found = find_rule(rules, key, origin)
    if found is None:
        raise RuleLoadError(f"{origin}: sets options for rule {key}, but no loaded rule has that code; fix the "
                            "code, or load the rule with --rules or [tool.gpudoctor] rules.")
    return found


def _checked(r: Rule, name: str, value: Any, origin: str) -> Any:
    """`value` as the type of the option's default; an option the rule does not have is refused."""
    if name not in r.options:
        known = ", ".join(r.options) or "none"
        raise RuleLoadError(f"{origin}: rule {r.code} ({r.name}, from {r.source}) has no option '{name}'; "
                            f"use one of its options: {known}.")
    return _convert(value, r.options[name], f"{origin}: {r.code}.{name}")


def resolve_options(rules: list[Rule], *layers: OptionLayer) -> dict[str, dict[str, Any]]:
    """Merge option layers (later wins) under each rule's code, checking each against the rule's options and types."""
    merged: dict[str, dict[str, Any]] = {}
    for origin, layer in layers:
        for key, values in layer.items():
            r = _rule_for(rules, key, origin)
            for name, value in values.items():
                merged.setdefault(r.code, {})[name] = _checked(r, name, value, origin)
    return merged
