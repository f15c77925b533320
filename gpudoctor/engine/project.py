"""A project's rules: the built-in pack, its installed packages, what pyproject.toml and the command line name,
loaded, checked and selected before anything runs, with their options."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.bundle.confined import inside
from gpudoctor.bundle.layout import MANIFEST, rank_dirs
from gpudoctor.engine.api import Rule
from gpudoctor.engine.isolation import DEFAULT_RULE_TIMEOUT_S, RuleLimits
from gpudoctor.engine.loading import load_rules
from gpudoctor.engine.lookup import select_rules
from gpudoctor.engine.options import ProjectConfig, load_project_config, parse_cli_options, resolve_options
from gpudoctor.errors import RuleLoadError


@dataclass
class RuleSelection:
    """What the command line asked for; pyproject.toml's [tool.gpudoctor] adds to it."""

    paths: tuple[str, ...] = ()
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # CODE.option=value
    rule_timeout_s: float | None = None  # --rule-timeout; else pyproject.toml's, else the default


@dataclass
class PreparedRules:
    rules: list[Rule]
    options: dict[str, dict[str, object]]  # rule code -> option -> value, checked against the option's default
    limits: RuleLimits = field(default_factory=RuleLimits)

    @property
    def docs(self) -> dict[str, str]:
        """Each rule's full documentation, by code: what the report's cards quote."""
        return {r.code: r.doc for r in self.rules}


@dataclass
class ProjectRules:
    """Every rule loaded for a project (built-in, packages, pyproject.toml, --rules) and the options it sets."""

    config: ProjectConfig
    rules: list[Rule]
    options: dict[str, dict[str, object]]  # from pyproject.toml only

    def selected(self, selection: RuleSelection) -> list[Rule]:
        ignore = [*self.config.ignore, *selection.ignore]
        return select_rules(self.rules, selection.select or self.config.select, ignore)


def load_project_rules(paths: Iterable[str] = (), project_dir: Path | None = None) -> ProjectRules:
    """Load and check the rules that pyproject.toml names and `paths` add, and the options it sets."""
    project = load_project_config(project_dir)
    loaded = load_rules([*project.rule_paths, *paths])
    return ProjectRules(project, loaded, resolve_options(loaded, (str(project.source), project.options)))


def refuse_project_inside(paths: Iterable[Path], project_dir: Path | None = None) -> None:
    """Raise RuleLoadError when the project's pyproject.toml, found from the current directory, lies inside one of
    the run directories `paths` (or those of their findings.json) and sets [tool.gpudoctor]: a run directory is
    data, often someone else's, and the rules such a file names would be imported from it."""
    project = load_project_config(project_dir)
    if project.source is None or project == ProjectConfig(source=project.source):
        return
    for path in paths:
        run_dir = path if path.is_dir() else path.parent
        if ((run_dir / MANIFEST).is_file() or rank_dirs(run_dir)) and inside(run_dir, project.source):
            raise RuleLoadError(f"{project.source} lies inside the run directory {run_dir}, which gpudoctor reads "
                                "as data: its [tool.gpudoctor] settings and rules are not loaded from there; run "
                                "gpudoctor from your project's directory instead.")


def prepare_rules(selection: RuleSelection, project_dir: Path | None = None) -> PreparedRules:
    """Load, check and select the rules before anything runs, so a bad rule file fails fast."""
    project = load_project_rules(selection.paths, project_dir)
    options = resolve_options(project.rules, (str(project.config.source), project.options),
                              ("--rule-option", parse_cli_options(list(selection.options))))
    timeout = selection.rule_timeout_s or project.config.rule_timeout_s or DEFAULT_RULE_TIMEOUT_S
    return PreparedRules(project.selected(selection), options, RuleLimits(time_s=timeout))
