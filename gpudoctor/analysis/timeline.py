"""The whole run over time: GPU utilization, CPU use and loader wait, folded into at most MAX_POINTS buckets.

A long run has hours of samples and hundreds of thousands of steps; the timeline folds each series into equal
slices of the run's time span (its mean, or its largest value, per slice), so that what is drawn stays small.
Times are seconds from the first sample or step; a bucket with nothing in it is None (not measured, not zero).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpudoctor.analysis.run import Run
from gpudoctor.analysis.views import Samples, SeriesPoint, Step

MAX_POINTS = 300  # timeline buckets: a few hundred points keep a long run's page small
MAX_GPUS = 8  # GPU utilization series shown
GPU_UTIL_MAX = 100.0  # NVML utilization is a percentage

Point = tuple[float, float | None]  # (seconds since the epoch, the value or None when not measured)
Fold = Callable[[list[float]], float]


@dataclass(frozen=True, slots=True)
class Buckets:
    """`count` equal slices of the time span from `start`, each `width` seconds long."""

    start: float
    count: int
    width: float

    @classmethod
    def spanning(cls, start: float, end: float, count: int) -> Buckets:
        """At least one bucket, and at least a millisecond of span, so that a single instant still folds."""
        count = max(1, count)
        return cls(start, count, max(end - start, 1e-3) / count)

    def index(self, t: float) -> int:
        """The bucket a time falls in; times outside the span fall in the first or the last."""
        return min(self.count - 1, max(0, int((t - self.start) / self.width)))

    def fold(self, points: Sequence[Point], how: Fold) -> tuple[float | None, ...]:
        """Each bucket's known values folded by `how` (rounded to 4 digits); None for a bucket without any."""
        slots: list[list[float]] = [[] for _ in range(self.count)]
        for t, value in points:
            if value is not None:
                slots[self.index(t)].append(value)
        return tuple(round(how(s), 4) if s else None for s in slots)

    def centers(self) -> tuple[float, ...]:
        """Each bucket's middle, in seconds from `start`."""
        return tuple(round((i + 0.5) * self.width, 4) for i in range(self.count))


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a panel, a value per bucket.

    Keys: `gpu0`, `gpu1`, ... (NVML utilization of GPU `device`, %), `tree` (cores busy in the script's
    process tree), `host` (cores busy on the whole host), `wait` (the longest loader wait of a bucket's steps,
    ms) and `wait_mean` (their mean loader wait, ms).
    """

    key: str
    values: tuple[float | None, ...]
    device: int | None = None  # the GPU, for a utilization series


@dataclass(frozen=True, slots=True)
class Panel:
    """One chart of the timeline: `gpu` (utilization), `cpu` (cores busy) or `loader` (wait per step), its
    series sharing one scale from 0 to `max` (100 %, the host's cores or more, the longest wait)."""

    key: str
    max: float
    series: tuple[Series, ...]


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of the timeline, in seconds from its start."""

    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """The run's samples and steps over its whole time span, in `len(t)` buckets of `bucket_s` seconds.

    `t` holds each bucket's middle; `window` is the charted profiling window's analysed steps and
    `other_windows` the other windows' (with --every); `steps_per_bucket` counts the steps starting in each
    bucket (None for none); `panels` are those with data, in the order gpu, cpu, loader.
    """

    duration_s: float
    bucket_s: float
    t: tuple[float, ...]
    window: Span | None
    other_windows: tuple[Span, ...]
    steps_per_bucket: tuple[float | None, ...]
    panels: tuple[Panel, ...]


def timeline(run: Run) -> Timeline | None:
    """The run's timeline, or None when it has no sample and no step, or no panel has data."""
    steps = run.step_view.run_steps
    times = _times(run, steps)
    if not times:
        return None
    start, end = min(times), max(times)
    buckets = Buckets.spanning(start, end, _bucket_count(run.host.samples, steps))
    panels = _panels(run, steps, buckets)
    if not panels:
        return None
    return Timeline(
        duration_s=end - start, bucket_s=buckets.width, t=buckets.centers(), window=_window(run, start),
        other_windows=_other_windows(run, start), steps_per_bucket=buckets.fold([(s.start, 1.0) for s in steps], sum),
        panels=panels,
    )


def _times(run: Run, steps: Sequence[Step]) -> list[float]:
    """Every sample's time and every step's start and end."""
    gpu_points = [p for points in run.host.samples.gpu.values() for p in points]
    samples = [p.t for p in run.host.samples.host] + [p.t for p in gpu_points]
    return samples + [s.start for s in steps] + [s.end for s in steps]


def _bucket_count(samples: Samples, steps: Sequence[Step]) -> int:
    """About two points of the densest series a bucket, so that sampling jitter leaves no bucket empty."""
    dense = max(len(samples.host), max((len(p) for p in samples.gpu.values()), default=0), len(steps))
    return min(MAX_POINTS, dense // 2)


def _panels(run: Run, steps: Sequence[Step], buckets: Buckets) -> tuple[Panel, ...]:
    cores = run.host.env.cpu_count or run.host.env.cores
    panels = (gpu_panel(run.host.samples.gpu, buckets), cpu_panel(run.host.samples.host, cores, buckets),
              loader_panel(steps, buckets))
    return tuple(p for p in panels if p)


def _window(run: Run, start: float) -> Span | None:
    span = run.step_view.span
    return None if span is None else Span(span[0] - start, span[1] - start)


def _other_windows(run: Run, start: float) -> tuple[Span, ...]:
    spans = sorted(run.step_view.window_spans.items())
    return tuple(Span(a - start, b - start) for i, (a, b) in spans if i != run.window)


def _series(points: Sequence[SeriesPoint], key: str) -> list[Point]:
    return [(p.t, _value(p, key)) for p in points]


def _value(point: SeriesPoint, key: str) -> float | None:
    value = point.values.get(key)
    return None if value is None else float(value)


def gpu_panel(gpu: Mapping[int, Sequence[SeriesPoint]], buckets: Buckets) -> Panel | None:
    """NVML utilization of the GPUs the run used, mean per bucket; None without any utilization sample."""
    utils = {d: _series(points, "util") for d, points in sorted(gpu.items())}
    utils = {d: pts for d, pts in utils.items() if any(v is not None for _, v in pts)}
    if not utils:
        return None
    # GPUs the run left at 0% all along are noise on a shared host: show those it used (at most MAX_GPUS).
    shown = ([d for d, pts in utils.items() if any(v for _, v in pts)] or list(utils)[:1])[:MAX_GPUS]
    series = (Series(f"gpu{i}", buckets.fold(utils[d], statistics.fmean), device=d) for i, d in enumerate(shown))
    return Panel("gpu", GPU_UTIL_MAX, tuple(series))


def cpu_panel(host: Sequence[SeriesPoint], cores: int | None, buckets: Buckets) -> Panel | None:
    """Cores busy in the script's process tree and on the whole host, mean per bucket; None without host
    samples. Its scale is the host's `cores` (1 when unknown), or the peak when more were busy."""
    if not host:
        return None
    tree = buckets.fold(_series(host, "tree_cores"), statistics.fmean)
    busy = buckets.fold(_series(host, "busy_cores"), statistics.fmean)
    peak = max((v for v in tree + busy if v is not None), default=0.0)
    series = (Series("tree", tree), Series("host", busy))
    return Panel("cpu", float(max(cores or 1, math.ceil(peak))),
                 tuple(s for s in series if any(v is not None for v in s.values)))


def loader_panel(steps: Sequence[Step], buckets: Buckets) -> Panel | None:
    """The longest and the mean loader wait (ms) of the steps starting in each bucket; None when no step waited."""
    if not steps or not any(s.data_wait_s for s in steps):
        return None
    waits = [(s.start, s.data_wait_s * 1e3) for s in steps]
    longest = buckets.fold(waits, max)
    top = max((v for v in longest if v is not None), default=1.0) or 1.0
    return Panel("loader", top, (Series("wait", longest), Series("wait_mean", buckets.fold(waits, statistics.fmean))))
