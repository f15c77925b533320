"""Build the Report: everything the renderers show, computed here so that they only format."""

from __future__ import annotations

import statistics
from typing import Any

from gpudoctor import __version__
from gpudoctor.analysis import Run
from gpudoctor.analysis.views import Step
from gpudoctor.bundle import SCHEMA_VERSION
from gpudoctor.engine import EngineResult

PHASES = ("data_wait", "copy", "forward", "backward", "optimizer", "sync", "other")
COLLECTOR_LABELS = {
    "host": "host and process samples", "nvml": "GPU samples (NVML)", "profiler": "profiler trace",
    "nvtx": "NVTX ranges for Nsight Systems", "cuda_trace": "GPU activity in the trace",
}


def _phase_values(step: Step) -> dict[str, float | None]:
    return {
        "data_wait": step.data_wait_s, "copy": step.copy_s, "forward": step.forward_s, "backward": step.backward_s,
        "optimizer": step.optimizer_s, "sync": step.sync_s, "other": step.other_s,
    }


def _step_row(step: Step) -> dict[str, Any]:
    return {
        "index": step.index, "wall_s": step.wall_s, "window": step.window, **{f"{k}_s": v for k, v in _phase_values(step).items()},
        "gpu_busy_s": step.gpu_busy_s, "gpu_idle_s": step.gpu_idle_s, "kernels": step.kernels,
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _breakdown(steps: list[Step]) -> dict[str, Any]:
    """Mean seconds per step in each phase, with each phase's share of the mean step."""
    if not steps:
        return {"phases": [], "mean_step_s": None}
    mean_step = statistics.fmean(s.wall_s for s in steps)
    phases = []
    for phase in PHASES:
        values = [_phase_values(s)[phase] for s in steps]
        known = [v for v in values if v is not None]
        if known:
            mean = statistics.fmean(known)
            phases.append({"phase": phase, "mean_s": mean, "share": mean / mean_step if mean_step else 0.0})
    return {"phases": phases, "mean_step_s": mean_step}


def _gpu_idle_share(steps: list[Step]) -> float | None:
    measured = [s for s in steps if s.gpu_idle_s is not None]
    if not measured:
        return None
    return sum(s.gpu_idle_s or 0.0 for s in measured) / sum(s.wall_s for s in measured)


def _not_measured(run: Run) -> list[dict[str, str]]:
    rows = []
    for name, info in run.manifest.get("collectors", {}).items():
        if not info.get("ok", True):
            rows.append({"what": COLLECTOR_LABELS.get(name, name), "reason": info.get("reason", "unknown")})
    if run.trace_only:
        rows.append({"what": "host, process and GPU samples", "reason": "only a trace was analysed, not a run bundle"})
    return rows


def _verdict(idle: float | None, findings: list[dict[str, Any]], steps: list[Step]) -> str:
    if not steps:
        return "No training step was detected, so there is no step time to break down."
    problems = [f for f in findings if f["severity"] != "info"]
    idle_text = f"GPU idle {idle:.0%} of each step" if idle is not None else "GPU activity not measured"
    if not problems:
        return f"{idle_text}; no problems found." if idle is not None else f"{idle_text}; no problems found in what was measured."
    largest = max((f["impact"] or 0.0) for f in problems)
    count = f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")
    cost = f", the largest costs ~{largest:.0%} of step time" if largest > 0 else ""
    return f"{idle_text}; {count}{cost}."


def _run_facts(run: Run) -> dict[str, Any]:
    manifest, env, steps = run.manifest, run.env, run.steps
    target = manifest.get("target", {})
    exit_info = manifest.get("exit") or {}
    return {
        "script": target.get("module") or target.get("script"), "module": bool(target.get("module")),
        "args": target.get("args", []), "cwd": manifest.get("cwd"),
        "created": manifest.get("created"), "duration_s": manifest.get("duration_s"),
        "python": env.python, "torch": env.torch, "cuda": env.cuda_build, "driver": env.driver,
        "gpus": [g.get("name") for g in env.gpus], "cores": env.cores,
        "steps_total": len(run.all_steps), "steps_analysed": len(steps),
        "median_step_s": _median([s.wall_s for s in steps]),
        "ending": exit_info.get("ending"), "exit_status": exit_info.get("status"),
        "window": manifest.get("window"), "trace_only": run.trace_only,
        "trace": "trace.json.gz" if run.trace is not None and not run.trace_only else None,
    }


def build_report(run: Run, result: EngineResult) -> dict[str, Any]:
    steps = run.steps
    idle = _gpu_idle_share(steps)
    return {
        "schema_version": SCHEMA_VERSION,
        "gpudoctor_version": __version__,
        "run": _run_facts(run),
        "summary": {
            "verdict": _verdict(idle, result.findings, steps), "gpu_idle_share": idle,
            "healthy": not any(f["severity"] != "info" for f in result.findings),
        },
        "not_measured": _not_measured(run),
        "breakdown": _breakdown(steps),
        "steps": [_step_row(s) for s in steps],
        "findings": result.findings,
        "not_evaluated": result.not_evaluated,
        "errors": result.errors,
    }
