"""`Run`: a bundle parsed once into typed, cached views: the API that rules are written against."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from functools import cached_property
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpudoctor import bundle as bundle_io
from gpudoctor.analysis.batch_growth import BatchGrowth, batch_growth, kernel_fills
from gpudoctor.analysis.budget import Budget, step_budget
from gpudoctor.analysis.call_sites import CallSites
from gpudoctor.analysis.data_wait import DataWait, data_wait
from gpudoctor.analysis.events import RunEvents
from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.gpu_work import GpuWork, gpu_view, memory_headroom
from gpudoctor.analysis.host_view import HostView
from gpudoctor.analysis.job_time import JobTime
from gpudoctor.analysis.step_view import StepView
from gpudoctor.analysis.steps import StepBuilder, gil_stats
from gpudoctor.analysis.throughput import Throughput, throughput
from gpudoctor.analysis.timebase import (
    ReferenceStep,
    StepTime,
    WindowDistortion,
    reference_step,
    step_source,
    step_time,
    window_distortion,
)
from gpudoctor.analysis.trace import TraceData, parse_trace
from gpudoctor.analysis.views import (
    GilStats,
    NotEvaluated,
    ProcessInfo,
    Samples,
    Step,
    WindowInfo,
)
from gpudoctor.bundle.confined import bundle_file
from gpudoctor.bundle.events import AnyEvent, FlopsEvent, StepEvent, StepLessGilEvent, StepSourceEvent, WindowEvent
from gpudoctor.bundle.manifest import Manifest
from gpudoctor.bundle.samples import GpuRow, HostRow, ProcsRow
from gpudoctor.errors import BundleError, TraceNotJsonError

__all__ = ["MOVED", "NotEvaluated", "Run", "RunNameMoved"]

E = TypeVar("E", bound=AnyEvent)


class Run:
    """One profiled run. Build it with `Run.from_bundle(path)` or `Run.from_trace(path)`.

    Its figures come from a few views, each built once from what it needs: `step_view` (the steps), `gpu_work`
    (the GPU's work, split step by step), `host` (the script's processes, threads and samples, and the machine),
    `sites` (the lines of the script the hooks saw) and `job_time` (start-up, stalls, compilation). The run itself
    holds the steps analysed (`steps`, the step view's) and the figures that several views make: the step at the
    run's pace (`pace`), the data wait, and the time budget; the rest is read on the views (`run.sites.loader`,
    `run.host.env`). The names rules read on the run before the views (MOVED) still answer, each with a
    RunNameMoved warning.

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
        self._sampled = _Samples((host_samples, proc_samples, gpu_samples))  # shared by its windows' runs
        # Told of each chunk of the trace read, (done, total) in bytes: `gpudoctor analyze` sets it to draw its
        # progress line on a terminal.
        self.trace_progress: Callable[[int, int], None] | None = None

    # -- construction ----------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Callable[..., Run], tuple[Any, ...]]:
        """A run pickles as what it was made of and its trace as read (another process's analysis of a job's rank,
        gpudoctor.job.parallel): its views are made again where they are asked for, without reading the trace
        again; the samples travel as msgpack (`_Samples`), once for all the windows' runs pickled together."""
        trace_read = self.__dict__.get("_trace_read")
        return _unpickled, (self.manifest, self._whole, self._trace_path, self._sampled, self.path, self.window,
                            trace_read)

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
        trace = bundle_file(self.path, bundle_io.trace_name(index)) if self.path is not None else None
        run = Run(self.manifest, [], trace, [], [], [], path=self.path, window=index)
        run._whole = self._whole  # the run's events, split by window once for every window
        run._sampled = self._sampled  # and its samples, encoded once to pickle them
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
        """The trace, read once: a read that failed fails again at once, never read anew (a gzip bomb once took
        each of the 23 rules its own two minutes)."""
        trace, _, failed = self._trace_read
        if failed is not None:
            raise failed
        return trace

    @property
    def trace_error(self) -> str | None:
        """Why the run's trace was left out (it is not JSON, even repaired: cut short, written badly), if it was."""
        return self._trace_read[1]

    @cached_property
    def _trace_read(self) -> tuple[TraceData | None, str | None, BundleError | None]:
        """The trace, or why a run bundle's trace was left out (its report is then made from its events and
        samples), or the error reading it raised: a trace analysed alone that is not JSON has nothing else."""
        if not self._trace_path:
            return None, None, None
        try:
            return parse_trace(self._trace_path, self.trace_progress), None, None
        except TraceNotJsonError as exc:
            if self.trace_only:
                return None, None, exc
            return None, str(exc), None
        except BundleError as exc:  # a hostile trace (too deep, a bomb): the analysis says so, in one sentence
            return None, None, exc

    # -- the views ---------------------------------------------------------------------------------
    @cached_property
    def step_view(self) -> StepView:
        """The window's steps (analysis.step_view)."""
        opened = [e for e in self.events(WindowEvent) if e.state == "opened"]
        builder = StepBuilder(self.trace, self.gpu, (opened[-1].first_step or 0) if opened else 0, self.window)
        return StepView(self._whole, self.window, builder, self.trace_only, self._startup_steps)

    @cached_property
    def gpu(self) -> GpuView | None:
        """GPU activity in the trace, or None when the run recorded none."""
        return gpu_view(self.trace)

    @cached_property
    def gpu_work(self) -> GpuWork:
        """The GPU's work over the window's steps (analysis.gpu_work)."""
        return GpuWork(self.gpu, self.trace, self.step_view, self.step_source == "optimizer")

    @cached_property
    def host(self) -> HostView:
        """The script's processes, threads and samples, and the machine (analysis.host_view)."""
        return HostView(self.manifest, self.events, self.step_view, *self._samples())

    def _samples(self) -> SampleRows:
        """The host's, the processes' and the GPUs' samples."""
        return self._sampled.rows()

    @cached_property
    def job_time(self) -> JobTime:
        """Where the job's time goes outside its steady steps: start-up, stalls, compilation (analysis.job_time)."""
        return JobTime(self.manifest, self.events, self.step_view, self._pace_seconds)

    def _pace_seconds(self) -> float | None:
        return self.pace.seconds  # a method, not a lambda: an analysed run pickles (gpudoctor.job.parallel)

    @cached_property
    def sites(self) -> CallSites:
        """The lines of the script the window saw it run (analysis.call_sites)."""
        return CallSites(self.events, self.step_view)

    # -- steps and their pace --------------------------------------------------------------------
    @property
    def steps(self) -> list[Step]:
        """The steps analysed (the step view's `steps`): those of the profiler's active window when it recorded."""
        return self.step_view.steps


    @cached_property
    def pace(self) -> StepTime:
        """The step at the run's pace (analysis.timebase.step_time): what savings are sized on."""
        return step_time(self.step_view, self.gpu_work.per_step_s)

    @cached_property
    def distortion(self) -> WindowDistortion:
        """How much the profiling window slowed the steps it recorded (analysis.timebase.window_distortion)."""
        return window_distortion(self.step_view)

    @cached_property
    def reference_step(self) -> ReferenceStep:
        return reference_step(self.step_view, self.distortion)

    @cached_property
    def step_source(self) -> str | None:
        """What marked the steps: marker, optimizer, backward, dataloader, forward or profiler_step."""
        return step_source(self.step_view, self.events(StepSourceEvent), self.trace)

    def require_steps(self) -> list[Step]:
        if not self.steps:
            raise NotEvaluated("no training step was detected in this run")
        return self.steps

    def require_gil(self) -> list[GilStats]:
        """The GIL probe's figures over the hooked steps (it runs in the window's detail steps) or, in a program
        that marked no step, over the run (collect.stepless)."""
        stepless = [] if self.steps else self.events(StepLessGilEvent)
        events = self.step_view.hooked_step_events if self.steps else stepless
        figures = [f for f in (gil_stats(e.gil) for e in events) if f is not None]
        if not figures:
            self.require_steps()
            raise NotEvaluated("the GIL probe recorded nothing (it runs in the profiling window's detail steps)")
        return figures

    # -- the GPU's work and the budget -----------------------------------------------------------

    def require_gpu(self) -> GpuView:
        if self.gpu is None:
            raise NotEvaluated(self._why_no_gpu())
        return self.gpu

    @cached_property
    def data_wait(self) -> DataWait | None:
        """The data wait of every step after start-up (timed at each step, cheaply), and the part of it the GPU
        spent idle (analysis.data_wait): what the input-pipeline rules size their savings on. None without steps."""
        return data_wait(self.step_view.steady_steps, self.gpu_work.per_step_s)

    @property
    def steady_wait_share(self) -> float | None:
        """The share of every step after start-up that the GPU spent idle waiting for data: what the budget and
        the breakdown show as the wait."""
        wait = self.data_wait
        return wait.share if wait is not None else None

    @cached_property
    def sync_blocked_s(self) -> float | None:
        """The host's time blocked in synchronizing calls, per step, as the detail steps timed them (without the
        profiler); None when no call was timed, or when several Python threads share the work (their blocked
        times overlap, and the GIL they take turns on is what the time goes to)."""
        syncs = self.sites.syncs
        if not syncs or (self.host.python_threads_sharing or 1) > 1:
            return None
        return sum(site.host_s for site in syncs) / self.step_view.site_steps

    @cached_property
    def budget(self) -> Budget | None:
        """The analysed steps' time budget (analysis.budget), at the run's pace; None without GPU activity."""
        pace = self.pace
        return step_budget(self.steps, self.gpu_work.splits, self.steady_wait_share, pace.seconds,
                           outside_window=pace.basis == "unprofiled", sync_blocked_s=self.sync_blocked_s,
                           stall_share=self.job_time.stall_share)

    @cached_property
    def throughput(self) -> Throughput | None:
        """The step's matrix work against the device's peak (analysis.throughput), at the run's pace; None where no
        step's work was counted (a compiled model) or the run has no pace, and on a run without GPU activity."""
        if self.gpu is None:
            return None
        device = self.host.env.cuda_device
        precision = self.gpu_work.precision
        name = (device.name if device is not None else None) or (precision.device if precision is not None else None)
        counted = [e for e in self._whole.others if isinstance(e, FlopsEvent)]  # one step of the run, any window's
        return throughput(counted, self.pace.seconds, name)

    @cached_property
    def memory_headroom(self) -> float | None:
        """How many times the analysed steps' peak CUDA allocation fits in the device's memory; None when either is
        unknown."""
        return memory_headroom(self.steps, self.host.env.cuda_device)

    @cached_property
    def batch_growth(self) -> BatchGrowth | None:
        """What a larger batch would save per sample, from the budget and how much of the GPU the analysed steps'
        kernels fill (analysis.batch_growth); None without a budget or kernels."""
        budget, kernels, trace = self.budget, self.gpu_work.kernels, self.trace
        if budget is None or kernels is None or trace is None:
            return None
        fills = kernel_fills(kernels.warps_per_sm(), kernels.devices(), trace.warps_per_sm_limit())
        busy_s = (1.0 - budget.idle_share) * budget.step_s
        return batch_growth(budget.step_s, busy_s, kernels.durations(), fills, self.memory_headroom)

    def _why_no_gpu(self) -> str:
        if self.trace_error is not None:
            return f"the profiler trace was left out: {self.trace_error}"
        if self.trace is None:
            reason = self.manifest.collector_reason("profiler")
            return f"no profiler trace in this run ({reason})" if reason else "no profiler trace in this run"
        return "no GPU activity in this run's trace (the script did not use CUDA, or CUDA was not available)"

    # -- call sites ------------------------------------------------------------------------------

    # -- the host: processes, threads, samples, the machine --------------------------------------

    def require_processes(self) -> list[ProcessInfo]:
        processes = self.host.processes
        if not processes:
            raise NotEvaluated("no process samples in this run" if not self.trace_only else
                               "only a trace was analysed: process samples come with a run bundle")
        return processes

    def require_host_samples(self) -> Samples:
        samples = self.host.step_samples
        if not samples.host:
            raise NotEvaluated("no host samples in this run" if not self.trace_only else
                               "only a trace was analysed: host samples come with a run bundle")
        return samples


# Members that rules once read on the run itself and that now live on one of its views: `run.loader` is
# `run.sites.loader`. Each old name still answers, with a RunNameMoved warning that gives its new spelling
# (docs/custom-rules.md, "Names that moved"); gpudoctor's own code and its built-in rules use the new ones.
MOVED: dict[str, str] = {
    # step_view
    "all_steps": "step_view.all_steps", "run_steps": "step_view.run_steps", "steady_steps": "step_view.steady_steps",
    "hooked_steps": "step_view.hooked_steps", "site_steps": "step_view.site_steps",
    "steps_in_run": "step_view.steps_in_run", "window_spans": "step_view.window_spans", "span": "step_view.span",
    "wall_s": "step_view.wall_s",
    # gpu_work
    "sync_stall_s": "gpu_work.sync_stall_s", "replays_cuda_graphs": "gpu_work.replays_cuda_graphs",
    "gpu_idle_share": "gpu_work.idle_share", "gpu_work_per_step_s": "gpu_work.per_step_s",
    # sites
    "loader": "sites.loader", "copies": "sites.copies", "syncs": "sites.syncs", "host_lines": "sites.host_lines",
    "backward_location": "sites.backward_location", "forward_location": "sites.forward_location",
    "forward_module": "sites.forward_module",
    # host
    "processes": "host.processes", "steady_processes": "host.steady_processes",
    "started_processes": "host.started_processes", "forks": "host.forks", "threads": "host.threads",
    "user_threads": "host.user_threads", "python_thread_ids": "host.python_thread_ids",
    "python_threads_sharing": "host.python_threads_sharing", "samples": "host.samples",
    "step_samples": "host.step_samples", "env": "host.env", "exit": "host.exit",
}


class RunNameMoved(DeprecationWarning):
    """A rule read a member of `Run` under the name it had before it moved to one of the run's views."""


class _Moved:
    """An old name of a member of `Run` (see MOVED): it reads the member where it lives now, and says where."""

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path, self.read = name, path, attrgetter(path)

    def __get__(self, run: Run | None, owner: type) -> Any:
        if run is None:
            return self
        warnings.warn(f"run.{self.name} is run.{self.path}: read it there (docs/custom-rules.md, "
                      "\"Names that moved\")", RunNameMoved, stacklevel=2)
        return self.read(run)


for _old, _path in MOVED.items():
    setattr(Run, _old, _Moved(_old, _path))


SampleRows = tuple[list[HostRow], list[ProcsRow], list[GpuRow]]
_SAMPLES = msgspec.msgpack.Decoder(SampleRows)


class _Samples:
    """A run's samples, one object for the runs of all its windows: the rows, and as msgpack (what a run pickles
    as: many times faster to load than pickled rows), each made from the other once, when first asked for. A job's
    rank with 40 windows pickled its samples 40 times over when each window's run encoded its own."""

    __slots__ = ("_packed", "_rows")

    def __init__(self, rows: SampleRows | None = None, packed: bytes | None = None) -> None:
        self._rows, self._packed = rows, packed

    def rows(self) -> SampleRows:
        if self._rows is None:
            assert self._packed is not None  # made from one or the other
            self._rows = _SAMPLES.decode(self._packed)
        return self._rows

    def packed(self) -> bytes:
        if self._packed is None:
            self._packed = msgspec.msgpack.encode(self._rows)
        return self._packed

    def __reduce__(self) -> tuple[type[_Samples], tuple[None, bytes]]:
        return _Samples, (None, self.packed())


def _unpickled(manifest: Manifest, whole: RunEvents, trace_path: Path | None, samples: _Samples, path: Path | None,
               window: int, trace_read: tuple[TraceData | None, str | None, BundleError | None] | None) -> Run:
    """A run pickled by `Run.__reduce__`."""
    run = Run(manifest, [], trace_path, [], [], [], path=path, window=window)
    run._whole, run._sampled = whole, samples
    if trace_read is not None:
        run.__dict__["_trace_read"] = trace_read  # the cached_property's value: the trace is not read again
    return run
