"""`Run`: a bundle parsed once into typed, cached views: the API that rules are written against."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from gpudoctor import bundle as bundle_io
from gpudoctor.analysis.batch_growth import BatchGrowth, batch_growth, kernel_fills
from gpudoctor.analysis.budget import Budget, idle_in_syncs, step_budget, step_splits
from gpudoctor.analysis.collectives import collective_only_s
from gpudoctor.analysis.data_wait import DataWait, data_wait
from gpudoctor.analysis.events import ANALYSED_WINDOW_STATES, TRACED_WINDOW_STATES, RunEvents
from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.kernels import kernels_in_steps
from gpudoctor.analysis.samples import around, gpu_series, host_series, process_infos, within
from gpudoctor.analysis.sites import copy_sites, sync_sites
from gpudoctor.analysis.steps import StepBuilder, gil_stats
from gpudoctor.analysis.threads import python_threads_sharing
from gpudoctor.analysis.trace import GRAPH_LAUNCH, TraceData, parse_trace
from gpudoctor.analysis.views import (
    CopySite,
    Env,
    Exit,
    ForkInfo,
    GilStats,
    LoaderInfo,
    LoaderView,
    Location,
    NotEvaluated,
    ProcessInfo,
    Samples,
    SeriesPoint,
    StartedProcess,
    Step,
    SyncSite,
    ThreadInfo,
    WindowInfo,
)
from gpudoctor.bundle.events import (
    AnyEvent,
    BackwardSiteEvent,
    ForkEvent,
    ForwardSiteEvent,
    HostLinesEvent,
    LoaderEvent,
    ProcessFacts,
    ProcessStartEvent,
    StepEvent,
    StepLessGilEvent,
    ThreadStartEvent,
    TorchFacts,
    WindowEvent,
    WindowFacts,
)
from gpudoctor.bundle.manifest import ExceptionInfo, ExitInfo, Manifest
from gpudoctor.bundle.samples import GpuRow, HostRow, ProcsRow
from gpudoctor.errors import TraceNotJsonError

__all__ = ["NotEvaluated", "Run"]

E = TypeVar("E", bound=AnyEvent)


class Run:
    """One profiled run. Build it with `Run.from_bundle(path)` or `Run.from_trace(path)`.

    `steps` are the steps analysed: those of the profiler's active window when it recorded, otherwise
    every step after the window's `wait` (start-up is not representative), otherwise all of them.

    A run profiled with `--every` has several windows (`windows`); a `Run` shows one of them
    (`window`, the first by default) with the steps from its opening to the next one's, and
    `for_window(N)` gives the others.
    """

    def __init__(self, manifest: Manifest, events: Iterable[AnyEvent], trace_path: Path | None,
                 host_samples: list[HostRow], proc_samples: list[ProcsRow], gpu_samples: list[GpuRow],
                 path: Path | None = None, window: int = 0) -> None:
        self.manifest = manifest
        self.path = path
        self.window = window
        self._whole = RunEvents(events)
        self._trace_path = trace_path
        self._host_samples, self._proc_samples, self._gpu_samples = host_samples, proc_samples, gpu_samples
        # Told of each chunk of the trace read, (done, total) in bytes: `gpudoctor analyze` sets it to draw its
        # progress line on a terminal.
        self.trace_progress: Callable[[int, int], None] | None = None

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_bundle(cls, path: Path | str) -> Run:
        b = bundle_io.load(Path(path))
        return cls(b.manifest, b.events(), b.trace_path, b.host_samples(), b.proc_samples(), b.gpu_samples(),
                   path=b.path)

    @classmethod
    def from_trace(cls, path: Path | str) -> Run:
        """A Chrome trace from torch.profiler made anywhere: trace-only views, the rest not evaluated."""
        path = Path(path)
        return cls(Manifest.for_trace(path), [], path, [], [], [], path=path)

    @property
    def trace_file(self) -> Path | None:
        """The profiler trace this run's views come from."""
        return self._trace_path

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

    # -- events ----------------------------------------------------------------------------------
    def events(self, kind: type[E]) -> list[E]:
        """This run's window's events of one kind (e.g. `run.events(LoaderEvent)`), as written."""
        return self._whole.others_of(self.window, kind)

    def step_events(self) -> Iterable[StepEvent]:
        """This run's window's step events: from its opening to the next window's."""
        return self._whole.steps_of(self.window)

    @property
    def windows(self) -> list[WindowInfo]:
        """Every profiling window opened in the run, in order (one unless it was profiled with --every)."""
        return self._whole.windows

    @property
    def _startup_steps(self) -> int:
        """Steps skipped as start-up: the window's `wait` before the first window, none before a repeated one."""
        settings = self.manifest.window
        return settings.wait if settings is not None and self.window == 0 else 0

    @property
    def trace_only(self) -> bool:
        return self.manifest.trace_only

    @property
    def trace(self) -> TraceData | None:
        return self._trace_read[0]

    @property
    def trace_error(self) -> str | None:
        """Why the run's trace was left out (it is not JSON, even repaired: cut short, written badly), if it was."""
        return self._trace_read[1]

    @cached_property
    def _trace_read(self) -> tuple[TraceData | None, str | None]:
        """The trace, or why a run bundle's trace was left out: its report is then made from its events and
        samples. A trace analysed alone that is not JSON has nothing else: that raises."""
        if not self._trace_path:
            return None, None
        try:
            return parse_trace(self._trace_path, self.trace_progress), None
        except TraceNotJsonError as exc:
            if self.trace_only:
                raise
            return None, str(exc)

    # -- steps -----------------------------------------------------------------------------------
    @cached_property
    def _steps(self) -> StepBuilder:
        opened = [e for e in self.events(WindowEvent) if e.state == "opened"]
        return StepBuilder(self.trace, self.gpu, (opened[-1].first_step or 0) if opened else 0, self.window)

    @cached_property
    def all_steps(self) -> list[Step]:
        if self.trace_only:
            return self._steps.from_trace()
        return [self._steps.from_event(e) for e in self.step_events()]

    @cached_property
    def run_steps(self) -> list[Step]:
        """Every step of the whole run, every window's included (the same as all_steps with one window)."""
        if len(self.windows) < 2:
            return self.all_steps
        steps, (first, end) = self._whole.steps, self._whole.step_positions(self.window)
        build = self._steps.from_event
        return ([build(e) for e in steps.between(0, first)] + self.all_steps
                + [build(e) for e in steps.between(end, len(steps))])

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
        active = [s for s in self.all_steps if s.window in ANALYSED_WINDOW_STATES]
        # Without an active window, every step after start-up but the profiler's warm-up ones, which it slows.
        return active or [s for s in self.steady_steps if s.window != "warmup"] or self.steady_steps

    @cached_property
    def steady_steps(self) -> list[Step]:
        """Every step after start-up (the window's `wait`), inside the window or not.

        Data wait and wall time are measured at every step, so figures built from them alone should use
        these: a loader with many workers starves in bursts, one long wait every `num_workers` steps,
        which a short window can miss. The step the script's end closed is not one: it holds what ran after
        the loop.
        """
        steps = [s for s in self.all_steps if not s.ends_run]
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
        return (self.steps[0].start, self.steps[-1].end) if self.steps else None

    def require_steps(self) -> list[Step]:
        if not self.steps:
            raise NotEvaluated("no training step was detected in this run")
        return self.steps

    def require_gil(self) -> list[GilStats]:
        """The GIL probe's figures over the hooked steps (it runs in the window's detail steps) or, in a program
        that marked no step, over the run (collect.stepless)."""
        stepless = [] if self.steps else self.events(StepLessGilEvent)
        events = self._hooked_step_events if self.steps else stepless
        figures = [f for f in (gil_stats(e.gil) for e in events) if f is not None]
        if not figures:
            self.require_steps()
            raise NotEvaluated("the GIL probe recorded nothing (it runs in the profiling window's detail steps)")
        return figures

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
    def budget(self) -> Budget | None:
        """The analysed steps' time budget (analysis.budget); None without GPU activity in the trace."""
        from gpudoctor.analysis.timebase import step_time  # timebase reads a Run: imported here, not above

        pace = step_time(self)
        return step_budget(self.steps, self._step_splits, self.steady_wait_share, pace.seconds,
                           outside_window=pace.basis == "unprofiled", sync_blocked_s=self.sync_blocked_s)

    @cached_property
    def _step_splits(self) -> list[dict[str, float]] | None:
        """The analysed steps split into the budget's slices, once (analysis.budget.step_splits)."""
        return step_splits(self.steps, self.gpu, self.trace)

    @cached_property
    def sync_blocked_s(self) -> float | None:
        """The host's time blocked in synchronizing calls, per step, as the detail steps timed them (without the
        profiler); None when no call was timed, or when several Python threads share the work (their blocked
        times overlap, and the GIL they take turns on is what the time goes to)."""
        if not self.syncs or (self.python_threads_sharing or 1) > 1:
            return None
        return sum(site.host_s for site in self.syncs) / self.site_steps

    @cached_property
    def memory_headroom(self) -> float | None:
        """How many times the analysed steps' peak CUDA allocation fits in the device's memory; None when either is
        unknown."""
        device = self.env.cuda_device
        peaks = [s.cuda_memory.max_allocated for s in self.steps if s.cuda_memory]
        total = device.total_memory if device is not None else None
        if not peaks or not total or not max(peaks):
            return None
        return total / max(peaks)

    @cached_property
    def batch_growth(self) -> BatchGrowth | None:
        """What a larger batch would save per sample, from the budget and how much of the GPU the analysed steps'
        kernels fill (analysis.batch_growth); None without a budget or kernels."""
        budget, gpu, trace = self.budget, self.gpu, self.trace
        placed = [s for s in self.steps if s.gpu_busy_s is not None]
        if budget is None or gpu is None or trace is None or not placed:
            return None
        kernels = kernels_in_steps(gpu, placed)
        fills = kernel_fills(kernels.warps_per_sm(), kernels.devices(), trace.warps_per_sm_limit())
        busy_s = (1.0 - budget.idle_share) * budget.step_s
        return batch_growth(budget.step_s, busy_s, kernels.durations(), fills, self.memory_headroom)

    @cached_property
    def gpu_work_per_step_s(self) -> float | None:
        """The GPU's work for one step: its busy time over the whole trace, what it ran after the host had launched
        the last traced step included (a host that runs ahead of a GPU-bound step leaves its work queued past the
        step's end, and the profiler's stop waits for it), over the steps traced (the profiler's warm-up ones
        too). Collectives with no compute beside them are left out: on a rank of a job they are mostly its wait
        for the others, which an NCCL kernel spends busy (a rank that waited 3 ms a step read as GPU-bound at
        8.0 ms a step, its host and the other rank stepping in 5.6). None without GPU activity in the trace."""
        gpu, steps = self.gpu, self.steps
        if gpu is None or not steps:
            return None
        every = self.all_steps
        traced = len(every) if self.trace_only else sum(1 for s in every if s.window in TRACED_WINDOW_STATES)
        work = gpu.busy_s(-math.inf, math.inf) - collective_only_s(self.trace)
        return max(0.0, work) / (traced or len(steps))

    @cached_property
    def data_wait(self) -> DataWait | None:
        """The data wait of every step after start-up (timed at each step, cheaply), and the part of it the GPU
        spent idle (analysis.data_wait): what the input-pipeline rules size their savings on. None without steps."""
        return data_wait(self.steady_steps, self.gpu_work_per_step_s)

    @property
    def steady_wait_share(self) -> float | None:
        """The share of every step after start-up that the GPU spent idle waiting for data: what the budget and
        the breakdown show as the wait."""
        wait = self.data_wait
        return wait.share if wait is not None else None

    @cached_property
    def sync_stall_s(self) -> float | None:
        """GPU idle time, over the analysed steps, that overlaps a synchronizing CUDA call on the host: while the
        host is blocked in a sync the GPU drains its queue, then idles until the host launches again: those gaps
        are what the syncs cost (the budget's `sync` slice adds the launches after them, up to the host's time
        blocked: `sync_blocked_s`). None when the trace has no GPU activity."""
        if self.gpu is None or self.trace is None or not self.steps:
            return None
        return idle_in_syncs(self._step_splits or [])

    def _why_no_gpu(self) -> str:
        if self.trace_error is not None:
            return f"the profiler trace was left out: {self.trace_error}"
        if self.trace is None:
            reason = self.manifest.collector_reason("profiler")
            return f"no profiler trace in this run ({reason})" if reason else "no profiler trace in this run"
        return "no GPU activity in this run's trace (the script did not use CUDA, or CUDA was not available)"

    # -- input pipeline, copies, syncs -----------------------------------------------------------
    @cached_property
    def loader(self) -> LoaderView:
        return LoaderView([_loader_info(e) for e in self.events(LoaderEvent)])

    @cached_property
    def _hooked_step_events(self) -> list[StepEvent]:
        """The steps gpudoctor's per-call hooks watched: the window's detail steps, after the profiled ones
        (in bundles recorded before there were detail steps, the analysed steps themselves)."""
        detail = [e for e in self._whole.steps_of(self.window) if e.window == "detail"]
        if detail:
            return detail
        analysed = {s.index for s in self.steps}
        return list(self._whole.steps_of(self.window, analysed))

    @cached_property
    def hooked_steps(self) -> list[Step]:
        """The steps the per-call hooks watched (phases, copies, syncs): the window's detail steps, if any."""
        return [self._steps.from_event(e) for e in self._hooked_step_events]

    @property
    def site_steps(self) -> int:
        """How many steps `copies` and `syncs` add up: divide their counts and times by it for figures per step."""
        return len(self._hooked_step_events) or len(self.steps) or 1

    @cached_property
    def copies(self) -> list[CopySite]:
        """Host<->device copies per line of the script, summed over the `site_steps` hooked steps."""
        return copy_sites(self._hooked_step_events)

    @cached_property
    def syncs(self) -> list[SyncSite]:
        """Synchronizing calls per line of the script, summed over the `site_steps` hooked steps."""
        return sync_sites(self._hooked_step_events)

    # -- threads, processes, forks ---------------------------------------------------------------
    @cached_property
    def threads(self) -> list[ThreadInfo]:
        return [ThreadInfo(e.name, e.target, e.module, e.daemon, Location.from_site(e.site), e.native_id)
                for e in self.events(ThreadStartEvent)]

    @property
    def python_thread_ids(self) -> set[int] | None:
        """OS ids of the script's Python threads (the main one and those it started); None if not recorded."""
        main = self._process_facts.main_native_id
        if main is None:
            return None
        return {main} | {t.native_id for t in self.threads if t.native_id is not None}

    @cached_property
    def host_lines(self) -> list[tuple[Location, float]]:
        """The user's lines the host spent its time on in the detail steps, each with its share of the samples
        (collect.hostlines), the most sampled first."""
        counts: dict[Location, int] = {}
        total = 0
        for event in self.events(HostLinesEvent):
            total += event.samples
            for line in event.lines:
                where = Location(line.file, line.line, line.function)
                counts[where] = counts.get(where, 0) + line.samples
        ranked = sorted(counts.items(), key=lambda item: -item[1])
        return [(where, count / total) for where, count in ranked] if total else []

    @cached_property
    def backward_location(self) -> Location | None:
        """Where the script calls backward() (the first line seen in the window's detail steps)."""
        return next((Location.from_site(e.site) for e in self.events(BackwardSiteEvent)), None)

    @cached_property
    def forward_module(self) -> str | None:
        """The class of the outermost model the script calls ("OptimizedModule" for a torch.compile'd one)."""
        return next((e.module for e in self.events(ForwardSiteEvent) if e.module), None)

    @cached_property
    def replays_cuda_graphs(self) -> bool:
        """Whether the profiled steps launch CUDA graphs (cudaGraphLaunch in the trace)."""
        trace = self.trace
        return trace is not None and any(call.name == GRAPH_LAUNCH for call in trace.runtime)

    @cached_property
    def forward_location(self) -> Location | None:
        """Where the script calls its model (the first top-level module call seen in the window)."""
        return next((Location.from_site(e.site) for e in self.events(ForwardSiteEvent)), None)

    @cached_property
    def python_threads_sharing(self) -> int | None:
        """Python threads taking turns on the main process's work (analysis.threads); None when not recorded."""
        return python_threads_sharing(self)

    @property
    def user_threads(self) -> list[ThreadInfo]:
        return [t for t in self.threads if not t.is_library]

    @cached_property
    def forks(self) -> list[ForkInfo]:
        return [ForkInfo(e.t or 0.0, e.cuda_initialized, e.start_method, e.dataloader_worker,
                         Location.from_site(e.site))
                for e in self.events(ForkEvent)]

    @cached_property
    def started_processes(self) -> list[StartedProcess]:
        """The processes the script started through multiprocessing, DataLoader workers left out: gpudoctor
        profiles the script's own process, and their steps are not in its report."""
        sampled = {p.pid: p for p in process_infos(self._proc_samples)}
        started = []
        for event in self.events(ProcessStartEvent):
            if event.dataloader_worker:
                continue
            info = sampled.get(event.pid) if event.pid is not None else None
            fresh = event.start_method in ("spawn", "forkserver")  # its open files are its own, not inherited
            started.append(StartedProcess(
                event.pid, event.start_method, event.target, Location.from_site(event.site),
                info.cpu_mean if info else None, (info.gpu if fresh else None) if info else None,
            ))
        return started

    @cached_property
    def processes(self) -> list[ProcessInfo]:
        """The script's process tree over the analysed steps (over the whole run if no step was seen)."""
        return process_infos(within(self._proc_samples, self.span, margin=0.5))

    @cached_property
    def steady_processes(self) -> list[ProcessInfo]:
        """The script's process tree over the steady steps (every step after start-up): the input-pipeline rules
        compare it with the data wait they measure over those steps. A short window may catch the loader's
        workers idle, ahead of the step, while they cannot keep up later on."""
        steps = self.steady_steps
        if not steps:
            return self.processes
        return process_infos(within(self._proc_samples, (steps[0].start, steps[-1].end), margin=0.5)) or self.processes

    def require_processes(self) -> list[ProcessInfo]:
        if not self.processes:
            raise NotEvaluated("no process samples in this run" if not self.trace_only else
                               "only a trace was analysed: process samples come with a run bundle")
        return self.processes

    # -- samples and environment -----------------------------------------------------------------
    @cached_property
    def samples(self) -> Samples:
        """Host and GPU series over the whole run."""
        return Samples(host=host_series(self._host_samples, self._proc_samples), gpu=gpu_series(self._gpu_samples))

    @cached_property
    def step_samples(self) -> Samples:
        """Host and GPU series over the analysed steps only."""
        span = self.span
        if span is None:
            return self.samples

        def keep(points: list[SeriesPoint]) -> list[SeriesPoint]:
            return [points[i] for i in around([p.t for p in points], span[0] - 0.5, span[1] + 0.5)]

        return Samples(host=keep(self.samples.host), gpu={d: keep(ps) for d, ps in self.samples.gpu.items()})

    def require_host_samples(self) -> Samples:
        if not self.step_samples.host:
            raise NotEvaluated("no host samples in this run" if not self.trace_only else
                               "only a trace was analysed: host samples come with a run bundle")
        return self.step_samples

    @cached_property
    def _process_facts(self) -> ProcessFacts:
        return self.manifest.child.process or ProcessFacts()

    @cached_property
    def env(self) -> Env:
        manifest, process = self.manifest, self._process_facts
        torch = manifest.child.torch or TorchFacts()
        window = manifest.child.env_window or WindowFacts()
        affinity = process.affinity or manifest.host.affinity
        return Env(
            cores=len(affinity) if affinity else manifest.host.cpu_count, cpu_count=manifest.host.cpu_count,
            memory_total=manifest.host.memory_total, gil_enabled=process.gil_enabled,
            start_method=process.start_method, intra_op_threads=window.intra_op_threads,
            python=process.python or manifest.python, torch=torch.version, cuda_build=torch.cuda_build,
            driver=manifest.driver, gpus=manifest.gpus, cuda_device=window.cuda_device,
            switch_interval_s=process.switch_interval_s, ranks_on_host=max(1, process.local_world_size or 1),
            frameworks=tuple(window.frameworks or ()),
        )

    @cached_property
    def exit(self) -> Exit:
        info = self.manifest.exit or ExitInfo()
        exception = info.exception or ExceptionInfo()
        return Exit(info.ending, info.status, exception.exception, exception.message,
                    Location.from_site(exception.where))


def _loader_info(e: LoaderEvent) -> LoaderInfo:
    return LoaderInfo(
        location=Location.from_site(e.site), num_workers=e.num_workers, pin_memory=e.pin_memory,
        batch_size=e.batch_size, prefetch_factor=e.prefetch_factor, persistent_workers=e.persistent_workers,
        dataset=e.dataset, dataset_len=e.dataset_len, start_method=e.start_method, sampler=e.sampler,
        drop_last=e.drop_last, made_by=e.made_by,
    )
