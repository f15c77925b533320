"""The report's charts as inline SVG: the model's numbers in, markup out; every text escaped.

No JavaScript: hovering a bar or a slice of the timeline shows its values through SVG <title> elements, which
browsers show as tooltips (and screen readers read). Colours come from the page's CSS through class names, so the
charts and the HTML legends always agree. The geometry is all these functions work out; the numbers, buckets
and bins come ready from report.model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence

from markupsafe import Markup, escape

from gpudoctor.report.document import KernelChart, PanelJson, StepChart, TimelineChart
from gpudoctor.report.units import number, percent, seconds

WIDTH = 900  # the viewBox width; the SVG scales to the page
LABEL_CHAR_W = 6.4  # the width of a character of an axis label, in the viewBox's units (the CSS's tick font)


def _cls(names: str) -> str:
    """Class names from keys: letters, digits, - and _ only, separated by spaces."""
    return " ".join(re.sub(r"[^A-Za-z0-9_-]", "", n) for n in str(names).split())


def _tick(value: float, unit: str) -> str:
    """An axis label: round numbers stay round (50 ms, not 50.0 ms)."""
    if unit == "s":
        if value == 0:
            return "0"
        return f"{value:g} s" if value >= 1 else (f"{value * 1e3:g} ms" if value >= 1e-3 else f"{value * 1e6:g} µs")
    if unit == "ms":  # a wait in ms reads as time: 2 s, not 2,000 ms
        return _tick(value / 1e3, "s")
    return number(value, unit)


def _f(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if math.isfinite(x) else "0"


def _title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def _rect(x: float, y: float, w: float, h: float, cls: str, title: str | None = None) -> str:
    inner = _title(title) if title else ""
    return (f'<rect class="{_cls(cls)}" x="{_f(x)}" y="{_f(y)}" width="{_f(max(w, 0.0))}" height="{_f(h)}">'
            f"{inner}</rect>")


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    return f'<text class="{_cls(cls)}" x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}">{escape(text)}</text>'


def _svg(height: float, label: str, body: Iterable[str], cls: str) -> Markup:
    # Markup is safe here: every text in `body` went through escape() (_text, _title), every class through _cls
    return Markup(  # noqa: S704
        f'<svg class="chart {_cls(cls)}" viewBox="0 0 {WIDTH} {_f(height)}" role="img" aria-label="{escape(label)}" '
        f'preserveAspectRatio="xMinYMin meet">{"".join(body)}</svg>'
    )


def nice_ticks(top: float, most: int = 6) -> list[float]:
    """Round axis values from 0 to at least `top`: steps of 1, 2 or 5 times a power of ten."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    count = math.ceil(top / step - 1e-9)
    return [i * step for i in range(count + 1)]


# -- per-step bars ---------------------------------------------------------------------------------
def step_bars(chart: StepChart | None) -> Markup:
    """One row per step (or group of steps): host time by phase, and under it the GPU busy vs idle."""
    if not chart:
        return Markup("")
    left, right, top = 92.0, 70.0, 26.0
    host_h, gpu_h, gap = 14.0, 6.0, 2.0
    row_h = host_h + (gpu_h + gap if chart["has_gpu"] else 0.0) + 9.0
    ticks = nice_ticks(chart["max_s"])
    scale = (WIDTH - left - right) / ticks[-1]
    height = top + row_h * len(chart["rows"]) + 4
    body = []
    for t in ticks:
        x = left + t * scale
        body.append(f'<line class="grid" x1="{_f(x)}" y1="{_f(top - 4)}" x2="{_f(x)}" y2="{_f(height - 4)}"/>')
        body.append(_text(x, top - 9, _tick(t, "s"), "tick", "middle"))
    for i, row in enumerate(chart["rows"]):
        y = top + i * row_h
        body.append(_text(left - 8, y + host_h - 3, row["label"], "label", "end"))
        x = left
        for seg in row["host"]:
            w = seg["s"] * scale
            if w > 0:
                what = f"{seconds(seg['s'])} ({percent(seg['share'])} of the step)"
                body.append(_rect(x, y, w, host_h, f"p-{seg['key']}", f"{row['label']} · {seg['label']}: {what}"))
            x += w
        body.append(_text(left + row["wall_s"] * scale + 6, y + host_h - 3, seconds(row["wall_s"]), "value"))
        gpu = row["gpu"]
        if gpu is not None:
            gy = y + host_h + gap
            busy_w, idle_w = gpu["busy_s"] * scale, gpu["idle_s"] * scale
            busy = f"{row['label']} · GPU busy: {seconds(gpu['busy_s'])}"
            idle = f"{row['label']} · GPU idle: {seconds(gpu['idle_s'])} ({percent(gpu['idle_share'])} of the step)"
            body.append(_rect(left, gy, busy_w, gpu_h, "g-busy", busy))
            body.append(_rect(left + busy_w, gy, idle_w, gpu_h, "g-idle", idle))
    return _svg(height, "time per step, by phase, and GPU busy versus idle", body, "steps-chart")


# -- the timeline ----------------------------------------------------------------------------------
def _polylines(xs: Sequence[float], values: Sequence[float | None], y_of: Callable[[float], float], cls: str,
               title: str) -> list[str]:
    """One polyline per run of measured values: a gap in the samples stays a gap."""
    runs: list[list[str]] = []
    current: list[str] = []
    for x, v in zip(xs, values):
        if v is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(f"{_f(x)},{_f(y_of(v))}")
    if current:
        runs.append(current)
    return [f'<polyline class="{_cls(cls)}" points="{" ".join(r)}">{_title(title)}</polyline>' if len(r) > 1
            else f'<circle class="{_cls(cls)} dot" cx="{r[0].split(",")[0]}" cy="{r[0].split(",")[1]}" r="1.5"/>'
            for r in runs]


def _panel(panel: PanelJson, xs: list[float], bucket_w: float, y0: float, h: float, left: float) -> list[str]:
    unit = panel["unit"]
    ticks = nice_ticks(panel.get("clip") or panel["max"] or 1.0, 2)
    top = ticks[-1]

    def y_of(v: float) -> float:
        return y0 + h - min(v, top) / top * h

    body = [_text(left, y0 - 6, panel["title"], "panel-title")]
    lx = left + 8 + 7.2 * len(panel["title"])
    for series in (s for s in panel["series"] if not s.get("hover_only")):
        key, ly = _cls(series["key"]), _f(y0 - 10)
        body.append(f'<line class="tl-{key} key" x1="{_f(lx)}" y1="{ly}" x2="{_f(lx + 14)}" y2="{ly}"/>')
        body.append(_text(lx + 18, y0 - 6, series["label"], "legend"))
        lx += 30 + 6.6 * len(series["label"])
    for t in ticks:
        y = y_of(t)
        body.append(f'<line class="grid" x1="{_f(left)}" y1="{_f(y)}" x2="{_f(WIDTH - 12)}" y2="{_f(y)}"/>')
        body.append(_text(left - 6, y + 4, _tick(t, unit), "tick", "end"))
    for series in panel["series"]:
        if series.get("hover_only"):
            continue
        if panel["kind"] == "bars":
            for x, v in zip(xs, series["values"]):
                if v:
                    bar_w = max(bucket_w * 0.8, 1.0)
                    body.append(_rect(x - bucket_w / 2, y_of(v), bar_w, y0 + h - y_of(v), f"tl-{series['key']}"))
                    if v > top:  # cut at the top of the scale: its value written beside it
                        value = seconds(v / 1e3) if unit == "ms" else number(v, unit)
                        body.append(_text(x - bucket_w / 2 + bar_w + 3, y0 + 9, f"↑ {value}", "clipped"))
        else:
            body.extend(_polylines(xs, series["values"], y_of, f"tl-{series['key']} line", series["label"]))
    return body


def _hover(timeline: TimelineChart, i: int) -> str:
    lo, hi = i * timeline["bucket_s"], (i + 1) * timeline["bucket_s"]
    parts = [f"{lo:.1f}–{hi:.1f} s"]
    for panel in timeline["panels"]:
        for series in panel["series"]:
            value = series["values"][i]
            if value is not None:
                parts.append(f"{series['label']}: {number(value, panel['unit'])}")
    steps = timeline["steps_per_bucket"][i]
    if steps:
        parts.append(f"{int(steps)} step{'s' if steps > 1 else ''} started")
    return " · ".join(parts)


def timeline(chart: TimelineChart | None) -> Markup:
    """Stacked panels over the run's time (GPU utilization, CPU, loader wait), the profiled window shaded."""
    if not chart:
        return Markup("")
    left, panel_h, head, axis = 64.0, 78.0, 30.0, 26.0
    plot_w = WIDTH - left - 12
    duration = max(chart["duration_s"], 1e-3)

    def x_of(t: float) -> float:
        return left + t / duration * plot_w

    xs = [x_of(t) for t in chart["t"]]
    bucket_w = chart["bucket_s"] / duration * plot_w
    height = len(chart["panels"]) * (panel_h + head) + axis
    plot_top, plot_bottom = head, height - axis
    body = []
    for other in chart.get("other_windows", []):
        ox = x_of(other["start"])
        body.append(_rect(ox, plot_top - 4, max(x_of(other["end"]) - ox, 3.0), plot_bottom - plot_top + 4,
                          "window other", f"another profiling window: {other['start']:.2f}–{other['end']:.2f} s"))
    window = chart["window"]
    if window:
        wx = x_of(window["start"])
        ww = max(x_of(window["end"]) - wx, 3.0)
        body.append(_rect(wx, plot_top - 4, ww, plot_bottom - plot_top + 4, "window",
                          f"profiled window (the analysed steps): {window['start']:.2f}–{window['end']:.2f} s"))
        body.append(_text(wx + ww / 2, 11, "profiled window", "window-label", "middle"))
    for i, panel in enumerate(chart["panels"]):
        body.extend(_panel(panel, xs, bucket_w, head + i * (panel_h + head), panel_h, left))
    for t in nice_ticks(duration, 8):
        if t <= duration:
            body.append(_text(x_of(t), height - 8, f"{t:g} s", "tick", "middle"))
    body.extend(_rect(x - bucket_w / 2, plot_top - 4, bucket_w, plot_bottom - plot_top + 4, "band", _hover(chart, i))
                for i, x in enumerate(xs))
    return _svg(height, "GPU utilization, CPU use and loader wait over the run", body, "timeline-chart")


# -- kernel durations ------------------------------------------------------------------------------
def kernel_histogram(chart: KernelChart | None) -> Markup:
    """Per duration bin, the share of kernels and the share of GPU kernel time."""
    if not chart:
        return Markup("")
    left, top, bottom, height = 48.0, 30.0, 34.0, 230.0
    plot_h = height - top - bottom
    bins = chart["bins"]
    ticks = nice_ticks(max(max(b["count_share"], b["time_share"]) for b in bins) * 100, 4)

    def y_of(share: float) -> float:
        return top + plot_h - share * 100 / ticks[-1] * plot_h

    group = (WIDTH - left - 12) / len(bins)
    bar = min(group * 0.36, 34.0)
    # Labels wider than their group (many bins, "500 µs–1 ms") alternate between two rows, so that none overlap.
    staggered = max(len(b["label"]) for b in bins) * LABEL_CHAR_W > group - 4
    if staggered:
        height += 14
    body = [
        _rect(WIDTH - 330, 8, 12, 10, "k-count"), _text(WIDTH - 314, 17, "share of kernels", "legend"),
        _rect(WIDTH - 180, 8, 12, 10, "k-time"), _text(WIDTH - 164, 17, "share of GPU kernel time", "legend"),
    ]
    for t in ticks:
        y = y_of(t / 100)
        body.append(f'<line class="grid" x1="{_f(left)}" y1="{_f(y)}" x2="{_f(WIDTH - 12)}" y2="{_f(y)}"/>')
        body.append(_text(left - 6, y + 4, f"{t:g}%", "tick", "end"))
    for i, b in enumerate(bins):
        cx = left + (i + 0.5) * group
        what = (f"{b['label']}: {b['count']:,} kernels ({percent(b['count_share'])}), "
                f"{seconds(b['time_us'] / 1e6)} of GPU time ({percent(b['time_share'])})")
        body.append(_rect(cx - bar, y_of(b["count_share"]), bar, top + plot_h - y_of(b["count_share"]), "k-count",
                          what))
        body.append(_rect(cx, y_of(b["time_share"]), bar, top + plot_h - y_of(b["time_share"]), "k-time", what))
        below = 14 if staggered and i % 2 else 0
        body.append(_text(cx, top + plot_h + 16 + below, b["label"], "tick", "middle"))
    return _svg(height, "kernel duration histogram", body, "kernels-chart")
