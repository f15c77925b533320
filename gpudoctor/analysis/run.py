"""`Run`: a bundle parsed once into typed, cached views: the API that rules are written against."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import Any

from gpudoctor import bundle as bundle_io
from gpudoctor.analysis.events import ANALYSED_WINDOW_STATES, RunEvents
from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.trace import SYNC_CALLS, TraceData, parse_trace
from gpudoctor.analysis.views import (
    CopySite, Env, Exit, ForkInfo, GilStats, LoaderInfo, LoaderView, Location, ProcessInfo, Samples, SeriesPoint,
    Step, SyncSite, ThreadInfo, WindowInfo,
)
from gpudoctor.collect.downsample import highest, lowest


class NotEvaluated(Exception):
    """Raised by a view (or a rule) when the data a rule needs was not collected in this run."""


class Run:
    """One profiled run. Build it with `Run.from_bundle(path)` or `Run.from_trace(path)`.

    `steps` are the steps analysed: those of the profiler's active window when it recorded, otherwise
    every step after the window's `wait` (start-up is not representative), otherwise all of them.

    A run profiled with `--every` has several windows (`windows`); a `Run` shows one of them
    (`window`, the first by default) with the steps from its opening to the next one's, and
    `for_window(N)` gives the others.
    """

    def __init__(self, manifest: dict[str, Any], events: Iterable[dict[str, Any]], trace_path: Path | None,
                 host_samples: list[dict[str, Any]], proc_samples: list[dict[str, Any]],
                 gpu_samples: list[dict[str, Any]], path: Path | None = None, window: int = 0) -> None:
        self.manifest = manifest
        self.path = path
        self.window = window
        self._whole = RunEvents(events)
        self._trace_path = trace_path
        self._host_samples = host_samples
        self._proc_samples = proc_samples
        self._gpu_samples = gpu_samples
        # Told of each chunk of the trace read, (done, total) in bytes: `gpudoctor analyze` sets it to draw its
        # progress line on a terminal (see TraceProgress).
        self.trace_progress: Callable[[int, int], None] | None = None

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_bundle(cls, path: Path | str) -> Run:
        b = bundle_io.load(Path(path))
        return cls(b.manifest, b.events(), b.trace_path, list(b.samples("host")), list(b.samples("procs")),
                   list(b.samples("gpu")), path=b.path)

    @property
    def trace_file(self) -> Path | None:
        """The profiler trace this run's views come from."""
        return self._trace_path

    @classmethod
    def from_trace(cls, path: Path | str) -> Run:
        """A Chrome trace from torch.profiler made anywhere: trace-only views, the rest not evaluated."""
        path = Path(path)
        manifest = {"schema_version": bundle_io.SCHEMA_VERSION, "trace_only": True, "target": {"script": path.name}}
        return cls(manifest, [], path, [], [], [], path=path)

    def for_window(self, index: int) -> Run:
        """The same run seen through its profiling window number `index` (see `windows`)."""
        if index == self.window:
            return self
        if not any(w.index == index for w in self.windows):
            raise ValueError(f"this run has no profiling window {index}")
        trace = self.path / bundle_io.trace_name(index) if self.path is not None else None
        run = Run(self.manifest, [], trace if trace is not None and trace.is_file() else None,
                  self._host_samples, self._proc_samples, self._gpu_samples, path=self.path, window=index)
        run._whole = self._whole  # the run's events, split by window once for every window
        run.trace_progress = self.trace_progress
        return run

    # -- raw events ------------------------------------------------------------------------------
    def events(self, kind: str) -> Iterator[dict[str, Any]]:
        """This run's window's events of one kind, as written: its steps are those from its opening to the
        next window's."""
        if kind == "step":
            return self._whole.steps_of(self.window)
        return (e for e in self._whole.others_of(self.window) if e.get("kind") == kind)

    @property
    def windows(self) -> list[WindowInfo]:
        """Every profiling window opened in the run, in order (one unless it was profiled with --every)."""
        return self._whole.windows

    @property
    def _startup_steps(self) -> int:
        """Steps skipped as start-up: the window's `wait` before the first window, none before a repeated one."""
        return int(self.manifest.get("window", {}).get("wait", 0)) if self.window == 0 else 0

    @property
    def trace_only(self) -> bool:
        return bool(self.manifest.get("trace_only"))

    @cached_property
    def trace(self) -> TraceData | None:
        return parse_trace(self._trace_path, self.trace_progress) if self._trace_path else None

    # -- steps -----------------------------------------------------------------------------------
    @cached_property
    def _window_first_step(self) -> int:
        opened = [e for e in self.events("window") if e.get("state") == "opened"]
        return int(opened[-1]["first_step"]) if opened else 0

    @cached_property
    def all_steps(self) -> list[Step]:
        if self.trace_only:
            return self._steps_from_trace()
        return [self._step_from_event(e) for e in self.events("step")]

    @cached_property
    def run_steps(self) -> list[Step]:
        """Every step of the whole run, every window's included (the same as all_steps with one window)."""
        if len(self.windows) < 2:
            return self.all_steps
        steps, (first, end) = self._whole.steps, self._whole.step_positions(self.window)
        return ([self._step_from_event(e) for e in steps.between(0, first)] + self.all_steps
                + [self._step_from_event(e) for e in steps.between(end, len(steps))])

    @property
    def window_spans(self) -> dict[int, tuple[float, float]]:
        """Each profiling window's analysed steps, from the first one's start to the last one's end."""
        return self._whole.window_spans

    @property
    def steps_in_run(self) -> int:
        """Steps in the whole run, every window's included."""
        return len(self.all_steps) if self.trace_only else len(self._whole.steps)

    @cached_property
    def steps(self) -> list[Step]:
        steps = self.all_steps
        active = [s for s in steps if s.window in ANALYSED_WINDOW_STATES]
        if active:
            return active
        wait = self._startup_steps
        return steps[wait:] if len(steps) > wait else steps

    @cached_property
    def steady_steps(self) -> list[Step]:
        """Every step after start-up (the window's `wait`), inside the window or not.

        Data wait and wall time are measured at every step, so figures built from them alone should use
        these: a loader with many workers starves in bursts, one long wait every `num_workers` steps,
        which a short window can miss.
        """
        steps = self.all_steps
        wait = self._startup_steps
        return steps[wait:] if len(steps) > wait else steps

    @property
    def gpu_idle_share(self) -> float | None:
        """The GPU's idle time over the analysed steps' wall time, or None when the trace has no GPU activity."""
        measured = [s for s in self.steps if s.gpu_idle_s is not None]
        wall = sum(s.wall_s for s in measured)
        return sum(s.gpu_idle_s or 0.0 for s in measured) / wall if wall > 0 else None

    @property
    def wall_s(self) -> float:
        """Wall time of the analysed steps."""
        return sum(s.wall_s for s in self.steps)

    @property
    def span(self) -> tuple[float, float] | None:
        """From the first analysed step's start to the last one's end (seconds since the epoch)."""
        if not self.steps:
            return None
        return self.steps[0].start, self.steps[-1].end

    def require_steps(self) -> list[Step]:
        if not self.steps:
            raise NotEvaluated("no training step was detected in this run")
        return self.steps

    def _step_from_event(self, event: dict[str, Any]) -> Step:
        start, wall = float(event["t0"]), float(event["wall_s"])
        trace_range = self._trace_step_range(int(event["step"]) - self._window_first_step)
        if trace_range is not None:  # the trace's clock, so that GPU activity lines up exactly
            start, wall = trace_range[0], trace_range[1] - trace_range[0]
        phases = event.get("phases")
        return Step(
            index=int(event["step"]), start=start, wall_s=wall, data_wait_s=float(event.get("data_wait_s", 0.0)),
            window=event.get("window", "waiting"),
            forward_s=phases["forward"] if phases else None, backward_s=phases["backward"] if phases else None,
            optimizer_s=phases["optimizer"] if phases else None,
            copy_s=sum(c["host_s"] for c in event["copies"]) if "copies" in event else None,
            sync_s=sum(s["host_s"] for s in event["syncs"]) if "syncs" in event else None,
            gil=GilStats(**event["gil"]) if event.get("gil") else None,
            cuda_memory=event.get("cuda_memory"), **self._gpu_fields(start, start + wall, trace_range is not None),
        )

    def _trace_step_range(self, trace_step: int) -> tuple[float, float] | None:
        if self.trace is None or trace_step < 0:
            return None
        return self.trace.steps.get(trace_step)

    def _gpu_fields(self, start: float, end: float, in_trace: bool) -> dict[str, Any]:
        if self.gpu is None or not in_trace:
            return {}
        busy = self.gpu.busy_s(start, end)
        return {
            "gpu_busy_s": busy, "gpu_compute_s": self.gpu.compute_s(start, end),
            "gpu_idle_s": max(0.0, (end - start) - busy), "kernels": len(self.gpu.kernels_in(start, end)),
        }

    def _steps_from_trace(self) -> list[Step]:
        trace = self.trace
        if trace is None:
            return []
        waits = [a for a in trace.annotations if "DataLoader" in a.name and "__next__" in a.name]
        wait_starts = [a.start for a in waits]  # annotations are sorted by start
        steps = []
        for index, (start, end) in sorted(trace.steps.items()):
            wait = sum(a.dur for a in waits[bisect_left(wait_starts, start):bisect_left(wait_starts, end)])
            steps.append(Step(index=index, start=start, wall_s=end - start, data_wait_s=wait, window="active",
                              **self._gpu_fields(start, end, True)))
        return steps

    # -- GPU -------------------------------------------------------------------------------------
    @cached_property
    def gpu(self) -> GpuView | None:
        """GPU activity in the trace, or None when the run recorded none."""
        trace = self.trace
        if trace is None or not trace.has_gpu:
            return None
        if trace.steps:
            span = (min(s for s, _ in trace.steps.values()), max(e for _, e in trace.steps.values()))
        else:
            span = (trace.gpu_ops[0].start, max(op.end for op in trace.gpu_ops))
        return GpuView(trace.gpu_ops, span)

    def require_gpu(self) -> GpuView:
        if self.gpu is None:
            raise NotEvaluated(self._why_no_gpu())
        return self.gpu

    @cached_property
    def sync_stall_s(self) -> float | None:
        """GPU idle time, over the analysed steps, that overlaps a synchronizing CUDA call on the host.

        While the host is blocked in a sync the GPU drains its queue, then idles until the host launches
        again: those gaps are what the syncs cost. None when the trace has no GPU activity.
        """
        if self.gpu is None or self.trace is None or not self.steps:
            return None
        syncs = [r for r in self.trace.runtime if r.name in SYNC_CALLS or r.name == "cudaMemcpy"]  # by start
        sync_starts = [s.start for s in syncs]
        latest_end = list(accumulate((s.end for s in syncs), max))  # latest end among the syncs up to each one
        stalled = 0.0
        for step in self.steps:
            for start, end in self.gpu.idle_gaps(step.start, step.end):
                before = bisect_left(sync_starts, end)  # the syncs that start before the gap ends
                if before and latest_end[before - 1] > start:  # one of them ends after it starts
                    stalled += end - start
        return stalled

    def _why_no_gpu(self) -> str:
        if self.trace is None:
            reason = self.manifest.get("collectors", {}).get("profiler", {}).get("reason")
            return f"no profiler trace in this run ({reason})" if reason else "no profiler trace in this run"
        return "no GPU activity in this run's trace (the script did not use CUDA, or CUDA was not available)"

    # -- input pipeline, copies, syncs -----------------------------------------------------------
    @cached_property
    def loader(self) -> LoaderView:
        loaders = [
            LoaderInfo(
                location=Location.from_dict(e.get("site")), num_workers=int(e.get("num_workers", 0)),
                pin_memory=bool(e.get("pin_memory")), batch_size=e.get("batch_size"),
                prefetch_factor=e.get("prefetch_factor"), persistent_workers=bool(e.get("persistent_workers")),
                dataset=str(e.get("dataset", "")), dataset_len=e.get("dataset_len"),
                start_method=e.get("start_method"),
            )
            for e in self.events("loader")
        ]
        return LoaderView(loaders)

    def _window_rows(self, key: str) -> list[dict[str, Any]]:
        analysed = {s.index for s in self.steps}
        return [row for e in self._whole.steps_of(self.window, analysed) for row in e.get(key, [])]

    @cached_property
    def copies(self) -> list[CopySite]:
        groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for row in self._window_rows("copies"):
            site = row.get("site") or {}
            groups[(row["direction"], row["pinned"], row["non_blocking"], site.get("file"), site.get("line"))].append(row)
        return sorted(
            (CopySite(rows[0]["direction"], rows[0]["pinned"], rows[0]["non_blocking"], sum(r["count"] for r in rows),
                      sum(r["bytes"] for r in rows), sum(r["host_s"] for r in rows), max(r["max_s"] for r in rows),
                      Location.from_dict(rows[0].get("site")))
             for rows in groups.values()),
            key=lambda c: -c.host_s,
        )

    @cached_property
    def syncs(self) -> list[SyncSite]:
        groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for row in self._window_rows("syncs"):
            site = row.get("site") or {}
            groups[(row["kind"], site.get("file"), site.get("line"))].append(row)
        return sorted(
            (SyncSite(rows[0]["kind"], sum(r["count"] for r in rows), sum(r["host_s"] for r in rows),
                      max(r["max_s"] for r in rows), Location.from_dict(rows[0].get("site")))
             for rows in groups.values()),
            key=lambda s: -s.host_s,
        )

    # -- threads, processes, forks ---------------------------------------------------------------
    @cached_property
    def threads(self) -> list[ThreadInfo]:
        return [ThreadInfo(e.get("name", ""), e.get("target"), e.get("module"), bool(e.get("daemon")),
                           Location.from_dict(e.get("site")), e.get("native_id"))
                for e in self.events("thread_start")]

    @property
    def python_thread_ids(self) -> set[int] | None:
        """OS ids of the script's Python threads (the main one and those it started), or None for a
        bundle that did not record them."""
        main = self.manifest.get("child", {}).get("process", {}).get("main_native_id")
        if main is None:
            return None
        return {int(main)} | {t.native_id for t in self.threads if t.native_id is not None}

    @cached_property
    def forward_location(self) -> Location | None:
        """Where the script calls its model (the first top-level module call seen in the window)."""
        return next((Location.from_dict(e.get("site")) for e in self.events("forward_site")), None)

    @property
    def user_threads(self) -> list[ThreadInfo]:
        return [t for t in self.threads if not t.is_library]

    @cached_property
    def forks(self) -> list[ForkInfo]:
        return [ForkInfo(float(e["t"]), bool(e.get("cuda_initialized")), e.get("start_method"),
                         bool(e.get("dataloader_worker")), Location.from_dict(e.get("site")))
                for e in self.events("fork")]

    @cached_property
    def processes(self) -> list[ProcessInfo]:
        """The script's process tree over the analysed steps (over the whole run if no step was seen)."""
        return _process_infos(_within(self._proc_samples, self.span, margin=0.5))

    def require_processes(self) -> list[ProcessInfo]:
        if not self.processes:
            raise NotEvaluated("no process samples in this run" if not self.trace_only else
                               "only a trace was analysed: process samples come with a run bundle")
        return self.processes

    # -- samples and environment -----------------------------------------------------------------
    @cached_property
    def samples(self) -> Samples:
        """Host and GPU series over the whole run."""
        return Samples(host=_host_series(self._host_samples, self._proc_samples), gpu=_gpu_series(self._gpu_samples))

    @cached_property
    def step_samples(self) -> Samples:
        """Host and GPU series over the analysed steps only."""
        span = self.span
        if span is None:
            return self.samples
        def keep(points: list[SeriesPoint]) -> list[SeriesPoint]:
            return [points[i] for i in _around([p.t for p in points], span[0] - 0.5, span[1] + 0.5)]

        return Samples(host=keep(self.samples.host), gpu={d: keep(ps) for d, ps in self.samples.gpu.items()})

    def require_host_samples(self) -> Samples:
        if not self.step_samples.host:
            raise NotEvaluated("no host samples in this run" if not self.trace_only else
                               "only a trace was analysed: host samples come with a run bundle")
        return self.step_samples

    @cached_property
    def env(self) -> Env:
        child = self.manifest.get("child", {})
        process, torch, window = child.get("process", {}), child.get("torch", {}), child.get("env_window", {})
        host = self.manifest.get("host", {})
        affinity = process.get("affinity") or host.get("affinity")
        return Env(
            cores=len(affinity) if affinity else host.get("cpu_count"), cpu_count=host.get("cpu_count"),
            memory_total=host.get("memory_total"), gil_enabled=process.get("gil_enabled"),
            start_method=process.get("start_method"), intra_op_threads=window.get("intra_op_threads"),
            python=process.get("python") or self.manifest.get("python"), torch=torch.get("version"),
            cuda_build=torch.get("cuda_build"), driver=self.manifest.get("driver"),
            gpus=self.manifest.get("gpus", []), cuda_device=window.get("cuda_device"),
        )

    @cached_property
    def exit(self) -> Exit:
        info = self.manifest.get("exit") or {}
        exception = info.get("exception") or {}
        return Exit(info.get("ending", "unknown"), info.get("status"), exception.get("exception"),
                    exception.get("message"), Location.from_dict(exception.get("where")))


def _within(samples: list[dict[str, Any]], span: tuple[float, float] | None, margin: float) -> list[dict[str, Any]]:
    if span is None:
        return samples
    times = [s["t"] for s in samples]
    return [samples[i] for i in _around(times, span[0] - margin, span[1] + margin)]


def _around(times: list[float], lo: float, hi: float) -> range:
    """Indices of the sorted `times` in [lo, hi]; with fewer than two there (the span of a short window in an
    old stretch of a long run, whose samples were merged into rows seconds apart), the rows on either side."""
    first, end = bisect_left(times, lo), bisect_right(times, hi)
    if end - first >= 2:
        return range(first, end)
    return range(max(0, first - 1), min(len(times), end + 1))


def _rate(prev: dict[str, Any], cur: dict[str, Any], key: str, dt: float) -> float | None:
    if key not in prev or key not in cur or dt <= 0:
        return None
    return max(0.0, (cur[key] - prev[key]) / dt)


def _tree_cpu(sample: dict[str, Any]) -> dict[int, float]:
    return {p["pid"]: p["cpu_s"] for p in sample.get("procs", [])}


def _host_series(host: list[dict[str, Any]], procs: list[dict[str, Any]]) -> list[SeriesPoint]:
    tree_by_time = {round(s["t"], 6): _tree_cpu(s) for s in procs}
    points, prev, prev_tree = [], None, None
    for sample in host:
        tree = tree_by_time.get(round(sample["t"], 6))
        if prev is not None:
            dt = sample["t"] - prev["t"]
            busy = sum(sample.get("cpu_pct", [])) / 100.0
            tree_cores = None
            if tree is not None and prev_tree is not None and dt > 0:
                # A process new since the last sample (a fresh worker) started with no CPU time of its own.
                tree_cores = sum(max(0.0, cpu - prev_tree.get(pid, 0.0)) for pid, cpu in tree.items()) / dt
            points.append(SeriesPoint(sample["t"], {
                "busy_cores": busy, "tree_cores": tree_cores,
                "other_cores": max(0.0, busy - tree_cores) if tree_cores is not None else None,
                # Over a merged row (an old stretch of a long run), memory pressure is its worst moment.
                "load1": sample.get("load", [None])[0], "mem_available": lowest(sample, "mem_available"),
                "swap_in_bps": _rate(prev, sample, "swap_in", dt), "swap_out_bps": _rate(prev, sample, "swap_out", dt),
            }))
        prev, prev_tree = sample, tree
    return points


def _gpu_series(samples: list[dict[str, Any]]) -> dict[int, list[SeriesPoint]]:
    series: dict[int, list[SeriesPoint]] = defaultdict(list)
    for sample in samples:
        for row in sample.get("gpus", []):
            values = {k: v for k, v in row.items() if k not in _NOT_GPU_VALUES}
            series[int(row["gpu"])].append(SeriesPoint(sample["t"], values))
    return dict(series)


_NOT_GPU_VALUES = frozenset({"gpu", "n", "lo", "hi", "counts"})  # an entry's id, and a merged row's extras


def _process_infos(samples: list[dict[str, Any]]) -> list[ProcessInfo]:
    if not samples:
        return []
    root = next((p["pid"] for s in samples for p in s.get("procs", [])), None)
    history: dict[int, list[tuple[float, dict[str, Any]]]] = defaultdict(list)
    for sample in samples:
        for proc in sample.get("procs", []):
            history[proc["pid"]].append((sample["t"], proc))
    infos = []
    for pid, rows in history.items():
        rates = [(b[1]["cpu_s"] - a[1]["cpu_s"]) / (b[0] - a[0]) for a, b in zip(rows, rows[1:]) if b[0] > a[0]]
        first, last = rows[0], rows[-1]
        elapsed = last[0] - first[0]
        infos.append(ProcessInfo(
            pid=pid, ppid=last[1].get("ppid"), name=last[1].get("name", ""), role="main" if pid == root else "child",
            # CPU seconds are running totals, so this is the mean over time, however unevenly sampled.
            cpu_mean=(last[1]["cpu_s"] - first[1]["cpu_s"]) / elapsed if elapsed > 0 else 0.0,
            cpu_max=max(rates, default=0.0),
            rss_max=max(highest(r[1], "rss") or 0 for r in rows),
            threads_max=max(highest(r[1], "threads") or 0 for r in rows),
            thread_cores=_thread_cores(first[1], last[1], elapsed),
            ctx_invol_per_s=_rate(first[1], last[1], "ctx_invol", elapsed),
        ))
    return infos


def _thread_cores(first: dict[str, Any], last: dict[str, Any], elapsed: float) -> dict[str, float]:
    if elapsed <= 0:
        return {}
    before = first.get("thread_cpu", {})
    return {tid: max(0.0, cpu - before.get(tid, 0.0)) / elapsed for tid, cpu in last.get("thread_cpu", {}).items()}
