"""What a rule author writes: the `@rule` decorator and `Finding`; and `Rule`, what the decorator declares.

`@rule(...)` checks the declaration (code, name, category, severity, docstring, signature) and returns the
function itself, still callable, with its `Rule` attached as `func.rule`: loading finds rules by it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpudoctor.analysis.views import Location
from gpudoctor.errors import RuleLoadError
from gpudoctor.remedy import Remedy
from gpudoctor.vocabulary import CATEGORIES, SEVERITIES

# What a rule looks at: one process's run (a `Run`), or a torchrun job's ranks together (a `gpudoctor.job.Job`).
SCOPES = ("run", "job")
CODE_PATTERN = re.compile(r"^[A-Z][A-Z0-9]{0,7}[0-9]{3}$")
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
RULE_ATTRIBUTE = "rule"  # where @rule puts the Rule on the function it decorates
# The docstring's paragraphs that every rule has ("What it detects: ..."); "Example" and "Impact" are optional.
REQUIRED_SECTIONS = ("What it detects", "Why it matters", "Fix")


@dataclass
class Finding:
    """What a rule yields: one problem, with the number that matters in its title.

    `impact` is the estimated share of step time (0-1) that fixing it would recover, or None with
    `impact_reason` saying why it cannot be estimated. `evidence` maps a label to a value, or to a
    (value, unit) pair. `severity` overrides the rule's default for this one finding. `remedy`, where the fix
    is a setting gpudoctor can change at run time, is what `gpudoctor profile --try-fixes` runs the script with
    to measure the fix (gpudoctor.remedy).
    """

    title: str
    impact: float | None = None
    location: Location | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    impact_reason: str | None = None
    severity: str | None = None
    count: int = 1
    remedy: Remedy | None = None


RuleFunction = Callable[..., Iterable[Finding]]
F = TypeVar("F", bound=RuleFunction)


@dataclass(frozen=True)
class Rule:
    """A declared rule: its identity, its function and options (keyword parameters with their defaults), its
    documentation (the docstring), the codes or names it had before (`aliases`) and where it was loaded from."""

    code: str
    name: str
    category: str
    severity: str
    func: RuleFunction
    options: Mapping[str, Any]
    doc: str
    aliases: tuple[str, ...] = ()
    source: str = "built-in"
    # The share of the step its impact claims (e.g. "data_wait"): of the findings, on one line, whose rules claim
    # the same share, only the largest keeps its impact (engine.runner), so no time is counted twice.
    claims: str | None = None
    scope: str = "run"  # one of SCOPES

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    @property
    def where(self) -> str:
        """`file:line` of the function, for messages."""
        return where_defined(self.func)

    @property
    def alias_codes(self) -> tuple[str, ...]:
        return tuple(a for a in self.aliases if CODE_PATTERN.match(a))

    @property
    def codes(self) -> tuple[str, ...]:
        """Its code and the codes it had before: what --select and --ignore prefixes are matched against."""
        return (self.code, *self.alias_codes)

    def with_source(self, source: str) -> Rule:
        return dataclasses.replace(self, source=source)


def rule_of(obj: object) -> Rule | None:
    """The Rule of a function decorated with @rule (or a Rule itself); None for anything else."""
    if isinstance(obj, Rule):
        return obj
    attached = getattr(obj, RULE_ATTRIBUTE, None) if callable(obj) else None
    return attached if isinstance(attached, Rule) else None


def where_defined(func: Callable[..., Any]) -> str:
    """`file:line` of a function (the line of its first decorator, as inspect.getsourcelines says), read from its
    code object: reading and tokenizing each rule's file for it took 50 ms of every `gpudoctor analyze`."""
    try:
        source, code = inspect.getsourcefile(func), inspect.unwrap(func).__code__
    except (AttributeError, TypeError, ValueError):
        source = code = None
    if source is None or code is None:
        return getattr(func, "__module__", "?")
    return f"{source}:{code.co_firstlineno}"


def missing_sections(doc: str) -> list[str]:
    """The required sections that no line of `doc` starts ("Fix: ..."), in their order."""
    return [s for s in REQUIRED_SECTIONS if not re.search(rf"^\s*{re.escape(s)}:", doc, re.MULTILINE)]


# -- checks at declaration -----------------------------------------------------------------------
def check_code(code: str, where: str) -> None:
    if not CODE_PATTERN.match(code):
        raise RuleLoadError(
            f"{where}rule code '{code}' is malformed: use a prefix of capital letters and three digits, e.g. ACME101."
        )


def check_category(code: str, category: str, where: str) -> None:
    if category not in CATEGORIES:
        raise RuleLoadError(
            f"{where}rule {code} category '{category}' is unknown; use one of: {', '.join(CATEGORIES)}."
        )


def _check_declaration(code: str, name: str, category: str, severity: str, where: str) -> None:
    check_code(code, where)
    if not NAME_PATTERN.match(name):
        raise RuleLoadError(f"{where}rule {code} name '{name}' must be kebab-case, e.g. loader-starves-gpu.")
    check_category(code, category, where)
    if severity not in SEVERITIES:
        raise RuleLoadError(f"{where}rule {code} severity '{severity}' is unknown; use info, warning or critical.")


def _check_aliases(code: str, aliases: tuple[str, ...], where: str) -> None:
    for alias in aliases:
        if not (CODE_PATTERN.match(alias) or NAME_PATTERN.match(alias)):
            raise RuleLoadError(f"{where}rule {code} alias '{alias}' is neither a rule code (ACME101) nor a kebab-case "
                                "name; aliases are the codes and names the rule had before.")


def _rule_options(func: Callable[..., Any], code: str, where: str) -> dict[str, Any]:
    """The rule's options: keyword parameters with defaults after the first parameter, `run`."""
    params = list(inspect.signature(func).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise RuleLoadError(
            f"{where}rule {code} must take the run as its first parameter: def {func.__name__}(run, ...)."
        )
    options = {}
    for param in params[1:]:
        if param.default is inspect.Parameter.empty or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise RuleLoadError(
                f"{where}rule {code} parameter '{param.name}' needs a default value: every parameter after "
                f"`run` is an option (e.g. {param.name}: float = 0.25)."
            )
        options[param.name] = param.default
    return options


def rule(code: str, name: str, *, category: str, severity: str = "warning",
         aliases: Iterable[str] = (), claims: str | None = None, scope: str = "run") -> Callable[[F], F]:
    """Declare a rule: `@rule("ACME101", "loader-starves-gpu", category="data_starvation")`.

    The decorated function takes a `Run` and yields `Finding`s; its docstring is the rule's documentation;
    its keyword parameters (with defaults) are its options. It stays a plain function (a test may call it
    on a run), with its `Rule` as `func.rule`. `aliases` are the codes and names the rule had before a
    rename: --select, --ignore, rule options, `rules explain` and gpudoctor.testing accept them too.
    `claims` names the share of the step the rule's impact is made of ("data_wait", "host_copy", "sync", ...):
    where several findings on one line claim the same share, the largest keeps its impact and the others say
    whose it is. `scope="job"` declares a rule of a torchrun job: it takes a `gpudoctor.job.Job` (every rank's
    run and findings) instead of a Run, and runs once per job.
    """
    known_as = tuple(aliases)

    def decorate(func: F) -> F:
        where = f"{where_defined(func)}: "
        _check_declaration(code, name, category, severity, where)
        _check_aliases(code, known_as, where)
        if scope not in SCOPES:
            raise RuleLoadError(f"{where}rule {code} scope '{scope}' is unknown; use run or job.")
        if not (func.__doc__ or "").strip():
            raise RuleLoadError(f"{where}rule {code} has no docstring; its docstring is the documentation users read.")
        declared = Rule(code, name, category, severity, func, _rule_options(func, code, where),
                        inspect.cleandoc(func.__doc__ or ""), known_as, claims=claims, scope=scope)
        setattr(func, RULE_ATTRIBUTE, declared)
        return func

    return decorate
