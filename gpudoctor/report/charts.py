"""The report's charts as JSON: per-step bars, the run's timeline, the kernel-duration histogram.

The figures come ready from analysis (`analysis.summary.step_bars`, `analysis.timeline`, `analysis.kernels`); this
module gives them their labels, titles and legends, in the shapes of report.document that report/svg.py draws.
"""

from __future__ import annotations

from typing import Literal

from gpudoctor.analysis import Run
from gpudoctor.analysis.kernels import KernelBin, KernelTotal, kernel_histogram
from gpudoctor.analysis.summary import StepBar, step_bars
from gpudoctor.analysis.timeline import Panel, Series, Span, timeline
from gpudoctor.analysis.views import Step
from gpudoctor.report.document import (
    GpuBar,
    HostSegment,
    KernelBinRow,
    KernelChart,
    PanelJson,
    RankTimeJson,
    SeriesRow,
    SpanJson,
    StepBarRow,
    StepChart,
    TimelineChart,
    TopKernel,
)

__all__ = ["PHASE_LABELS", "kernel_chart", "ranks_chart", "step_chart", "timeline_chart"]

PHASE_LABELS = {
    # the host's time in each phase: a blocking copy or a sync also waits there for the GPU's earlier work, which
    # the budget gives to the GPU's side (computing); the two say different things and are named so
    "data_wait": "data wait", "copy": "in host↔device copy calls", "forward": "forward", "backward": "backward",
    "optimizer": "optimizer", "sync": "in synchronizing calls", "other": "other host time",
}
# The timeline's panels and series: title, unit and how each panel is drawn; each series' legend.
PANEL_TEXT: dict[str, tuple[str, str, Literal["line", "bars"]]] = {
    "gpu": ("GPU utilization (NVML)", "%", "line"), "cpu": ("CPU (cores busy)", "cores", "line"),
    "loader": ("Loader wait per step", "ms", "bars"),
}
SERIES_LABELS = {
    "tree": "the script's processes", "host": "whole host", "wait": "longest wait", "wait_mean": "mean wait",
}
HOVER_ONLY_SERIES = frozenset({"wait_mean"})  # shown in a bucket's tooltip, not drawn
MAX_KERNEL_NAME = 160


# -- per-step bars ---------------------------------------------------------------------------------
# The host's time of a bar that no phase splits: what is not the wait for data is the rest of the step.
UNSPLIT_PHASES = frozenset({"data_wait", "other"})


def _step_bar(bar: StepBar, labels: dict[str, str]) -> StepBarRow:
    host: list[HostSegment] = [{"key": p.phase, "label": labels[p.phase], "s": p.mean_s, "share": p.share}
                               for p in bar.phases]
    gpu: GpuBar | None = None
    if bar.gpu is not None:
        gpu = {"busy_s": bar.gpu.busy_s, "idle_s": bar.gpu.idle_s, "idle_share": bar.gpu.idle_share}
    label = f"step {bar.first}" if bar.first == bar.last else f"steps {bar.first}–{bar.last}"
    return {"label": label, "first": bar.first, "last": bar.last, "wall_s": bar.wall_s, "host": host, "gpu": gpu}


def step_chart(steps: list[Step]) -> StepChart | None:
    """Per analysed step (see analysis.summary.step_bars): host time by phase where the steps timed their phases
    (else the wait for data and the rest of the step), and GPU busy vs idle."""
    bars = step_bars(steps)
    if bars is None:
        return None
    by_phase = not set(bars.phases) <= UNSPLIT_PHASES
    rest = "the rest of the step" if "data_wait" in bars.phases else "the step"
    labels = PHASE_LABELS if by_phase else {**PHASE_LABELS, "other": rest}
    return {
        "rows": [_step_bar(b, labels) for b in bars.bars], "steps_per_row": bars.steps_per_row, "max_s": bars.max_s,
        "legend": [{"key": p, "label": labels[p]} for p in bars.phases], "has_gpu": bars.has_gpu,
        "by_phase": by_phase,
    }


# -- a job's ranks, side by side ------------------------------------------------------------------
RANK_SEGMENTS = (("compute", "computing (GPU)"), ("communicate", "communicating"),
                 ("rank_wait", "waiting for other ranks"), ("data_wait", "waiting for data"),
                 ("other", "other host work"))


def _rank_segments(time: RankTimeJson) -> dict[str, float]:
    return {"compute": time["computing_s"], "communicate": time["communicating_s"],
            "rank_wait": time["waiting_for_ranks_s"], "data_wait": time["data_wait_s"], "other": time["other_host_s"]}


def ranks_chart(times: list[tuple[int, RankTimeJson]]) -> StepChart | None:
    """One bar per rank: its step at its pace, split as its own report's budget (gpudoctor.job.figures.RankTime),
    every bar on one time scale, so that the rank that computes or waits for data stands beside the ones that wait
    for it. Without GPU activity on any rank, the host's work holds the computing."""
    if not times:
        return None
    on_gpu = any(time["computing_s"] > 0 for _, time in times)
    labels = dict(RANK_SEGMENTS)
    if not on_gpu:
        labels["other"] = "host work (computing included)"
    rows: list[StepBarRow] = []
    for rank, time in times:
        step, seconds = time["step_s"], _rank_segments(time)
        host: list[HostSegment] = [{"key": key, "label": labels[key], "s": seconds[key], "share": seconds[key] / step}
                                   for key, _ in RANK_SEGMENTS if seconds[key] > 0 and step > 0]
        rows.append({"label": f"rank {rank}", "first": rank, "last": rank, "wall_s": step, "host": host, "gpu": None})
    shown = [key for key, _ in RANK_SEGMENTS if any(seg["key"] == key for row in rows for seg in row["host"])]
    return {"rows": rows, "steps_per_row": 1, "max_s": max(row["wall_s"] for row in rows),
            "legend": [{"key": key, "label": labels[key]} for key in shown], "has_gpu": False, "by_phase": False}


# -- the timeline ----------------------------------------------------------------------------------
def _span(span: Span) -> SpanJson:
    return {"start": span.start, "end": span.end}


def _series_row(series: Series) -> SeriesRow:
    label = f"GPU {series.device}" if series.device is not None else SERIES_LABELS[series.key]
    row: SeriesRow = {"key": series.key, "label": label, "values": list(series.values)}
    if series.key in HOVER_ONLY_SERIES:
        row["hover_only"] = True
    return row


def _panel(panel: Panel) -> PanelJson:
    title, unit, kind = PANEL_TEXT[panel.key]
    row: PanelJson = {"key": panel.key, "title": title, "unit": unit, "kind": kind, "max": panel.max,
                      "series": [_series_row(s) for s in panel.series]}
    clip = _clip(panel) if kind == "bars" else None
    if clip is not None:
        row["clip"] = clip
    return row


# A bar chart's scale is cut where its largest values lie this far above the rest (the 90th percentile of the
# buckets with a value): a loader's first batch, its workers starting, waited 2.8 s beside 0.07 ms a step after.
CLIP_FACTOR = 4.0
CLIP_QUANTILE = 0.9


def _clip(panel: Panel) -> float | None:
    """The top of the scale that keeps the usual values readable, where a few are CLIP_FACTOR times above them."""
    values = sorted(v for s in panel.series if s.key not in HOVER_ONLY_SERIES for v in s.values if v)
    if len(values) < 5:
        return None
    usual = values[int(CLIP_QUANTILE * (len(values) - 1))]
    return usual * 1.5 if usual > 0 and values[-1] > CLIP_FACTOR * usual else None


def timeline_chart(run: Run) -> TimelineChart | None:
    """The run's timeline (see analysis.timeline), GPU, CPU and loader panels with their titles and legends."""
    result = timeline(run)
    if result is None:
        return None
    return {
        "duration_s": result.duration_s, "bucket_s": result.bucket_s, "t": list(result.t),
        "window": None if result.window is None else _span(result.window),
        "other_windows": [_span(w) for w in result.other_windows],
        "steps_per_bucket": list(result.steps_per_bucket), "panels": [_panel(p) for p in result.panels],
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


def _kernel_bin(b: KernelBin) -> KernelBinRow:
    return {"lo_us": b.lo_us, "hi_us": b.hi_us, "label": _bin_label(b.lo_us, b.hi_us), "count": b.count,
            "time_us": b.time_us, "count_share": b.count_share, "time_share": b.time_share}


def _top_kernel(k: KernelTotal) -> TopKernel:
    return {"name": k.name[:MAX_KERNEL_NAME], "count": k.count, "total_s": k.total_s, "mean_us": k.mean_us,
            "share": k.share}


def kernel_chart(run: Run, launch_bound: bool) -> KernelChart | None:
    """The analysed steps' kernel durations (see analysis.kernels); `launch_bound` when a small-batch finding
    points at them."""
    histogram = kernel_histogram(run.gpu, run.steps)
    if histogram is None:
        return None
    return {
        "count": histogram.count, "per_step": histogram.per_step, "median_us": histogram.median_us,
        "total_s": histogram.total_s, "bins": [_kernel_bin(b) for b in histogram.bins],
        "top": [_top_kernel(k) for k in histogram.top],
        "launch_bound": launch_bound,
    }
