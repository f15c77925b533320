"""`BundleBuilder`: write a valid run bundle in a few lines, for rule tests (see `gpudoctor.testing`).

The builder keeps what it is told as typed values (gpudoctor.testing.spec), validating what a test gives
(gpudoctor.testing.given); the built_* modules turn them into the bundle's own records, written by the
bundle's own writers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

import gpudoctor.testing.given as given
from gpudoctor.analysis import Run
from gpudoctor.analysis.events import TRACED_WINDOW_STATES
from gpudoctor.bundle.events import (
    AnyEvent,
    ForkEvent,
    ForwardSiteEvent,
    LoaderEvent,
    Phases,
    ProcessStartEvent,
    ThreadStartEvent,
)
from gpudoctor.bundle.layout import TRACE
from gpudoctor.bundle.records import Site as SiteRecord
from gpudoctor.bundle.samples import GpuEntry
from gpudoctor.testing.built_events import events
from gpudoctor.testing.built_files import write_bundle
from gpudoctor.testing.sites import SITE_DEFAULT, Site
from gpudoctor.testing.spec import (
    DEFAULT_PID,
    DEFAULT_START,
    DEFAULT_STREAM,
    PROFILER_REASON,
    BundleSpec,
    ExitSpec,
    GiB,
    GpuOp,
    HostSpec,
    ProcessSpec,
    RuntimeCall,
    Settings,
    StepSpec,
)

_DEFAULT_LINES = {"loader": 40, "thread": 30, "fork": 40, "copy": 52, "sync": 58, "forward": 50}
_FIRST_LOADER_ID = 140_000_000_000  # id() of a DataLoader, as the recorder reports it


class BundleBuilder:
    """Writes a valid run bundle into `path` (created if needed); `build()` returns the `Run`.

    `window` is the profiling window (wait, warmup, active) in steps; active=None means "every step
    after wait and warmup". `script` names the profiled script (call sites default to lines in it), `args` its
    command-line arguments.
    """

    def __init__(self, path: Path | str, *, script: str = "train.py",
                 window: tuple[int, int, int | None] = (0, 0, None), start: float = DEFAULT_START,
                 pid: int = DEFAULT_PID, args: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.script = script
        self.args = tuple(args)
        self.wait, self.warmup, self.active = window
        self.start = start
        self.pid = pid
        self._spec = BundleSpec(self._settings())

    # -- steps -----------------------------------------------------------------------------------
    def step(self, wall_s: float = 0.1, data_wait_s: float = 0.0, *, forward_s: float | None = None,
             backward_s: float | None = None, optimizer_s: float | None = None, gpu_busy_s: float | None = None,
             kernels: int | None = None, kernel_name: str | Sequence[str] = "volta_sgemm_128x64_nn",
             warps_per_sm: float | None = None,
             gil: float | Mapping[str, float] | None = None, cuda_memory: dict[str, int] | None = None,
             batches: int = 1, source: str = "optimizer", window: str | None = None,
             copies: Iterable[Mapping[str, object]] = (), syncs: Iterable[Mapping[str, object]] = (),
             data_wait_cpu_s: float | None = None) -> int:
        """Add one step; returns its index.

        `gpu_busy_s` puts `kernels` kernels (default 1) of equal length in the trace, spread evenly over the
        part of the step after its data wait, so the step's GPU busy time is exactly `gpu_busy_s`, named
        `kernel_name` (several names: taken in turn); each kernel with `warps_per_sm` resident warps per SM (how
        much of the GPU it occupies) when given.
        `gil` is the GIL probe's mean wake-up delay (seconds) or its summary dict. `copies` and `syncs` are
        rows as the recorder writes them (see `copy()` and `sync()` for the keys). `data_wait_cpu_s` is the
        training thread's CPU time in the data wait (loading the batch itself, with no workers).
        """
        index = len(self._spec.steps)
        _check_step(index, wall_s, data_wait_s, gpu_busy_s)
        step = StepSpec(
            index, self._spec.steps[-1].end if self._spec.steps else self.start, wall_s, data_wait_s,
            window or self._window_of(index), batches, source,
            Phases(forward=forward_s or 0.0, backward=backward_s or 0.0, optimizer=optimizer_s or 0.0),
            given.gil_summary(gil, wall_s), given.cuda_memory(cuda_memory),
            [given.copy_row(c) for c in copies], [given.sync_row(s) for s in syncs], data_wait_cpu_s,
        )
        self._spec.steps.append(step)
        if gpu_busy_s and step.window in TRACED_WINDOW_STATES:  # the profiler records its window's steps only
            self._spread_kernels(step, gpu_busy_s, kernels or 1, kernel_name, warps_per_sm)
        return index

    def steps(self, n: int, **fields: Any) -> list[int]:
        """Add `n` steps with the same fields; a field given as a callable is called with 0..n-1."""
        return [self.step(**{k: (v(i) if callable(v) else v) for k, v in fields.items()}) for i in range(n)]

    def _window_of(self, index: int) -> str:
        if index < self.wait:
            return "waiting"
        if index < self.wait + self.warmup:
            return "warmup"
        if self.active is None or index < self.wait + self.warmup + self.active:
            return "active"
        return "closed"

    def _spread_kernels(self, step: StepSpec, busy_s: float, count: int, names: str | Sequence[str],
                        warps_per_sm: float | None) -> None:
        begin = step.start + step.data_wait_s
        room = step.end - begin
        if busy_s > room:  # the kernels cannot all follow the data wait: end them with the step
            begin, room = step.end - busy_s, busy_s
        duration = busy_s / count
        turn = [names] if isinstance(names, str) else list(names)
        for k in range(count):
            self._spec.ops.append(GpuOp("kernel", turn[k % len(turn)], begin + k * room / count, duration, 0,
                                        DEFAULT_STREAM, None, warps_per_sm))

    # -- instrumentation events ------------------------------------------------------------------
    def loader(self, num_workers: int = 0, pin_memory: bool = False, batch_size: int | None = 32, *,
               site: Site = SITE_DEFAULT, prefetch_factor: int | None = None, persistent_workers: bool = False,
               drop_last: bool = False, dataset: str = "Dataset", dataset_len: int | None = None,
               start_method: str | None = None, sampler: str | None = "SequentialSampler") -> BundleBuilder:
        """A DataLoader the script iterated (the first one is `run.sites.loader.main`)."""
        self._spec.loaders.append(LoaderEvent(
            loader_id=_FIRST_LOADER_ID + len(self._spec.loaders), site=self._site(site, "loader"),
            num_workers=num_workers, pin_memory=pin_memory, batch_size=batch_size,
            prefetch_factor=prefetch_factor if prefetch_factor is not None or not num_workers else 2,  # torch's default
            persistent_workers=persistent_workers, drop_last=drop_last, dataset=dataset, dataset_len=dataset_len,
            start_method=start_method, sampler=sampler,
        ))
        return self

    def copy(self, direction: str = "h2d", pinned: bool | None = False, non_blocking: bool = False, *,
             bytes: int = 4 * 1024 * 1024, host_s: float = 0.001, count: int = 1, max_s: float | None = None,
             site: Site = SITE_DEFAULT, step: int | None = None) -> BundleBuilder:
        """Host<->device copies from one call site, per step: in step `step`, or (None) in every window step."""
        row = given.copy_row({"direction": direction, "pinned": pinned, "non_blocking": non_blocking, "bytes": bytes,
                              "host_s": host_s, "count": count, "max_s": max_s, "site": self._site(site, "copy")})
        self._spec.copies.append((step, row))
        return self

    def sync(self, kind: str = "item", *, host_s: float = 0.001, count: int = 1, max_s: float | None = None,
             site: Site = SITE_DEFAULT, step: int | None = None, via: str | None = None) -> BundleBuilder:
        """Synchronizing calls (item, tolist, bool, float, int, print, synchronize, empty_cache) from one
        call site, per step: in step `step`, or (None) in every window step. `via` names the library module
        that made them for that line."""
        row = given.sync_row({"kind": kind, "host_s": host_s, "count": count, "max_s": max_s,
                              "site": self._site(site, "sync"), "via": via})
        self._spec.syncs.append((step, row))
        return self

    def fork(self, cuda_initialized: bool = True, start_method: str | None = None, dataloader_worker: bool = True, *,
             count: int = 1, site: Site = SITE_DEFAULT, t: float | None = None) -> BundleBuilder:
        """`count` forks of the script's process (DataLoader workers by default), before the first step."""
        fork = ForkEvent(parent_pid=self.pid, cuda_initialized=cuda_initialized, start_method=start_method,
                         site=self._site(site, "fork"), dataloader_worker=dataloader_worker, t=t)
        self._spec.forks += [fork] * count
        return self

    def started_process(self, pid: int | None, target: str | None = "train", start_method: str | None = "spawn", *,
                        dataloader_worker: bool = False, site: Site = SITE_DEFAULT) -> BundleBuilder:
        """A process the script started through multiprocessing; `pid` is one given to `process` (its samples),
        or one never sampled."""
        self._spec.started.append(ProcessStartEvent(pid=pid, start_method=start_method, target=target,
                                                    module="__main__", site=self._site(site, "fork"),
                                                    dataloader_worker=dataloader_worker))
        return self

    def forward_site(self, module: str = "Model", *, site: Site = SITE_DEFAULT) -> BundleBuilder:
        """Where the script calls its outermost model, and that model's class ("OptimizedModule": compiled)."""
        self._spec.forward_sites.append(ForwardSiteEvent(module=module, site=self._site(site, "forward")))
        return self

    def thread(self, name: str = "Thread-1", target: str | None = "worker", *, module: str | None = "__main__",
               daemon: bool = False, site: Site = SITE_DEFAULT, native_id: int | None = None) -> BundleBuilder:
        """A thread the script started (module "torch..." or "multiprocessing..." marks a library's thread).

        `native_id` is its OS thread id: in the main process's samples (see `process`), thread i of
        `thread_cores` has id `pid * 100 + i` (thread 0, the main thread, has id `pid`)."""
        self._spec.threads.append(ThreadStartEvent(name=name, daemon=daemon, native_id=native_id, target=target,
                                                   module=module, site=self._site(site, "thread")))
        return self

    def event(self, *records: AnyEvent) -> BundleBuilder:
        """Events written as given (after the steps, before the end): what the recorder writes of an optimizer, a
        pause, the start-up, a compilation, the losses (`gpudoctor.bundle.events`). One without a time `t` gets the
        last step's end."""
        t = self._spec.steps[-1].end if self._spec.steps else self.start
        self._spec.recorded.extend(r if r.t is not None else msgspec.structs.replace(r, t=t) for r in records)
        return self

    def exit(self, ending: str = "completed", status: int = 0, *, exception: str | None = None,
             message: str | None = None, where: Site = None) -> BundleBuilder:
        """How the script ended (manifest `exit`, and the script's `end` event)."""
        self._spec.exit = ExitSpec(ending, status, exception, message, given.to_site(where))
        return self

    def _site(self, site: Site, kind: str) -> SiteRecord | None:
        if site is SITE_DEFAULT:
            return SiteRecord(file=self.script, line=_DEFAULT_LINES[kind], function="main")
        return given.to_site(site)

    # -- samples ---------------------------------------------------------------------------------
    def process(self, cores: float | None = None, *, name: str = "python", thread_cores: Sequence[float] | None = None,
                threads: int | None = None, rss: int = 2 * GiB, ctx_invol_per_s: float = 10.0,
                ctx_vol_per_s: float = 100.0, ppid: int | None = None, run_delay_share: float | None = 0.0,
                gpu: bool | None = False, thread_run_delay: Sequence[float] = ()) -> int:
        """A process of the script's tree, sampled at a steady rate; the first one added is the script's
        main process, later ones are its children unless `ppid` says otherwise. Returns its pid.

        `cores` is its CPU use; `thread_cores` splits it by thread (default: one thread using `cores`);
        `run_delay_share` the share of the time its main thread waits for a core (None: not measured);
        `thread_run_delay` each thread's, in the order of `thread_cores` (empty: not kept);
        `gpu` whether it holds a GPU's device file open (None: not looked at).
        """
        split = tuple(thread_cores) if thread_cores is not None else (1.0 if cores is None else cores,)
        processes = self._spec.processes
        pid = self.pid + len(processes) * 10
        parent = ppid if ppid is not None else (self.pid - 1 if not processes else self.pid)
        processes.append(ProcessSpec(pid, parent, name, split, threads if threads is not None else len(split), rss,
                                     ctx_invol_per_s, ctx_vol_per_s, run_delay_share, gpu,
                                     tuple(thread_run_delay)))
        return pid

    def workers(self, n: int, cores: float = 1.0, **kwargs: Any) -> list[int]:
        """`n` DataLoader worker processes (children of the main process), each using `cores`."""
        if not self._spec.processes:
            self.process()
        return [self.process(cores, name="pt_data_worker", **kwargs) for _ in range(n)]

    def host_samples(self, other_cores: float = 0.0, *, tree_cores: float | None = None,
                     busy_cores: float | None = None, swap_in_bps: float = 0.0, swap_out_bps: float = 0.0,
                     swap_used: int = 0, mem_available: int | None = None, load1: float | None = None,
                     interval_s: float = 0.1, cpu_pressure: float | None = 0.0,
                     throttled: float | None = 0.0) -> BundleBuilder:
        """The host, sampled every `interval_s` over the run: the script's tree uses `tree_cores` (or what
        its `process()`es use), other programs `other_cores`, so the host is `busy_cores` busy (by default
        their sum); swap traffic in bytes per second; `mem_available` in bytes (default 80% of memory);
        `cpu_pressure` and `throttled`, seconds per second the host's tasks waited for a core and the script's
        cgroup was held back by its CPU limit (None: not readable)."""
        self._spec.host = HostSpec(other_cores, tree_cores, busy_cores, swap_in_bps, swap_out_bps, swap_used,
                                   mem_available, load1, interval_s, cpu_pressure, throttled)
        return self

    def gpu_samples(self, util: float | None = None, *, gpu: int = 0, mem_used: int | None = None,
                    mem_util: float | None = None, sm_mhz: float | None = None, power_w: float | None = None,
                    pcie_rx_kbs: float | None = None, pcie_tx_kbs: float | None = None,
                    interval_s: float = 0.1) -> BundleBuilder:
        """NVML samples of one GPU over the run; fields left None are left out, as NVML leaves them out."""
        self._spec.gpus[gpu] = GpuEntry(gpu=gpu, util=util, mem_util=mem_util, mem_used=mem_used, sm_mhz=sm_mhz,
                                        power_w=power_w, pcie_tx_kbs=pcie_tx_kbs, pcie_rx_kbs=pcie_rx_kbs)
        self._spec.gpu_interval_s = interval_s
        return self

    def sample_rows(self, kind: str, rows: Iterable[Mapping[str, object]]) -> BundleBuilder:
        """Raw sample lines for samples/{host,procs,gpu}.jsonl, in the samplers' format, instead of generated ones."""
        self._spec.raw[kind] = given.sample_rows(kind, rows)
        return self

    # -- the trace -------------------------------------------------------------------------------
    def kernels(self, ops: Iterable[Mapping[str, object] | tuple[object, ...]]) -> BundleBuilder:
        """GPU activity in the trace. Each op is a dict, or a tuple (step, at, dur[, name]):

        step: the step it runs in; at: seconds from that step's start (or "start": seconds since the
        epoch, instead of step and at); dur: seconds; name; kind: kernel | memcpy | memset;
        device (0); stream (7); bytes (memcpy, memset); warps_per_sm (a kernel's resident warps per SM).
        """
        for op in map(given.op_spec, ops):
            start = self._time(op.step, op.at, op.start)
            name = op.name or given.OP_NAMES[op.kind]
            self._spec.ops.append(GpuOp(op.kind, name, start, op.dur, op.device, op.stream, op.bytes,
                                        op.warps_per_sm))
        return self

    def cuda_call(self, name: str = "cudaStreamSynchronize", *, step: int | None = None, at: float = 0.0,
                  dur: float = 0.001, start: float | None = None) -> BundleBuilder:
        """A CUDA runtime call on the host in the trace (a synchronize, a cudaMemcpy, a launch, ...)."""
        self._spec.runtime.append(RuntimeCall(name, self._time(step, at, start), dur))
        return self

    def without_trace(self, reason: str = PROFILER_REASON) -> BundleBuilder:
        """No trace.json.gz, as when the profiler failed; the manifest says why."""
        self._spec.trace_refused, self._spec.profiler_reason = True, reason
        return self

    def _time(self, step: int | None, at: float, start: float | None) -> float:
        if start is not None:
            return float(start)
        if step is None or not 0 <= step < len(self._spec.steps):
            raise ValueError(f"step {step!r} does not exist yet: add the steps first, then what runs in them")
        return self._spec.steps[step].start + float(at)

    # -- the environment -------------------------------------------------------------------------
    def env(self, **facts: Any) -> BundleBuilder:
        """Where the script ran: cores (available to it), cpu_count (the host's; default cores), affinity,
        memory_total, gil_enabled, start_method, intra_op_threads, inter_op_threads, python, torch,
        cuda_build, driver, gpus (NVML descriptions), cuda_device (torch's, in the window), cuda_initialized,
        switch_interval_s, ranks_on_host (a job's rank: the ranks that share its host), frameworks ("lightning",
        "transformers" for its Trainer, "accelerate")."""
        self._spec.env = given.with_env(self._spec.env, facts)
        return self

    # -- writing ---------------------------------------------------------------------------------
    def write(self) -> Path:
        """Write the bundle and return its directory."""
        write_bundle(self._current())
        return self.path

    def build(self, *, trace_only: bool = False) -> Run:
        """Write the bundle and load it with the real loader: `Run.from_bundle` (or, with trace_only,
        `Run.from_trace` on its trace, as `gpudoctor analyze trace.json.gz` would)."""
        path = self.write()
        if trace_only:
            if not self._spec.writes_trace:
                raise ValueError("this bundle has no trace: add steps in the window, and do not call without_trace()")
            return Run.from_trace(path / TRACE)
        return Run.from_bundle(path)

    def _events(self) -> list[AnyEvent]:
        """The records of events.jsonl, as `write()` writes them."""
        return events(self._current())

    def _settings(self) -> Settings:
        return Settings(self.path, self.script, self.wait, self.warmup, self.active, self.start, self.pid, self.args)

    def _current(self) -> BundleSpec:
        """What the builder was told, with its attributes as they are now."""
        return replace(self._spec, settings=self._settings())


def _check_step(index: int, wall_s: float, data_wait_s: float, gpu_busy_s: float | None) -> None:
    if wall_s <= 0 or data_wait_s < 0 or data_wait_s > wall_s:
        raise ValueError(f"step {index}: need 0 <= data_wait_s ({data_wait_s}) <= wall_s ({wall_s}), wall_s > 0")
    if gpu_busy_s is not None and not 0 <= gpu_busy_s <= wall_s:
        raise ValueError(f"step {index}: gpu_busy_s ({gpu_busy_s}) must lie between 0 and wall_s ({wall_s})")
