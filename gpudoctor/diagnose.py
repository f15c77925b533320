"""From a bundle (or a bare trace) to findings.json and report.html: analyse, run the rules, render."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.analysis import Run
from gpudoctor.bundle import FINDINGS, MANIFEST, REPORT
from gpudoctor.bundle.confined import inside
from gpudoctor.bundle.jsonio import write_replacing
from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.engine import (
    ProjectConfig,
    Rule,
    diagnose_windows,
    load_project_config,
    load_rules,
    parse_cli_options,
    resolve_options,
    select_rules,
)
from gpudoctor.engine.isolation import DEFAULT_RULE_TIMEOUT_S, RuleLimits
from gpudoctor.errors import BundleError, OutputNotWritableError, RuleLoadError
from gpudoctor.report import build_report
from gpudoctor.report.document import Report
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import to_html, to_json


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


# What torch.profiler.tensorboard_trace_handler writes: DIR/<worker>.<time>.pt.trace.json(.gz), found in the directory
# itself, in one run below it (torch-tb-profiler reads LOGDIR/RUN/) or in TensorBoard's plugins/profile/RUN/ layout.
PROFILER_TRACE_GLOBS = tuple(f"{where}*.pt.trace.{ext}" for where in ("", "*/", "plugins/profile/*/")
                             for ext in ("json", "json.gz"))


def profiler_traces(directory: Path) -> list[Path]:
    """The profiler traces of a TensorBoard profiler directory, oldest first (none that leads out of it by a link)."""
    found = {path for pattern in PROFILER_TRACE_GLOBS for path in directory.glob(pattern)
             if path.is_file() and inside(directory, path)}
    return sorted(found, key=lambda path: (path.stat().st_mtime, path.name))


def analysis_input(path: Path) -> tuple[Path, str | None]:
    """What `analyze PATH` reads: PATH, or the newest trace of a TensorBoard profiler directory and a sentence
    saying which."""
    if not path.is_dir() or (path / MANIFEST).exists():
        return path, None
    traces = profiler_traces(path)
    if not traces:
        raise BundleError(f"{path} is neither a gpudoctor run directory (it has no {MANIFEST}) nor a TensorBoard "
                          "profiler directory (it holds no *.pt.trace.json traces).")
    chosen = traces[-1]
    name = chosen.relative_to(path)
    if len(traces) == 1:
        return chosen, f"{path} holds one profiler trace; analysing it, {name}."
    return chosen, (f"{path} holds {len(traces)} profiler traces; analysing the newest, {name} "
                    "(use analyze PATH-TO-TRACE for another).")


def open_run(path: Path) -> Run:
    """A run directory, or a Chrome trace (.json / .json.gz) from torch.profiler."""
    return Run.from_bundle(path) if path.is_dir() else Run.from_trace(path)


def diagnose(run: Run, prepared: PreparedRules) -> Report:
    docs = {r.code: r.doc for r in prepared.rules}
    diagnosis = diagnose_windows(run, prepared.rules, prepared.options, prepared.limits)
    return build_report(diagnosis.run, diagnosis.result, docs, diagnosis.windows)


def write_outputs(report: Report, out_dir: Path, formats: Iterable[str] = ("json", "html")) -> dict[str, Path]:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = {}
        if "json" in formats:
            written["json"] = out_dir / FINDINGS
            write_replacing(written["json"], to_json(report).encode("utf-8"))
        if "html" in formats:
            written["html"] = out_dir / REPORT
            write_replacing(written["html"], to_html(link_outputs(report, out_dir)).encode("utf-8"))
        return written
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write the report to {out_dir} ({exc.strerror}).") from None
