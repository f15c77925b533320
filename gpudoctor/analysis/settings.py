"""Where the script sets a value that advice changes: the keyword of the call at a finding's line
(`DataLoader(..., num_workers=a.workers)`), and, when the script reads it from its command line, the flag that feeds
it (`parser.add_argument("--workers", type=int, default=2)`): "run with --workers 9" is advice in the user's terms.

A script may change the flag's value before the call reads it: pytorch/examples' ImageNet divides `--workers` among
the GPUs of the node (`args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)`), so that the
DataLoader of each rank gets a share. `Setting.rewrites` are those assignments, and `flag_value` follows them: the
flag's value that gives the wanted setting, checked first against the run (the flag's value as given, through the
rewrites, must give the setting the run had), else None, and the advice says what it could not follow.

The script's source is read where it was run (the location's file), parsed once; a file that is not here, or does
not parse, gives no setting, and the advice names the keyword alone.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.analysis.views import Location


@dataclass(frozen=True)
class Rewrite:
    """An assignment that changes the flag's value before the call reads it: `source` at `line`."""

    line: int
    source: str


@dataclass(frozen=True)
class Setting:
    """`keyword=expression` in the call at a line; `flag` the command-line option that sets the expression's value
    (declared at `flag_line`, with its other spellings in `options` and its `default`), where the script has one,
    and the assignments that change that value before the call, in the order of the source."""

    keyword: str
    expression: str
    flag: str | None = None
    flag_line: int | None = None
    options: tuple[str, ...] = ()
    default: str | None = None
    rewrites: tuple[Rewrite, ...] = ()


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
                return _setting(tree, keyword, given, node.lineno)
    return None


def _setting(tree: ast.Module, keyword: str, given: ast.expr, call_line: int) -> Setting:
    name = _name_read(given)
    declared = _declaration(tree, name)
    if declared is None:
        return Setting(keyword, ast.unparse(given))
    options = tuple(a.value for a in declared.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    default = next((ast.unparse(k.value) for k in declared.keywords if k.arg == "default"), None)
    return Setting(keyword, ast.unparse(given), max(options, key=len), declared.lineno, options, default,
                   _rewrites(tree, given, call_line))


def _rewrites(tree: ast.Module, read: ast.expr, before_line: int) -> tuple[Rewrite, ...]:
    """The assignments to what the call reads (`args.workers = ...`, `args.workers //= n`) before its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign):
            targets = [node.target]
        else:
            continue
        if node.lineno < before_line and any(_same_place(target, read) for target in targets):
            found.append(Rewrite(node.lineno, ast.unparse(node)))
    return tuple(sorted(found, key=lambda r: r.line))


def _same_place(target: ast.expr, read: ast.expr) -> bool:
    """`args.workers` and `opt.workers` (the namespace is often passed on under another name), or `workers`."""
    if isinstance(read, ast.Attribute):
        return isinstance(target, ast.Attribute) and target.attr == read.attr
    return isinstance(read, ast.Name) and isinstance(target, ast.Name) and target.id == read.id


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


def _declaration(tree: ast.Module, name: str | None) -> ast.Call | None:
    """The `add_argument(...)` call whose destination is `name` (argparse's: `--num-workers` stores into
    num_workers, `dest=` wins)."""
    if name is None:
        return None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        dest = next((k.value.value for k in node.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)),
                    None)
        longest = max(options, key=len, default="")
        if longest and (dest == name or (dest is None and longest.lstrip("-").replace("-", "_") == name)):
            return node
    return None


@dataclass(frozen=True)
class FlagValue:
    """The flag's value that gives the wanted setting: `option value` (the spelling the user typed, else the
    longest), and the rewrites it was followed through (none when the flag feeds the call as it is)."""

    option: str
    value: int
    through: tuple[Rewrite, ...] = ()
    names: tuple[tuple[str, float], ...] = ()  # the values the rewrites' other names took: ("ngpus_per_node", 2)


# The names a rewrite divides by, read as the run's own figures: the ranks on this host (one per GPU) or the job's.
RANKS_ON_HOST = ("per_node", "gpus", "ngpu", "nproc", "local_world", "devices", "device_count")
WORLD = ("world_size",)
MAX_FLAG_VALUE = 4096


def flag_value(setting: Setting, wanted: int, had: int, args: Sequence[str],
               known: Mapping[str, float]) -> FlagValue | None:
    """The value of `setting.flag` that gives `wanted` where the call reads it, the run having had `had` from the
    flag as given in `args` (else its default); `known` holds "ranks_on_host" and "world_size". None where the
    script's rewrites cannot be followed, or do not give what the run had."""
    if setting.flag is None:
        return None
    given = _given(setting, args)
    if given is None:
        return None
    option = _typed_option(setting.options, args) or setting.flag
    plain = _followed(setting, (), given, wanted, had, known, option)
    through = _followed(setting, setting.rewrites, given, wanted, had, known, option) if setting.rewrites else None
    if through is None or (plain is not None and through.value == plain.value):
        return plain
    # Both fit what the run had (-j 0 gives 0 either way): the rewrites, where they read the run's ranks (a rewrite
    # under a condition the run did not meet would not have read them: ImageNet's, run on one GPU, divides by 1).
    if plain is None or through.names:
        return through
    return plain


def _followed(setting: Setting, rewrites: tuple[Rewrite, ...], given: int, wanted: int, had: int,
              known: Mapping[str, float], option: str) -> FlagValue | None:
    """The flag's value through `rewrites` that gives `wanted`, if they give what the run `had` from `given`."""
    names: dict[str, float] = {}
    if _through(rewrites, setting.expression, given, known, names) != had:
        return None
    values = [v for v in range(MAX_FLAG_VALUE + 1) if _through(rewrites, setting.expression, v, known, names) == wanted]
    if not values:
        return None
    best = next((v for v in values if wanted and v % wanted == 0), values[0])  # 30 over 29 for 15 a rank
    return FlagValue(option, best, rewrites, tuple(sorted(names.items())))


def _typed_option(options: Sequence[str], args: Sequence[str]) -> str | None:
    """The spelling of the flag the user typed last (`-j` of `-j 4`, `--workers` of `--workers=4`)."""
    typed = None
    for arg in args:
        typed = next((o for o in options if arg == o or arg.startswith(o + "=")
                      or (len(o) == 2 and not o.startswith("--") and arg.startswith(o) and arg[2:].isdigit())),
                     typed)
    return typed


def _given(setting: Setting, args: Sequence[str]) -> int | None:
    """The flag's value as the run had it: the last one typed, else the declared default."""
    value = setting.default
    for i, arg in enumerate(args):
        for option in setting.options:
            if arg == option and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(option + "="):
                value = arg.split("=", 1)[1]
            elif len(option) == 2 and not option.startswith("--") and arg.startswith(option) and arg[2:].isdigit():
                value = arg[2:]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _through(rewrites: Sequence[Rewrite], expression: str, value: int, known: Mapping[str, float],
             names: dict[str, float]) -> float | None:
    """The flag's `value` after each rewrite in turn, where each can be evaluated (arithmetic, int(), round(),
    math.ceil(), min(), max() over the flag, numbers and the names `known` answers)."""
    place = _name_read(_parse_expression(expression))
    current: float = value
    for rewrite in rewrites:
        statement = _statement(rewrite.source)
        if isinstance(statement, ast.AugAssign):
            operand = _evaluate(statement.value, place, current, known, names)
            result = None if operand is None else _binary(statement.op, current, operand)
        elif isinstance(statement, ast.Assign):
            result = _evaluate(statement.value, place, current, known, names)
        else:
            return None
        if result is None:
            return None
        current = result
    return current


@functools.lru_cache(maxsize=64)
def _statement(source: str) -> ast.stmt:
    return ast.parse(source).body[0]


@functools.lru_cache(maxsize=64)
def _parse_expression(source: str) -> ast.expr:
    return ast.parse(source, mode="eval").body


def _evaluate(node: ast.expr, place: str | None, current: float, known: Mapping[str, float],
              names: dict[str, float]) -> float | None:
    """The value of `node` with the flag's name (`place`) at `current`; None for anything else than arithmetic."""
    def value(sub: ast.expr) -> float | None:
        return _evaluate(sub, place, current, known, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _name_value(node, place, current, known, names)
    if isinstance(node, ast.BinOp):
        left, right = value(node.left), value(node.right)
        return None if left is None or right is None else _binary(node.op, left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = value(node.operand)
        return None if operand is None else -operand
    if isinstance(node, ast.Call) and not node.keywords:
        return _called(node, value, known, names)
    return None


def _name_value(node: ast.Name | ast.Attribute, place: str | None, current: float, known: Mapping[str, float],
                names: dict[str, float]) -> float | None:
    name = node.attr if isinstance(node, ast.Attribute) else node.id
    if name == place:
        return current
    figure = _known(name, known)
    if figure is not None:
        names[ast.unparse(node)] = figure
    return figure


def _known(name: str, known: Mapping[str, float]) -> float | None:
    lowered = name.lower()
    if any(word in lowered for word in WORLD) and "local" not in lowered:
        return known.get("world_size")
    if any(word in lowered for word in RANKS_ON_HOST):
        return known.get("ranks_on_host")
    return None


FUNCTIONS: dict[str, Callable[..., float]] = {
    "int": lambda x: float(int(x)), "round": lambda x: float(round(x)), "ceil": lambda x: float(math.ceil(x)),
    "floor": lambda x: float(math.floor(x)), "abs": abs, "max": max, "min": min, "float": float,
}


def _called(node: ast.Call, value: Callable[[ast.expr], float | None], known: Mapping[str, float],
            names: dict[str, float]) -> float | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name == "device_count" and not node.args:  # torch.cuda.device_count(): a GPU, and a rank, each
        figure = known.get("ranks_on_host")
        if figure is not None:
            names[ast.unparse(node)] = figure
        return figure
    if name not in FUNCTIONS or not node.args:
        return None
    operands = [value(arg) for arg in node.args]
    if any(o is None for o in operands):
        return None
    try:
        return FUNCTIONS[name](*operands)
    except (TypeError, ValueError, OverflowError):
        return None


def _binary(op: ast.operator, left: float, right: float) -> float | None:
    try:
        if isinstance(op, ast.Add):
            return left + right
        if isinstance(op, ast.Sub):
            return left - right
        if isinstance(op, ast.Mult):
            return left * right
        if isinstance(op, ast.Div):
            return left / right
        if isinstance(op, ast.FloorDiv):
            return float(left // right)
        if isinstance(op, ast.Mod):
            return left % right
    except ZeroDivisionError:
        return None
    return None


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


# The script's own precision setting, by the words its option or variable is named with, and the values that ask
# for bf16 among the ones it offers.
PRECISION_WORDS = ("dtype", "precision", "amp", "bf16", "mixed")
BF16_VALUES = ("bfloat16", "bf16", "bf16-mixed", "bf16_mixed", "amp_bf16")


@dataclass(frozen=True)
class PrecisionOption:
    """The script's own way to ask for bf16: an argparse option (`--dtype bfloat16`, or a switch `--bf16`) or a
    module-level setting (nanoGPT's `dtype = 'float32'`, which its configurator overrides), where it is."""

    spelling: str  # what to type, or to write: "--dtype bfloat16", "--bf16", "dtype = 'bfloat16'"
    location: Location


def precision_option(file: str) -> PrecisionOption | None:
    """The script's own option or setting for bf16, in the file at `file`: an add_argument whose option is named
    for the precision and offers bf16 among its choices (or is a switch named for it), else a module-level string
    variable so named that holds a dtype; None where the script has neither."""
    tree = _parsed(file)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            found = _bf16_argument(node)
            if found is not None:
                return PrecisionOption(found, Location(file, node.lineno, ""))
    for statement in tree.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str) and _named_for_precision(statement.targets[0].id)
                and statement.value.value in ("float32", "float16", "bfloat16", "fp32", "fp16", "bf16")):
            name = statement.targets[0].id
            return PrecisionOption(f"{name} = 'bfloat16'", Location(file, statement.lineno, "<module>"))
    return None


def _named_for_precision(name: str) -> bool:
    return any(word in name.lower() for word in PRECISION_WORDS)


def _bf16_argument(node: ast.Call) -> str | None:
    """'--dtype bfloat16' for an option so named that offers bf16 among its choices; '--bf16' for a switch."""
    options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longest = max(options, key=len, default="")
    if not longest.startswith("-") or not _named_for_precision(longest):
        return None
    keywords = {k.arg: k.value for k in node.keywords}
    action = keywords.get("action")
    if isinstance(action, ast.Constant) and action.value == "store_true":
        return longest if "bf16" in longest or "bfloat16" in longest else None
    choices = keywords.get("choices")
    if isinstance(choices, (ast.List, ast.Tuple, ast.Set)):
        offered = [c.value for c in choices.elts if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        wanted = next((value for value in offered if value.lower() in BF16_VALUES), None)
        return f"{longest} {wanted}" if wanted else None
    return None
