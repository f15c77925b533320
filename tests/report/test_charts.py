"""The charts stay readable: a few waits far above the rest do not flatten the loader's chart, the kernel
histogram's labels never overlap, and the per-step bars split the step by phase only where those steps timed it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudoctor.analysis.timeline import Panel, Series
from gpudoctor.report import svg
from gpudoctor.report.charts import _bin_label, _panel
from gpudoctor.report.document import KernelBinRow, KernelChart, TimelineChart
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import to_html
from gpudoctor.testing import available_fixtures
from report.test_one_story import report_of


def _loader_panel(values: list[float | None]) -> Panel:
    return Panel("loader", max(v or 0.0 for v in values), (Series("wait", values), Series("wait_mean", values)))


def test_a_first_batch_far_above_the_rest_does_not_flatten_the_loader_chart() -> None:
    """The first batch, its workers starting, waited 2.8 s; every batch after it about 0.07 ms."""
    values: list[float | None] = [None, 2848.5, None, *[0.07 + 0.01 * (i % 3) for i in range(40)]]
    panel = _panel(_loader_panel(values))
    assert panel["clip"] < 0.2, panel["clip"]
    chart: TimelineChart = {"duration_s": 43.0, "bucket_s": 1.0, "t": [i + 0.5 for i in range(43)], "window": None,
                            "other_windows": [], "steps_per_bucket": [1.0] * 43, "panels": [panel]}
    drawn = str(svg.timeline(chart))
    assert "↑ 2.85 s" in drawn  # the one cut at the top, with its value
    ticks = re.findall(r'class="tick"[^>]*>([^<]+)<', drawn)
    assert "100 µs" in ticks and not any("," in t for t in ticks), ticks  # time, not "2,000 ms"
    steady = _panel(_loader_panel([0.07, 0.08, 0.09, 0.07, 0.08, 0.1]))
    assert "clip" not in steady


def _bin(lo: float, hi: float | None) -> KernelBinRow:
    return {"lo_us": lo, "hi_us": hi, "label": _bin_label(lo, hi), "count": 1, "time_us": lo or 1.0,
            "count_share": 0.1, "time_share": 0.1}


def _label_spans(drawn: str) -> list[tuple[float, float, float]]:
    """Each bin label's extent: (left, right, y), at the width the chart allows a character."""
    spans = []
    for x, y, text in re.findall(r'<text class="tick" x="([\d.]+)" y="([\d.]+)" text-anchor="middle">([^<]+)<', drawn):
        half = len(text) * svg.LABEL_CHAR_W / 2
        spans.append((float(x) - half, float(x) + half, float(y)))
    return spans


def test_the_kernel_histograms_labels_never_overlap() -> None:
    edges = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]
    bins = [_bin(lo, hi) for lo, hi in zip(edges, [*edges[1:], None])]
    chart: KernelChart = {"count": len(bins), "per_step": 1.0, "median_us": 100.0, "total_s": 1.0, "bins": bins,
                          "top": [], "launch_bound": False}
    spans = _label_spans(str(svg.kernel_histogram(chart)))
    assert len(spans) == len(bins)
    for ahead in (1, 2):
        for (left, right, y), (left2, _, y2) in zip(spans, spans[ahead:]):
            assert y != y2 or right <= left2, (left, right, y, left2, y2)
    rows = {y for _, _, y in spans}
    assert len(rows) == 2  # every other label one row lower


# -- the per-step bars and the phase table tell one story ---------------------------------------------------------
@pytest.mark.parametrize("name", available_fixtures())
def test_the_step_bars_split_by_phase_only_where_their_steps_timed_the_phases(name: str) -> None:
    """The analysed steps run without the per-call hooks: where the phases are timed in the detail steps after
    them, their bars show the wait for data and the rest, never a whole step of 'other host time' beside a table
    that splits the same step into forward, backward and the optimizer."""
    report = report_of(name)
    chart = report["charts"]["steps"]
    assert chart is not None
    keys = {item["key"] for item in chart["legend"]}
    labels = {item["label"] for item in chart["legend"]}
    drawn = {segment["key"] for row in chart["rows"] for segment in row["host"] if segment["s"] > 0}
    assert keys == drawn, (keys, drawn)  # a key for what is drawn, and only for it
    split = [p["phase"] for p in report["breakdown"]["phases"] if p["phase"] not in ("data_wait", "other")]
    if chart["by_phase"]:
        assert keys - {"data_wait", "other"}, keys
        assert "other host time" in labels or "other" not in keys
    else:
        assert keys <= {"data_wait", "other"} and "other host time" not in labels, labels
        assert "other" not in keys or labels & {"the rest of the step", "the step"}
        html = to_html(link_outputs(report, Path(report["links"]["run"])))
        assert "timed without gpudoctor's per-call hooks" in html
        if split:
            assert "the table below splits the step by phase" in html
