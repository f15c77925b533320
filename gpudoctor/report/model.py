"""Build the Report: everything the renderers show, computed here so that they only format.

The Report is a JSON-serializable dict. `findings.json` is a fixed subset of it (see render.FINDINGS_KEYS and
gpudoctor/schemas/findings.schema.json); the rest feeds report.html:

- `summary`, `run`, `not_measured`: the verdict and the facts at the top;
- `breakdown` and `charts.steps`: where each step's time went (mean per phase, and per step);
- `charts.timeline`: GPU utilization, CPU of the script's process tree and of the host, loader wait per step, over
  the whole run, bucketed to at most MAX_POINTS points so that a long run stays a small page;
- `charts.kernels`: the kernel-duration histogram, whenever the trace has GPU kernels (not only when a launch-bound
  rule fires: the shape is worth a look on any run, and `launch_bound` says when a small-batch finding points at it);
- `cards`: one per finding, with the user's source lines around its location (read now, if the file is still
  there) and the rule's full documentation.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import shlex
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpudoctor import __version__
from gpudoctor.analysis import Run
from gpudoctor.analysis.views import SeriesPoint, Step
from gpudoctor.bundle import SCHEMA_VERSION
from gpudoctor.engine import EngineResult

PHASES = ("data_wait", "copy", "forward", "backward", "optimizer", "sync", "other")
PHASE_LABELS = {
    "data_wait": "data wait", "copy": "host↔device copy", "forward": "forward", "backward": "backward",
    "optimizer": "optimizer", "sync": "sync", "other": "other host time",
}
COLLECTOR_LABELS = {
    "host": "host and process samples", "nvml": "GPU samples (NVML)", "profiler": "profiler trace",
    "nvtx": "NVTX ranges for Nsight Systems", "cuda_trace": "GPU activity in the profiler trace",
}
MAX_POINTS = 300  # timeline buckets: a few hundred points keep a long run's page small
MAX_STEP_ROWS = 40  # per-step bars; more steps are shown as groups of consecutive steps, averaged
KERNEL_BIN_EDGES_US = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000)
SOURCE_CONTEXT = 3  # lines shown either side of a finding's line
MAX_SOURCE_BYTES = 5_000_000
MAX_SOURCE_LINE = 200
TOP_KERNELS = 8
MAX_KERNEL_NAME = 160


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


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _breakdown(steps: list[Step]) -> dict[str, Any]:
    """Mean seconds per step in each phase, with each phase's share of the mean step."""
    if not steps:
        return {"phases": [], "mean_step_s": None}
    mean_step = statistics.fmean(s.wall_s for s in steps)
    phases = []
    for phase in PHASES:
        mean = _mean([_phase_values(s)[phase] for s in steps])
        if mean is not None:
            phases.append({"phase": phase, "label": PHASE_LABELS[phase], "mean_s": mean,
                           "share": mean / mean_step if mean_step else 0.0})
    return {"phases": phases, "mean_step_s": mean_step}


def _not_measured(run: Run) -> list[dict[str, str]]:
    rows = []
    for name, info in run.manifest.get("collectors", {}).items():
        if not info.get("ok", True):
            rows.append({"what": COLLECTOR_LABELS.get(name, name), "reason": info.get("reason", "unknown")})
    if run.trace_only:
        rows.append({"what": "host, process and GPU samples", "reason": "only a trace was analysed, not a run bundle"})
    return rows


def _problems(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["severity"] != "info"]


def _status(findings: list[dict[str, Any]], steps: list[Step], not_measured: list[dict[str, str]]) -> str:
    """no_steps | problems | partial (nothing found, but something was not measured) | healthy."""
    if not steps:
        return "no_steps"
    if _problems(findings):
        return "problems"
    return "partial" if not_measured else "healthy"


def _verdict(idle: float | None, findings: list[dict[str, Any]], steps: list[Step], status: str) -> str:
    if not steps:
        return "No training step was detected, so there is no step time to break down."
    problems = _problems(findings)
    idle_text = f"GPU idle {idle:.0%} of each step" if idle is not None else "GPU activity not measured"
    if not problems:
        return f"{idle_text}; no problems found." if status == "healthy" else f"{idle_text}; no problems found in what was measured."
    largest = max((f["impact"] or 0.0) for f in problems)
    count = f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")
    cost = f", the largest costs ~{largest:.0%} of step time" if largest > 0 else ""
    return f"{idle_text}; {count}{cost}."


def _command(target: dict[str, Any]) -> str | None:
    args = [str(a) for a in target.get("args") or []]
    if target.get("module"):
        return shlex.join(["-m", str(target["module"]), *args])
    if target.get("script"):
        return shlex.join([str(target["script"]), *args])
    return None


def _trace_file(run: Run) -> Path | None:
    if run.path is None or run.trace is None:
        return None
    return run.trace_file


def _exception(run: Run) -> dict[str, Any] | None:
    """What the script raised, when it ended with an exception."""
    ending = run.exit
    if not ending.exception:
        return None
    return {"type": ending.exception, "message": ending.message or "",
            "location": ending.location.to_dict() if ending.location else None}


def _run_facts(run: Run) -> dict[str, Any]:
    manifest, env, steps = run.manifest, run.env, run.steps
    target = manifest.get("target", {})
    exit_info = manifest.get("exit") or {}
    return {
        "script": target.get("module") or target.get("script"), "module": bool(target.get("module")),
        "args": target.get("args", []), "command": _command(target), "cwd": manifest.get("cwd"),
        "created": manifest.get("created"), "duration_s": manifest.get("duration_s"),
        "python": env.python, "torch": env.torch, "cuda": env.cuda_build, "driver": env.driver,
        "gpus": [g.get("name") for g in env.gpus], "cores": env.cores,
        "steps_total": run.steps_in_run, "steps_analysed": len(steps),
        "median_step_s": _median([s.wall_s for s in steps]),
        "ending": exit_info.get("ending"), "exit_status": exit_info.get("status"), "exception": _exception(run),
        "window": manifest.get("window"), "trace_only": run.trace_only,
        "trace": run.trace_file.name if run.trace is not None and run.trace_file and not run.trace_only else None,
    }


# -- per-step bars ---------------------------------------------------------------------------------
def _step_groups(steps: list[Step]) -> list[list[Step]]:
    size = max(1, math.ceil(len(steps) / MAX_STEP_ROWS))
    return [steps[i:i + size] for i in range(0, len(steps), size)]


def _step_bar(group: list[Step]) -> dict[str, Any]:
    first, last = group[0].index, group[-1].index
    wall = statistics.fmean(s.wall_s for s in group)
    host = []
    for phase in PHASES:
        mean = _mean([_phase_values(s)[phase] for s in group])
        if mean is not None:
            host.append({"key": phase, "label": PHASE_LABELS[phase], "s": mean, "share": mean / wall if wall else 0.0})
    busy, idle = _mean([s.gpu_busy_s for s in group]), _mean([s.gpu_idle_s for s in group])
    gpu = None if busy is None or idle is None else {
        "busy_s": busy, "idle_s": idle, "idle_share": idle / wall if wall else 0.0,
    }
    return {
        "label": f"step {first}" if first == last else f"steps {first}–{last}", "first": first, "last": last,
        "wall_s": wall, "host": host, "gpu": gpu,
    }


def _step_chart(steps: list[Step]) -> dict[str, Any] | None:
    """Per analysed step: host time by phase (adds up to the step's wall time), and GPU busy vs idle."""
    if not steps:
        return None
    groups = _step_groups(steps)
    rows = [_step_bar(g) for g in groups]
    present = {seg["key"] for row in rows for seg in row["host"]}
    return {
        "rows": rows, "steps_per_row": len(groups[0]), "max_s": max(r["wall_s"] for r in rows),
        "legend": [{"key": p, "label": PHASE_LABELS[p]} for p in PHASES if p in present],
        "has_gpu": any(r["gpu"] is not None for r in rows),
    }


# -- the timeline ----------------------------------------------------------------------------------
class _Buckets:
    """Equal slices of the run's time span; a series falls into them as its mean (or max) per slice."""

    def __init__(self, start: float, end: float, count: int) -> None:
        self.start = start
        self.count = max(1, count)
        self.width = max(end - start, 1e-3) / self.count

    def index(self, t: float) -> int:
        return min(self.count - 1, max(0, int((t - self.start) / self.width)))

    def fold(self, points: list[tuple[float, float | None]], how: Callable[[list[float]], float]) -> list[float | None]:
        slots: list[list[float]] = [[] for _ in range(self.count)]
        for t, value in points:
            if value is not None:
                slots[self.index(t)].append(value)
        return [round(how(s), 4) if s else None for s in slots]


def _series(points: list[SeriesPoint], key: str) -> list[tuple[float, float | None]]:
    return [(p.t, None if p.values.get(key) is None else float(p.values[key])) for p in points]


def _gpu_panel(run: Run, buckets: _Buckets) -> dict[str, Any] | None:
    gpus = {d: _series(points, "util") for d, points in sorted(run.samples.gpu.items())}
    gpus = {d: pts for d, pts in gpus.items() if any(v is not None for _, v in pts)}
    if not gpus:
        return None
    # GPUs the run left at 0% all along are noise on a shared host: show those it used (at most 8).
    shown = ([d for d, pts in gpus.items() if any(v for _, v in pts)] or list(gpus)[:1])[:8]
    return {
        "key": "gpu", "title": "GPU utilization (NVML)", "unit": "%", "kind": "line", "max": 100.0,
        "series": [{"key": f"gpu{i}", "label": f"GPU {d}", "values": buckets.fold(gpus[d], statistics.fmean)}
                   for i, d in enumerate(shown)],
    }


def _cpu_panel(run: Run, buckets: _Buckets) -> dict[str, Any] | None:
    host = run.samples.host
    if not host:
        return None
    tree = buckets.fold(_series(host, "tree_cores"), statistics.fmean)
    busy = buckets.fold(_series(host, "busy_cores"), statistics.fmean)
    peak = max((v for v in tree + busy if v is not None), default=0.0)
    series = [{"key": "tree", "label": "the script's processes", "values": tree},
              {"key": "host", "label": "whole host", "values": busy}]
    return {
        "key": "cpu", "title": "CPU (cores busy)", "unit": "cores", "kind": "line",
        "max": float(max(run.env.cpu_count or run.env.cores or 1, math.ceil(peak))),
        "series": [s for s in series if any(v is not None for v in s["values"])],
    }


def _loader_panel(steps: list[Step], buckets: _Buckets) -> dict[str, Any] | None:
    if not steps or not any(s.data_wait_s for s in steps):
        return None
    waits = [(s.start, s.data_wait_s * 1e3) for s in steps]
    longest = buckets.fold(waits, max)
    return {
        "key": "loader", "title": "Loader wait per step", "unit": "ms", "kind": "bars",
        "max": max((v for v in longest if v is not None), default=1.0) or 1.0,
        "series": [{"key": "wait", "label": "longest wait", "values": longest},
                   {"key": "wait_mean", "label": "mean wait", "values": buckets.fold(waits, statistics.fmean),
                    "hover_only": True}],
    }


def _timeline(run: Run) -> dict[str, Any] | None:
    samples, steps = run.samples, run.run_steps
    gpu_points = [p for points in samples.gpu.values() for p in points]
    times = [p.t for p in samples.host] + [p.t for p in gpu_points] + [s.start for s in steps] + [s.end for s in steps]
    if not times:
        return None
    start, end = min(times), max(times)
    dense = max(len(samples.host), max((len(p) for p in samples.gpu.values()), default=0), len(steps))
    buckets = _Buckets(start, end, min(MAX_POINTS, dense // 2))  # ~2 samples a bucket: no empty ones by jitter
    panels = [p for p in (_gpu_panel(run, buckets), _cpu_panel(run, buckets), _loader_panel(steps, buckets)) if p]
    if not panels:
        return None
    span = run.span
    return {
        "duration_s": end - start, "bucket_s": buckets.width,
        "t": [round((i + 0.5) * buckets.width, 4) for i in range(buckets.count)],
        "window": None if span is None else {"start": span[0] - start, "end": span[1] - start},
        "other_windows": [{"start": a - start, "end": b - start} for i, (a, b) in sorted(run.window_spans.items())
                          if i != run.window],
        "steps_per_bucket": buckets.fold([(s.start, 1.0) for s in steps], sum),
        "panels": panels,
    }


# -- kernel durations ------------------------------------------------------------------------------
def _bin_label(lo: float, hi: float | None) -> str:
    def fmt(us: float) -> tuple[str, str]:
        return (f"{us / 1000:g}", "ms") if us >= 1000 else (f"{us:g}", "µs")
    if hi is None:
        return "≥ {} {}".format(*fmt(lo))
    if lo == 0:
        return "< {} {}".format(*fmt(hi))
    (a, unit_a), (b, unit_b) = fmt(lo), fmt(hi)
    return f"{a}–{b} {unit_b}" if unit_a == unit_b else f"{a} {unit_a}–{b} {unit_b}"


def _kernel_histogram(run: Run, findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Kernel durations in the analysed steps, in log-spaced bins: how many kernels, and how much GPU time."""
    if run.gpu is None or not run.steps:
        return None
    kernels = [k for s in run.steps for k in run.gpu.kernels_in(s.start, s.end)]
    durations = sorted(k.dur * 1e6 for k in kernels)
    if not durations:
        return None
    edges = (0.0, *KERNEL_BIN_EDGES_US)
    bins = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        inside = [d for d in durations if d >= lo and (hi is None or d < hi)]
        bins.append({"lo_us": lo, "hi_us": hi, "label": _bin_label(lo, hi), "count": len(inside), "time_us": sum(inside)})
    used = [i for i, b in enumerate(bins) if b["count"]]
    bins = bins[used[0]:used[-1] + 1]
    total = sum(durations)
    for b in bins:
        b["count_share"] = b["count"] / len(durations)
        b["time_share"] = b["time_us"] / total if total else 0.0
    return {
        "count": len(durations), "per_step": len(durations) / len(run.steps), "median_us": statistics.median(durations),
        "total_s": total / 1e6, "bins": bins, "top": _top_kernels(kernels, total / 1e6),
        "launch_bound": any(f["category"] == "small_batch" for f in _problems(findings)),
    }


def _top_kernels(kernels: list[Any], total_s: float, limit: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The kernels that took the most GPU time in the analysed steps, by name."""
    by_name: dict[str, list[float]] = defaultdict(list)
    for k in kernels:
        by_name[k.name].append(k.dur)
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:limit]
    return [{"name": name[:MAX_KERNEL_NAME], "count": len(durs), "total_s": sum(durs),
             "mean_us": statistics.fmean(durs) * 1e6, "share": sum(durs) / total_s if total_s else 0.0}
            for name, durs in ranked]


# -- finding cards ---------------------------------------------------------------------------------
def _source_path(file: str, run_cwd: str | None) -> Path | None:
    """The file as recorded; a relative one from the run's working directory; a run made in another checkout of
    the same project from here."""
    path = Path(file)
    candidates = [path] if path.is_absolute() else [Path(run_cwd or ".") / path, path]
    if path.is_absolute() and run_cwd and path.is_relative_to(run_cwd):
        candidates.append(Path.cwd() / path.relative_to(run_cwd))
    for candidate in candidates:
        try:
            if candidate.is_file() and candidate.stat().st_size <= MAX_SOURCE_BYTES:
                return candidate
        except OSError:
            continue
    return None


def _created(run: Run) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(run.manifest["created"])).timestamp()
    except (KeyError, ValueError):
        return None


def source_snippet(location: Mapping[str, Any] | None, run_cwd: str | None = None,
                   created: float | None = None) -> dict[str, Any] | None:
    """The lines around a finding's location, read now; None when the file is not here (or has no such line)."""
    if not location or not location.get("file") or not location.get("line"):
        return None
    path = _source_path(str(location["file"]), run_cwd)
    if path is None:
        return None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        changed = created is not None and path.stat().st_mtime > created
    except (OSError, ValueError):
        return None
    line = int(location["line"])
    if not 1 <= line <= len(lines):
        return None
    numbers = range(max(1, line - SOURCE_CONTEXT), min(len(lines), line + SOURCE_CONTEXT) + 1)
    return {
        "file": str(path), "line": line, "changed_since_run": changed,
        "lines": [{"number": n, "text": lines[n - 1][:MAX_SOURCE_LINE], "highlight": n == line} for n in numbers],
    }


def doc_paragraphs(doc: str | None) -> list[str]:
    """A rule's docstring as paragraphs, each one line (the renderer marks up `code`)."""
    if not doc:
        return []
    return [" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]


def _card(index: int, finding: dict[str, Any], run: Run, docs: Mapping[str, str], created: float | None) -> dict[str, Any]:
    impact = finding.get("impact")
    return {
        "id": f"finding-{index + 1}", "finding": finding,
        "impact_percent": None if impact is None else round(impact * 100, 1),
        "source": source_snippet(finding.get("location"), run.manifest.get("cwd"), created),
        "doc": doc_paragraphs(docs.get(finding["code"]) or finding.get("doc")),
    }


def build_report(run: Run, result: EngineResult, docs: Mapping[str, str] | None = None,
                 windows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Report of `run` and its rules' `result`; `docs` maps a rule code to its full documentation.

    `windows` has one row per profiling window of a run profiled with --every (see across_windows);
    `run` is then the window the charts show.
    """
    steps = run.steps
    idle = run.gpu_idle_share
    created = _created(run)
    problems = _problems(result.findings)
    not_measured = _not_measured(run)
    status = _status(result.findings, steps, not_measured)
    return {
        "schema_version": SCHEMA_VERSION,
        "gpudoctor_version": __version__,
        "run": _run_facts(run),
        "summary": {
            "verdict": _verdict(idle, result.findings, steps, status), "gpu_idle_share": idle,
            "healthy": not problems, "problems": len(problems), "status": status,
        },
        "not_measured": not_measured,
        "breakdown": _breakdown(steps),
        "steps": [_step_row(s) for s in steps],
        "charts": {
            "steps": _step_chart(steps), "timeline": _timeline(run), "kernels": _kernel_histogram(run, result.findings),
        },
        "cards": [_card(i, f, run, docs or {}, created) for i, f in enumerate(result.findings)],
        "links": {"trace": str(_trace_file(run)) if _trace_file(run) else None,
                  "run": str(run.path.resolve()) if run.path is not None else None},
        "windows": _windows(run, windows or []),
        "findings": result.findings,
        "not_evaluated": result.not_evaluated,
        "errors": result.errors,
    }


def _windows(shown: Run, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The windows' rows with their start as seconds into the run, and which one the charts show."""
    started = _created(shown)
    return [{**row, "start_s": None if started is None else max(0.0, row["start"] - started),
             "charted": row["index"] == shown.window} for row in rows]


def link_outputs(report: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The report as written into `out_dir`: its link to the raw trace made relative to there."""
    trace = report.get("links", {}).get("trace")
    if not trace:
        return report
    try:
        href = Path(os.path.relpath(trace, out_dir.resolve())).as_posix()
    except ValueError:  # another drive, on Windows
        href = Path(trace).as_posix()
    if not href.startswith(("/", "../")):
        href = "./" + href  # a run directory named "javascript:..." stays a path
    return {**report, "links": {**report["links"], "trace_href": quote(href)}}
