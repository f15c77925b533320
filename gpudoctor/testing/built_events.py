"""events.jsonl of a built bundle: the records the recorder writes from inside the script's process.

Before the first step come the process and torch facts, the threads, the loaders and the forks (each a
millisecond after the previous one); then the steps, with the window's opening and closing around them; last
the `end` event, unless the script's process was killed.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from gpudoctor.bundle.events import (
    AnyEvent,
    CollectorEvent,
    EndEvent,
    EnvWindowEvent,
    ForkEvent,
    ForwardSiteEvent,
    LoaderEvent,
    ProcessEvent,
    ProcessFacts,
    ProcessStartEvent,
    StepEvent,
    StepSourceEvent,
    ThreadStartEvent,
    TorchEvent,
    TorchFacts,
    WindowEvent,
    WindowFacts,
)
from gpudoctor.bundle.layout import TRACE
from gpudoctor.testing.spec import H100, H100_MEMORY, BundleSpec, GiB, StepSpec

Timed = TypeVar("Timed", ThreadStartEvent, LoaderEvent, ForkEvent, ProcessStartEvent, ForwardSiteEvent)
KILLED = ("signal", "timeout")  # endings whose process wrote no end event
EXPORT_S = 0.05  # how long the closing window took to write its trace


def events(spec: BundleSpec) -> list[AnyEvent]:
    t0 = spec.t0
    out: list[AnyEvent] = [
        ProcessEvent(**msgspec.structs.asdict(process_facts(spec)), t=t0 - 3.0),
        TorchEvent(**msgspec.structs.asdict(torch_facts(spec)), t=t0 - 2.5),
    ]
    out += _timed(spec.threads, t0 - 2.0)
    out += _timed(spec.loaders, t0 - 1.5)
    out += _timed(spec.forks, t0 - 1.0)
    out += _timed(spec.started, t0 - 0.5)
    out += _timed(spec.forward_sites, t0 - 0.4)
    if spec.steps:
        out.append(StepSourceEvent(source=spec.steps[0].source, at_step=0, t=t0))
    out += _step_and_window_events(spec)
    out += spec.recorded
    if spec.exit.ending not in KILLED:
        out.append(_end_event(spec))
    return out


def _timed(records: list[Timed], first_t: float) -> list[Timed]:
    """Records without a time get one, a millisecond apart from `first_t`."""
    return [r if r.t is not None else msgspec.structs.replace(r, t=first_t + i * 1e-3) for i, r in enumerate(records)]


def _step_and_window_events(spec: BundleSpec) -> list[AnyEvent]:
    first = spec.first_window_step
    out: list[AnyEvent] = []
    for s in spec.steps:
        if s.index == first:
            out.append(WindowEvent(state="opened", index=0, first_step=first, cuda=spec.has_gpu, trace=TRACE,
                                   t=s.start))
            out.append(EnvWindowEvent(**msgspec.structs.asdict(window_facts(spec)), t=s.start))
        out.append(step_event(spec, s))
    window = [s for s in spec.steps if s.in_window]
    if window:
        out.append(_window_end(spec, first, window[-1].end))
    return out


def _window_end(spec: BundleSpec, first: int | None, t: float) -> WindowEvent | CollectorEvent:
    """The window closed, its trace written; or, without a trace, the profiler's failure."""
    if spec.writes_trace:
        return WindowEvent(state="closed", index=0, first_step=first, export_s=EXPORT_S, trace_bytes=0, trace=TRACE,
                           t=t)
    return CollectorEvent(name="profiler", ok=False, reason=spec.profiler_reason, t=t)


def step_event(spec: BundleSpec, s: StepSpec) -> StepEvent:
    """A step; only warm-up and active steps carry phases, copies, syncs, GIL and CUDA memory."""
    event = StepEvent(step=s.index, t0=s.start, t1=s.end, wall_s=s.wall_s, data_wait_s=s.data_wait_s,
                      data_wait_cpu_s=s.data_wait_cpu_s, batches=s.batches, source=s.source, window=s.window, t=s.end)
    if not s.in_window:
        return event
    return msgspec.structs.replace(event, phases=s.phases, copies=spec.copies_of(s), syncs=spec.syncs_of(s), gil=s.gil,
                                   cuda_memory=s.cuda_memory)


def _end_event(spec: BundleSpec) -> EndEvent:
    x = spec.exit
    t = spec.steps[-1].end + 0.01 if spec.steps else spec.t0
    end = EndEvent(reason=x.ending, steps=len(spec.steps), pid=spec.settings.pid, t=t)
    if x.exception:
        end = msgspec.structs.replace(end, exception=x.exception, message=x.message or "", where=x.where)
    return end


# -- facts the manifest keeps too ------------------------------------------------------------------------
def process_facts(spec: BundleSpec) -> ProcessFacts:
    e, pid = spec.env, spec.settings.pid
    return ProcessFacts(
        pid=pid, python=e.python, implementation="CPython", executable="/usr/bin/python3", gil_enabled=e.gil_enabled,
        cpu_count=spec.cpu_count, affinity=spec.affinity, start_method=e.start_method,
        switch_interval_s=e.switch_interval_s, main_native_id=pid, local_world_size=e.ranks_on_host,
    )


def torch_facts(spec: BundleSpec) -> TorchFacts:
    e = spec.env
    return TorchFacts(version=e.torch, cuda_build=e.cuda_build, cuda_built=e.cuda_build is not None)


def window_facts(spec: BundleSpec) -> WindowFacts:
    """torch's threads (default: one per core) and, once CUDA is initialized, its device (default: an H100)."""
    e = spec.env
    initialized = e.cuda_initialized if e.cuda_initialized is not None else spec.has_gpu
    device = e.cuda_device or msgspec.structs.replace(H100, free_memory=H100_MEMORY - 4 * GiB)
    return WindowFacts(
        intra_op_threads=e.intra_op_threads if e.intra_op_threads is not None else e.cores,
        inter_op_threads=e.inter_op_threads if e.inter_op_threads is not None else e.cores,
        cuda_initialized=initialized, cuda_device=device if initialized else None, frameworks=e.frameworks,
    )
