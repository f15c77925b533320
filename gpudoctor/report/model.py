"""Build the Report: everything the renderers show, ready for them to format.

The figures come from analysis (`analysis.summary`, `analysis.timeline`, `analysis.kernels`); this module only
assembles them, with their labels (report.charts labels the charts), into the Report, a JSON-serializable dict
whose shape is report.document.Report. `findings.json` is a fixed subset of it (see render.to_json and
gpudoctor/schemas/findings.schema.json); the rest feeds report.html:

- `summary`, `run`, `not_measured`: the verdict and the facts at the top;
- `breakdown`, `steps` and `charts.steps`: where each step's time went (mean per phase, each step, and per-step bars);
- `charts.timeline`: GPU utilization, CPU of the script's process tree and of the host, loader wait per step, over
  the whole run, bucketed to at most MAX_POINTS points so that a long run stays a small page;
- `charts.kernels`: the kernel-duration histogram, whenever the trace has GPU kernels (not only when a launch-bound
  rule fires: the shape is worth a look on any run, and `launch_bound` says when a small-batch finding points at it);
- `cards` (report.cards): one per finding, with the user's source lines around its location (read now, if the file
  is still there) and the rule's full documentation.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from gpudoctor._version import __version__
from gpudoctor.analysis import Run
from gpudoctor.analysis.shares import gpu_idle_share
from gpudoctor.analysis.summary import PhaseTime, breakdown
from gpudoctor.analysis.throughput import why_not_counted
from gpudoctor.analysis.timeline import MAX_POINTS
from gpudoctor.analysis.views import Location, StartedProcess, Step
from gpudoctor.bundle import SCHEMA_VERSION
from gpudoctor.bundle.events import FlopsEvent
from gpudoctor.bundle.findings import LocationJson
from gpudoctor.bundle.manifest import Target, WindowSettings
from gpudoctor.engine import EngineResult
from gpudoctor.engine.windows import WindowStats
from gpudoctor.report.budget import budget_json, host_lines_json
from gpudoctor.report.cards import card, created_at
from gpudoctor.report.charts import PHASE_LABELS, kernel_chart, step_chart, timeline_chart
from gpudoctor.report.document import (
    BreakdownJson,
    CpuWaitJson,
    ExceptionFacts,
    Links,
    NotMeasuredRow,
    PhaseRow,
    Report,
    RunFacts,
    StepRow,
    Summary,
    ThroughputJson,
    WindowRow,
    WindowSettingsJson,
)
from gpudoctor.report.together import LeftAfterTry, headline
from gpudoctor.report.verdict import problems, shown_file, too_short, unexplained_idle, verdict, with_raised
from gpudoctor.report.verdict import status as status_of

__all__ = ["MAX_POINTS", "build_report", "link_outputs"]

COLLECTOR_LABELS = {
    "host": "host and process samples", "nvml": "GPU samples (NVML)", "profiler": "profiler trace",
    "nvtx": "NVTX ranges for Nsight Systems", "cuda_trace": "GPU activity in the profiler trace",
    "cupti_detach": "the pace of the steps after the window",
}


def _step_row(step: Step) -> StepRow:
    """A step's host seconds in each phase (those of analysis.summary.phase_seconds) and its GPU time."""
    return {
        "index": step.index, "wall_s": step.wall_s, "window": step.window,
        "data_wait_s": step.data_wait_s, "copy_s": step.copy_s, "forward_s": step.forward_s,
        "backward_s": step.backward_s, "optimizer_s": step.optimizer_s, "sync_s": step.sync_s, "other_s": step.other_s,
        "gpu_busy_s": step.gpu_busy_s, "gpu_idle_s": step.gpu_idle_s, "kernels": step.kernels,
    }


def _breakdown(steps: list[Step], wait_share: float | None, step_s: float | None) -> BreakdownJson:
    """The step and its phases: each phase's share of the steps whose phases were timed (see
    analysis.summary.breakdown), with the data wait of every step after start-up, of the run's one step figure
    (`step_s`, the step at the run's pace) where there is one: the timed steps ran with gpudoctor's hooks on."""
    result = breakdown(steps, wait_share)
    step = step_s or result.mean_step_s
    return {"phases": [_phase_row(p, step) for p in result.phases], "mean_step_s": step}


def _phase_row(phase: PhaseTime, step_s: float | None) -> PhaseRow:
    mean_s = phase.share * step_s if step_s else phase.mean_s
    return {"phase": phase.phase, "label": PHASE_LABELS[phase.phase], "mean_s": mean_s, "share": phase.share}


TRACE_LEFT_OUT = "the profiler trace"
TRACE_CUT_SHORT = "the end of the profiler trace"


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _not_measured(run: Run) -> list[NotMeasuredRow]:
    rows: list[NotMeasuredRow] = []
    for name, info in run.manifest.collectors.items():
        if not info.ok:
            rows.append({"what": COLLECTOR_LABELS.get(name, name), "reason": info.reason or "unknown"})
    if run.trace_only:
        rows.append({"what": "host, process and GPU samples", "reason": "only a trace was analysed, not a run bundle"})
    if run.trace_error is not None:
        rows.append({"what": TRACE_LEFT_OUT, "reason": f"{run.trace_error.rstrip('.')}; it is left out, and the "
                                                       "report comes from the run's events and samples"})
    cut = run.trace.cut_short if run.trace is not None else None
    if cut is not None:
        rows.append({"what": TRACE_CUT_SHORT,
                     "reason": f"{run.trace_file} ends early, {_size(cut)} into the file, before its list of events "
                               "does (a run stopped while it was written, a disk that filled): the events before "
                               "that are analysed"})
    rows += [{"what": f"the work of {_started_text(group, run)}", "reason": _unprofiled_reason(group)}
             for group in _unprofiled_groups(run)]
    short = too_short(run)
    if short is not None:
        rows.append({"what": "the step without the profiler", "reason": short})
    return rows


def _unprofiled_groups(run: Run) -> list[list[StartedProcess]]:
    """The processes the script started that did work of their own, grouped by what they run and where."""
    groups: dict[tuple[str | None, Location | None], list[StartedProcess]] = {}
    for process in run.host.started_processes:
        if process.worked:
            groups.setdefault((process.target, process.location), []).append(process)
    return list(groups.values())


def _started_text(group: list[StartedProcess], run: Run) -> str:
    """'2 processes the script started to run train (main.py:87)'."""
    first = group[0]
    count = "1 process" if len(group) == 1 else f"{len(group)} processes"
    runs = f" to run {first.target}" if first.target else ""
    where = first.location
    at = f" ({shown_file(where.file, run.manifest.cwd)}:{where.line})" if where else ""
    return f"{count} the script started{runs}{at}"


def _unprofiled_reason(group: list[StartedProcess]) -> str:
    they, their = ("it", "its") if len(group) == 1 else ("they", "their")
    if any(p.used_gpu for p in group):
        did = f"{they} used the GPU"
    else:
        did = f"{they} used {sum(p.cores or 0.0 for p in group):.1f} cores"
    return f"{did}, and gpudoctor profiles only the process it runs: {their} steps are not in this report"


def _elsewhere(run: Run) -> str | None:
    groups = _unprofiled_groups(run)
    return " and ".join(_started_text(group, run) for group in groups) if groups else None


def _command(target: Target) -> str | None:
    if target.module:
        return shlex.join(["-m", target.module, *target.args])
    if target.script:
        return shlex.join([target.script, *target.args])
    return None


def _trace_file(run: Run) -> Path | None:
    if run.path is None or run.trace is None:
        return None
    return run.trace_file


def _exception(run: Run) -> ExceptionFacts | None:
    """What the script raised, when it ended with an exception."""
    ending = run.host.exit
    if not ending.exception:
        return None
    where = ending.location
    location: LocationJson | None = None if where is None else {
        "file": where.file, "line": where.line, "function": where.function,
    }
    return {"type": ending.exception, "message": ending.message or "", "location": location}


def _seconds_or_none(value: float | None) -> float | None:
    return None if value is None else round(value, 9)


def _window_settings(window: WindowSettings | None) -> WindowSettingsJson | None:
    if window is None:
        return None
    return {"wait": window.wait, "warmup": window.warmup, "active": window.active, "every_s": window.every_s}


def _run_facts(run: Run) -> RunFacts:
    manifest, env, steps = run.manifest, run.host.env, run.steps
    distortion, reference, pace = run.distortion, run.reference_step, run.pace
    target, exit_info = manifest.target, manifest.exit
    return {
        "script": target.module or target.script, "module": bool(target.module),
        "args": target.args, "command": _command(target), "cwd": manifest.cwd,
        "created": manifest.created, "duration_s": manifest.duration_s,
        "python": env.python, "torch": env.torch, "cuda": env.cuda_build, "driver": env.driver,
        "gpus": [g.name for g in env.gpus], "cuda_device": env.cuda_device.name if env.cuda_device else None,
        "cores": env.cores,
        "steps_total": run.step_view.steps_in_run, "steps_analysed": len(steps),
        "median_step_s": reference.seconds, "step_s": pace.reported_s, "step_s_basis": pace.basis,
        "step_s_steps": pace.steps, "step_s_evaluations": pace.evaluations,
        "step_s_stalls": pace.stalls, "step_source": run.step_source,
        "window_distortion": distortion.ratio, "window_distortion_reason": distortion.reason,
        "median_step_outside_window": reference.outside,
        "gpu_work_per_step_s": _seconds_or_none(run.gpu_work.per_step_s),
        "host_ran_ahead": run.data_wait is not None and run.data_wait.gpu_bound,
        "ending": exit_info.ending if exit_info else None, "exit_status": exit_info.status if exit_info else None,
        "exception": _exception(run), "window": _window_settings(manifest.window),
        "trace_only": run.trace_only,
        "trace": run.trace_file.name if run.trace is not None and run.trace_file and not run.trace_only else None,
        "budget": None,  # build_report fills it in, with the findings that claim each slice
        "host_lines": host_lines_json(run.sites.host_lines),
        "throughput": throughput_json(run),
        "cpu_wait": cpu_wait_json(run),
    }


def cpu_wait_json(run: Run) -> CpuWaitJson:
    found = run.host.cpu_wait

    def share(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    return {"main_thread": share(found.main_thread), "loader_workers": share(found.loader_workers),
            "workers": found.workers, "pin_memory_thread": share(found.pin_memory_thread),
            "host_pressure": share(found.host_pressure), "throttled": share(found.throttled)}


def throughput_json(run: Run) -> ThroughputJson | None:
    """The step's matrix throughput against the device's peak; where the work was not counted, why, with no
    figures (a CPU run, or one without a step, has neither)."""
    found = run.throughput
    if found is None:
        counted = [e for e in run.events(FlopsEvent) if e.reason]
        if not counted or not run.pace.seconds or run.gpu is None:
            return None
        return {"flops": 0.0, "by_precision": {}, "tflops": 0.0, "device": None, "peak_tflops": None,
                "utilization": None, "reason": why_not_counted(counted), "other_share": None}
    precision = run.gpu_work.precision
    other = round(precision.share("other"), 4) if precision is not None and precision.kernel_s > 0 else None
    return {"flops": found.flops, "by_precision": found.by_precision, "tflops": round(found.tflops, 3),
            "device": found.device, "peak_tflops": found.peaks,
            "utilization": round(found.utilization, 4) if found.utilization is not None else None,
            "reason": found.reason, "other_share": other}


def build_report(run: Run, result: EngineResult, docs: Mapping[str, str] | None = None,
                 windows: list[WindowStats] | None = None, left: LeftAfterTry | None = None) -> Report:
    """The Report of `run` and its rules' `result`; `docs` maps a rule code to its full documentation.

    `windows` has one row per profiling window of a run profiled with --every (see engine.windows);
    `run` is then the window the charts show. `left`: what the fastest measured try's own run still shows,
    which the verdict gives after that try (report.together).
    """
    steps = run.steps
    idle = gpu_idle_share(run)
    created = created_at(run)
    found = problems(result.findings)
    not_measured = _not_measured(run)
    unexplained = unexplained_idle(run, result.findings)
    status = status_of(result.findings, steps, not_measured, unexplained)
    findings = [f.to_json() for f in result.findings]  # the report, as findings.json, holds them as JSON
    launch_bound = any(f.category == "small_batch" for f in found)  # the kernel chart shows why
    facts = _run_facts(run)
    facts["budget"] = budget_json(run.budget, result.findings)
    summary: Summary = {
        "verdict": headline(with_raised(run, verdict(idle, result.findings, steps, status, _elsewhere(run),
                                                       facts["step_s"], unexplained, run.manifest.cwd)),
                            facts["step_s"], result.findings, left),
        "gpu_idle_share": idle, "healthy": not found and unexplained is None, "problems": len(found), "status": status,
    }
    if left is not None:
        summary["after_try"] = left.to_json()
    return {
        "schema_version": SCHEMA_VERSION,
        "gpudoctor_version": __version__,
        "run": facts,
        "summary": summary,
        "not_measured": not_measured,
        # The phases are timed in the window's detail steps; the data wait is every step's.
        "breakdown": _breakdown(run.step_view.hooked_steps or steps, run.steady_wait_share, facts["step_s"]),
        "steps": [_step_row(s) for s in steps],
        "charts": {
            "steps": step_chart(steps), "timeline": timeline_chart(run), "kernels": kernel_chart(run, launch_bound),
        },
        "cards": [card(i, f, shown, run, docs or {}, created)
                  for i, (f, shown) in enumerate(zip(result.findings, findings))],
        "links": _links(run),
        "windows": _windows(run, windows or []),
        "ranks": [],
        "findings": findings,
        "not_evaluated": [row.to_json() for row in result.not_evaluated],
        "errors": [row.to_json() for row in result.errors],
    }


def _links(run: Run) -> Links:
    trace = _trace_file(run)
    return {"trace": str(trace) if trace else None, "run": str(run.path.resolve()) if run.path is not None else None}


def _windows(shown: Run, rows: list[WindowStats]) -> list[WindowRow]:
    """The windows' rows with their start as seconds into the run, and which one the charts show."""
    started = created_at(shown)
    return [{**row, "start_s": None if started is None else max(0.0, row["start"] - started),
             "charted": row["index"] == shown.window} for row in rows]


def link_outputs(report: Report, out_dir: Path) -> Report:
    """The report as written into `out_dir`: its link to the raw trace made relative to there."""
    trace = report["links"]["trace"]
    if not trace:
        return report
    try:
        href = Path(os.path.relpath(trace, out_dir.resolve())).as_posix()
    except ValueError:  # another drive, on Windows
        href = Path(trace).as_posix()
    if not href.startswith(("/", "../")):
        href = "./" + href  # a run directory named "javascript:..." stays a path
    links = report["links"].copy()
    links["trace_href"] = quote(href)
    linked = report.copy()
    linked["links"] = links  # in the place the key had: the dict's order stays that of the Report
    return linked
