"""`HostView`: the host side of one profiling window of a run, built once: the script's processes and threads, what
it forked and started, the host's and GPUs' samples, and the machine it ran on."""

from __future__ import annotations

from functools import cached_property

from gpudoctor.analysis.cpu_wait import CpuWait, cpu_wait
from gpudoctor.analysis.events import EventsOf
from gpudoctor.analysis.gpu_memory import OutOfMemory, out_of_memory
from gpudoctor.analysis.samples import around, gpu_series, host_series, main_thread_cpu_rate, process_infos, within
from gpudoctor.analysis.step_view import StepView
from gpudoctor.analysis.threads import python_threads_sharing
from gpudoctor.analysis.timebase import paced_steps
from gpudoctor.analysis.views import (
    Env,
    Exit,
    ForkInfo,
    Location,
    ProcessInfo,
    Samples,
    SeriesPoint,
    StartedProcess,
    Step,
    ThreadInfo,
)
from gpudoctor.bundle.events import (
    ForkEvent,
    OomEvent,
    ProcessFacts,
    ProcessStartEvent,
    ThreadStartEvent,
    TorchFacts,
    WindowFacts,
)
from gpudoctor.bundle.manifest import ExceptionInfo, ExitInfo, Manifest
from gpudoctor.bundle.samples import GpuRow, HostRow, ProcsRow


class HostView:
    """The host side of a window: `events` gives its events of a kind, `steps` its steps (the process figures are
    over the analysed steps), the samples are the whole run's."""

    def __init__(self, manifest: Manifest, events: EventsOf, steps: StepView, host_samples: list[HostRow],
                 proc_samples: list[ProcsRow], gpu_samples: list[GpuRow]) -> None:
        self.manifest, self._events, self._steps = manifest, events, steps
        self._host_samples, self._proc_samples, self._gpu_samples = host_samples, proc_samples, gpu_samples

    # -- processes -------------------------------------------------------------------------------
    @cached_property
    def processes(self) -> list[ProcessInfo]:
        """The script's process tree over the analysed steps (over the whole run if no step was seen)."""
        return process_infos(within(self._proc_samples, self._steps.span, margin=0.5))

    @cached_property
    def steady_processes(self) -> list[ProcessInfo]:
        """The script's process tree over the steady steps (every step after start-up): the input-pipeline rules
        compare it with the data wait they measure over those steps. A short window may catch the loader's
        workers idle, ahead of the step, while they cannot keep up later on."""
        steps = self._steps.steady_steps
        if not steps:
            return self.processes
        return process_infos(within(self._proc_samples, (steps[0].start, steps[-1].end), margin=0.5)) or self.processes

    @cached_property
    def cpu_wait(self) -> CpuWait:
        """How long the threads that feed the GPU waited for a core over the steady steps, and the host's CPU
        pressure and throttling (analysis.cpu_wait)."""
        steps = self._steps.steady_steps
        span = (steps[0].start, steps[-1].end) if steps else self._steps.span
        return cpu_wait(self.steady_processes, self.threads, self.process_facts.main_native_id,
                        self._host_samples, span)

    @cached_property
    def main_thread_cpu_s(self) -> float | None:
        """The CPU seconds the script's main thread spent per step, over the steps the run's pace is the mean of
        (analysis.timebase.paced_steps), so that it compares with the step at that pace: over every step after
        start-up, the profiled steps and the window's export made it longer than the step (checkpoint_stall.py on
        2 cores: 25 ms of CPU in a 23 ms step). None without the main thread's samples. The least a host-bound
        step needs once nothing else takes its cores: what it computes, not the time it waited for a core."""
        steps = paced_steps(self._steps)
        spans = _contiguous_spans(steps)
        rate = main_thread_cpu_rate(self._proc_samples, self.process_facts.main_native_id, spans)
        if rate is None:
            return None
        return rate * sum(end - start for start, end in spans) / len(steps)

    @cached_property
    def started_processes(self) -> list[StartedProcess]:
        """The processes the script started through multiprocessing, DataLoader workers left out: gpudoctor
        profiles the script's own process, and their steps are not in its report."""
        sampled = {p.pid: p for p in process_infos(self._proc_samples)}
        started = []
        for event in self._events(ProcessStartEvent):
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
    def forks(self) -> list[ForkInfo]:
        return [ForkInfo(e.t or 0.0, e.cuda_initialized, e.start_method, e.dataloader_worker,
                         Location.from_site(e.site))
                for e in self._events(ForkEvent)]

    # -- threads ---------------------------------------------------------------------------------
    @cached_property
    def threads(self) -> list[ThreadInfo]:
        return [ThreadInfo(e.name, e.target, e.module, e.daemon, Location.from_site(e.site), e.native_id)
                for e in self._events(ThreadStartEvent)]

    @property
    def user_threads(self) -> list[ThreadInfo]:
        return [t for t in self.threads if not t.is_library]

    @property
    def python_thread_ids(self) -> set[int] | None:
        """OS ids of the script's Python threads (the main one and those it started); None if not recorded."""
        main = self.process_facts.main_native_id
        if main is None:
            return None
        return {main} | {t.native_id for t in self.threads if t.native_id is not None}

    @property
    def work_thread_ids(self) -> set[int] | None:
        """OS ids of the Python threads that run the script's own work: the main one and those the script started,
        not the threads torch, multiprocessing or gpudoctor start for themselves (the DataLoader's pin-memory
        thread, whose copies run beside the step, its queues' feeders); None if not recorded."""
        main = self.process_facts.main_native_id
        if main is None:
            return None
        return {main} | {t.native_id for t in self.user_threads if t.native_id is not None}

    @cached_property
    def python_threads_sharing(self) -> int | None:
        """The script's own Python threads taking turns on the main process's work (analysis.threads): a pinned
        loader's pin-memory thread is not one; None when not recorded."""
        return python_threads_sharing(self.processes, self.work_thread_ids)

    # -- samples ---------------------------------------------------------------------------------
    @cached_property
    def samples(self) -> Samples:
        """Host and GPU series over the whole run."""
        return Samples(host=host_series(self._host_samples, self._proc_samples), gpu=gpu_series(self._gpu_samples))

    @cached_property
    def step_samples(self) -> Samples:
        """Host and GPU series over the analysed steps only."""
        span = self._steps.span
        if span is None:
            return self.samples

        def keep(points: list[SeriesPoint]) -> list[SeriesPoint]:
            return [points[i] for i in around([p.t for p in points], span[0] - 0.5, span[1] + 0.5)]

        return Samples(host=keep(self.samples.host), gpu={d: keep(ps) for d, ps in self.samples.gpu.items()})

    @property
    def proc_samples(self) -> list[ProcsRow]:
        """The script's process tree as sampled over the whole run."""
        return self._proc_samples

    # -- the machine and the ending --------------------------------------------------------------
    @cached_property
    def process_facts(self) -> ProcessFacts:
        return self.manifest.child.process or ProcessFacts()

    @cached_property
    def env(self) -> Env:
        manifest, process = self.manifest, self.process_facts
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

    @cached_property
    def out_of_memory(self) -> OutOfMemory | None:
        """Where the GPU's memory was when CUDA ran out of it and ended the script; None when it did not."""
        return out_of_memory(self._events(OomEvent))


def _contiguous_spans(steps: list[Step]) -> list[tuple[float, float]]:
    """The spans of the runs of consecutive steps (by index): from the first one's start to the last one's end."""
    spans: list[tuple[float, float]] = []
    last: int | None = None
    for step in steps:
        if spans and last is not None and step.index == last + 1:
            spans[-1] = (spans[-1][0], step.end)
        else:
            spans.append((step.start, step.end))
        last = step.index
    return spans
