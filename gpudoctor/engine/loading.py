"""Finding rules: the built-in pack, installed packages (entry points `gpudoctor.rules`), files and modules.

Every rule is checked as it is loaded, before anything runs: its docstring has the sections every rule's
documentation has, custom rules keep off the GD prefix, and no code, alias or retired code is used twice.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType

from gpudoctor.engine.api import Rule, missing_sections, rule_of
from gpudoctor.engine.retired import retired_reason
from gpudoctor.errors import RuleLoadError
from gpudoctor.paths import builtin_rules_dir
from gpudoctor.vocabulary import ENTRY_POINT_GROUP

BUILTIN_PREFIX = "GD"


def _import_file(path: Path, namespace: str) -> ModuleType:
    name = f"{namespace}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuleLoadError(f"{path}: cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except RuleLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a rule file raises on import becomes one error naming it
        del sys.modules[name]
        raise RuleLoadError(f"{_failed_at(exc, path)}: failed to import: {type(exc).__name__}: {exc}. Fix the file, "
                            "or leave it out of --rules and of [tool.gpudoctor] in pyproject.toml.") from None
    return module


def _failed_at(exc: Exception, path: Path) -> str:
    """`path:line` of the line in the rule file that raised, when the traceback reaches the file."""
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{path}:{exc.lineno}"
    target = os.path.realpath(path)
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if os.path.realpath(f.filename) == target]
    return f"{path}:{lines[-1]}" if lines else str(path)


def _rules_among(values: Iterable[object]) -> list[Rule]:
    """The rules of the functions decorated with @rule (or the Rules) among `values`."""
    found = (rule_of(v) for v in values if not isinstance(v, ModuleType))
    return [r for r in found if r is not None]


def rules_in(module: ModuleType) -> list[Rule]:
    return _rules_among(vars(module).values())


def _python_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith(("_", "test_")))


def builtin_rules() -> list[Rule]:
    modules = (_import_file(path, "gpudoctor_builtin_rules") for path in _python_files(builtin_rules_dir()))
    found = [r for module in modules for r in rules_in(module)]
    for r in found:
        _check_docs(r)
    return sorted(found, key=lambda r: r.code)


def _file_rules(path: Path) -> list[Rule]:
    return [r.with_source(f"file:{path}") for r in rules_in(_import_file(path, "gpudoctor_user_rules"))]


def _rules_from_spec(spec: str) -> list[Rule]:
    """`spec` is a .py file, a directory of them, or an importable module name; each rule carries its source."""
    path = Path(spec)
    if path.is_dir():
        return [r for p in _python_files(path) for r in _file_rules(p)]
    if path.suffix == ".py" or path.exists():
        if not path.is_file():
            raise RuleLoadError(f"{spec}: no such rule file or directory.")
        return _file_rules(path)
    try:
        module = importlib.import_module(spec)
    except ImportError as exc:
        raise RuleLoadError(f"{spec}: not a file, directory or importable module ({exc}).") from None
    return [r.with_source(f"module:{spec}") for r in rules_in(module)]


def _entry_point_rules(ep: EntryPoint) -> list[Rule]:
    """An entry point names a module (every rule in it), a rule, or a list of rules."""
    try:
        loaded = ep.load()
    except Exception as exc:  # noqa: BLE001 - whatever a plugin raises on import becomes one error naming it
        raise RuleLoadError(
            f"entry point {ep.name} ({ep.value}) in group {ENTRY_POINT_GROUP} failed to load: {exc}."
        ) from None
    if isinstance(loaded, ModuleType):
        return rules_in(loaded)
    return _rules_among(loaded if isinstance(loaded, list) else [loaded])


def _package_rules() -> list[Rule]:
    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        source = f"package:{dist.name if dist else ep.value}"
        found += [r.with_source(source) for r in _entry_point_rules(ep)]
    return found


def doc_warning(r: Rule) -> str | None:
    """What a rule's docstring lacks of the sections the built-in rules have, in one sentence; None when it has
    them all. A custom rule loads and runs without them (as pylint's and ruff's plugins do): `gpudoctor rules
    check` and the test helpers (gpudoctor.testing) say this."""
    missing = missing_sections(r.doc)
    if not missing:
        return None
    said = ", ".join(f"'{section}:'" for section in missing)
    return (f"{r.where}: rule {r.code} ({r.name}) has no {said} section{'s' if len(missing) > 1 else ''} in its "
            "docstring; `gpudoctor rules explain` and the report show its docstring as it is. The built-in rules "
            "have a summary line, then paragraphs starting 'What it detects:', 'Why it matters:' and 'Fix:'.")


def _check_docs(r: Rule) -> None:
    """The built-in rules are documented, every one: docs/rules.md and the report are made from their docstrings."""
    warning = doc_warning(r)
    if warning is not None:
        raise RuleLoadError(warning)


def _check_custom(r: Rule) -> None:
    # a retired GD code is refused as retired (by _unique), which says more than the prefix does
    if r.code.startswith(BUILTIN_PREFIX) and not retired_reason(r.code):
        raise RuleLoadError(f"{r.source}: rule {r.code} ({r.name}) uses the prefix GD, which is reserved for "
                            "gpudoctor's built-in rules; give your team's rules their own prefix, e.g. ACME101.")


def _check_not_retired(r: Rule) -> None:
    for code in r.codes:
        reason = retired_reason(code)
        if reason is not None:
            raise RuleLoadError(f"{r.source}: rule {r.code} ({r.name}) uses the retired code {code}, which is never "
                                f"given to another rule; choose another code. {reason}")


def _defined_at(r: Rule) -> tuple[str, int]:
    code = r.func.__code__
    return os.path.realpath(code.co_filename), code.co_firstlineno


def _unique(rules: list[Rule]) -> list[Rule]:
    """One rule per code: a file named twice (pyproject.toml and --rules) is loaded once; two rules with one code
    (or one rule's code that is another's alias) are refused."""
    kept: dict[str, Rule] = {}
    answers: dict[str, Rule] = {}  # every code and alias, and the rule it names
    for r in rules:
        _check_not_retired(r)
        for key in (r.code, *r.aliases):
            other = answers.get(key)
            if other is not None and _defined_at(r) != _defined_at(other):
                raise RuleLoadError(_taken(r, key, other))
        if r.code not in kept:
            kept[r.code] = r
            answers.update(dict.fromkeys((r.code, *r.aliases), r))
    return list(kept.values())


def _taken(r: Rule, key: str, other: Rule) -> str:
    if key == r.code and key == other.code:
        return (f"{r.source}: rule code {r.code} ({r.name}) is already used by {other.name} from {other.source}; "
                "give one of them another code.")
    return (f"{r.source}: rule {r.code} ({r.name}) and rule {other.code} ({other.name}, from {other.source}) both "
            f"answer to {key} (a code or an alias); give one of them another.")


def load_rules(specs: Iterable[str] = (), *, builtins: bool = True, packages: bool = True) -> list[Rule]:
    """All rules, checked: documented, custom rules off the GD prefix, no code or alias used twice."""
    rules = builtin_rules() if builtins else []
    custom = _package_rules() if packages else []
    for spec in specs:
        found = _rules_from_spec(spec)
        if not found:
            raise RuleLoadError(f"{spec}: defines no rules; decorate a function with @gpudoctor.rule(...).")
        custom += found
    for r in custom:
        _check_custom(r)
    return _unique(rules + custom)
