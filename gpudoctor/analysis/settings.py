"""Where the script sets a value that advice changes: the keyword of the call at a finding's line
(`DataLoader(..., num_workers=a.workers)`), and, when the script reads it from its command line, the flag that feeds
it (`parser.add_argument("--workers", type=int, default=2)`): "run with --workers 9" is advice in the user's terms.

The script's source is read where it was run (the location's file), parsed once; a file that is not here, or does
not parse, gives no setting, and the advice names the keyword alone.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.analysis.views import Location


@dataclass(frozen=True)
class Setting:
    """`keyword=expression` in the call at a line; `flag` the command-line option that sets the expression's value
    (declared at `flag_line`), where the script has one."""

    keyword: str
    expression: str
    flag: str | None = None
    flag_line: int | None = None


def setting_at(location: Location | None, keyword: str) -> Setting | None:
    """The `keyword` argument of the call at `location` (a call spanning its line), and the flag that feeds it."""
    if location is None:
        return None
    tree = _parsed(location.file)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno <= location.line <= (node.end_lineno or node.lineno):
            given = next((k.value for k in node.keywords if k.arg == keyword), None)
            if given is not None:
                flag, line = _flag_of(tree, _name_read(given))
                return Setting(keyword, ast.unparse(given), flag, line)
    return None


@functools.lru_cache(maxsize=32)
def _parsed(file: str) -> ast.Module | None:
    try:
        return ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


def _name_read(expression: ast.expr) -> str | None:
    """The name an expression reads its value from: `args.workers` -> "workers", `workers` -> "workers"."""
    if isinstance(expression, ast.Attribute):
        return expression.attr
    if isinstance(expression, ast.Name):
        return expression.id
    return None


def _flag_of(tree: ast.Module, name: str | None) -> tuple[str | None, int | None]:
    """The option of an `add_argument(...)` call whose destination is `name` (argparse's: `--num-workers` stores
    into num_workers, `dest=` wins), and its line."""
    if name is None:
        return None, None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        dest = next((k.value.value for k in node.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)),
                    None)
        longest = max(options, key=len, default="")
        if dest == name or (dest is None and longest.lstrip("-").replace("-", "_") == name):
            return longest, node.lineno
    return None, None


def call_of(file: str, callee: str) -> Location | None:
    """Where the script at `file` calls `callee` (`TrainingArguments(...)`, `Trainer(...)`), first in the file."""
    tree = _parsed(file)
    if tree is None:
        return None
    for function, node in _calls(tree, "<module>"):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name == callee:
            return Location(file, node.lineno, function)
    return None


def _calls(node: ast.AST, function: str) -> list[tuple[str, ast.Call]]:
    """Every call under `node`, in the order of the source, with the function it is in."""
    found: list[tuple[str, ast.Call]] = []
    for child in ast.iter_child_nodes(node):
        inside = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
        if isinstance(child, ast.Call):
            found.append((function, child))
        found += _calls(child, inside)
    return sorted(found, key=lambda pair: (pair[1].lineno, pair[1].col_offset))
