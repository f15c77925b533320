"""Finding rules: the built-in pack, installed packages (entry points `gpudoctor.rules`), files and modules."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from gpudoctor.engine import Rule
from gpudoctor.errors import RuleLoadError
from gpudoctor.paths import builtin_rules_dir

ENTRY_POINT_GROUP = "gpudoctor.rules"
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
    except Exception as exc:
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


def rules_in(module: ModuleType) -> list[Rule]:
    return [value for value in vars(module).values() if isinstance(value, Rule)]


def _python_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith(("_", "test_")))


def builtin_rules() -> list[Rule]:
    found = [r for path in _python_files(builtin_rules_dir()) for r in rules_in(_import_file(path, "gpudoctor_builtin_rules"))]
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


def _package_rules() -> list[Rule]:
    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
        except Exception as exc:
            raise RuleLoadError(f"entry point {ep.name} ({ep.value}) in group {ENTRY_POINT_GROUP} failed to load: {exc}.") from None
        items = rules_in(loaded) if isinstance(loaded, ModuleType) else loaded if isinstance(loaded, list) else [loaded]
        dist = getattr(ep, "dist", None)
        source = f"package:{dist.name if dist else ep.value}"
        found += [r.with_source(source) for r in items if isinstance(r, Rule)]
    return found


def _defined_at(r: Rule) -> tuple[str, int]:
    code = r.func.__code__
    return os.path.realpath(code.co_filename), code.co_firstlineno


def load_rules(specs: Iterable[str] = (), *, builtins: bool = True, packages: bool = True) -> list[Rule]:
    """All rules, checked: custom rules may not use the GD prefix, and no two rules share a code."""
    rules = builtin_rules() if builtins else []
    custom = _package_rules() if packages else []
    for spec in specs:
        found = _rules_from_spec(spec)
        if not found:
            raise RuleLoadError(f"{spec}: defines no rules; decorate a function with @gpudoctor.rule(...).")
        custom += found
    for r in custom:
        if r.code.startswith(BUILTIN_PREFIX):
            raise RuleLoadError(f"{r.source}: rule {r.code} ({r.name}) uses the prefix GD, which is reserved for "
                                "gpudoctor's built-in rules; give your team's rules their own prefix, e.g. ACME101.")
    seen: dict[str, Rule] = {}
    for r in rules + custom:
        if r.code in seen and _defined_at(r) != _defined_at(seen[r.code]):
            raise RuleLoadError(f"{r.source}: rule code {r.code} ({r.name}) is already used by {seen[r.code].name} "
                                f"from {seen[r.code].source}; give one of them another code.")
        seen.setdefault(r.code, r)  # a file named twice (pyproject.toml and --rules) is loaded once
    return list(seen.values())


def select_rules(rules: list[Rule], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[Rule]:
    """Keep rules whose code starts with a selected prefix and with no ignored one (as linters do)."""
    select, ignore = tuple(select), tuple(ignore)
    return [r for r in rules if (not select or r.code.startswith(select)) and not r.code.startswith(ignore)]
