"""`BundleBuilder`: write a valid run bundle in a few lines, for rule tests (see `gpudoctor.testing`)."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor import __version__
from gpudoctor import bundle as bundle_io
from gpudoctor.analysis import Run
from gpudoctor.testing.sites import SITE_DEFAULT, Site, site_dict


GiB = 1024 ** 3
DEFAULT_START = 1_000_000.0  # the first step's start, in seconds since the epoch: small, so times keep full precision
DEFAULT_PID = 4242
DEFAULT_STREAM = 7
H100 = {"name": "NVIDIA H100 80GB HBM3", "total_memory": 85_520_809_984, "capability": "9.0", "multiprocessors": 132}
_DEFAULT_LINES = {"loader": 40, "thread": 30, "fork": 40, "copy": 52, "sync": 58}
_WINDOW_STATES = ("warmup", "active")


# -- the builder -----------------------------------------------------------------------------------
@dataclass
class _Step:
    index: int
    start: float
    wall_s: float
    data_wait_s: float
    window: str
    batches: int
    source: str
    phases: dict[str, float]
    gil: dict[str, Any] | None
    cuda_memory: dict[str, int] | None
    copies: list[dict[str, Any]] = field(default_factory=list)
    syncs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.start + self.wall_s

    @property
    def in_window(self) -> bool:
        return self.window in _WINDOW_STATES


@dataclass
class _Process:
    pid: int
    ppid: int
    name: str
    thread_cores: list[float]
    threads: int
    rss: int
    ctx_invol_per_s: float
    ctx_vol_per_s: float

    @property
    def cores(self) -> float:
        return sum(self.thread_cores)


@dataclass
class _GpuOp:
    kind: str  # kernel | memcpy | memset
    name: str
    start: float
    dur: float
    device: int
    stream: int
    bytes: int | None


class BundleBuilder:
    """Writes a valid run bundle into `path` (created if needed); `build()` returns the `Run`.

    `window` is the profiling window (wait, warmup, active) in steps; active=None means "every step
    after wait and warmup". `script` names the profiled script (call sites default to lines in it).
    """

    def __init__(self, path: Path | str, *, script: str = "train.py", window: tuple[int, int, int | None] = (0, 0, None),
                 start: float = DEFAULT_START, pid: int = DEFAULT_PID) -> None:
        self.path = Path(path)
        self.script = script
        self.wait, self.warmup, self.active = window
        self.start = start
        self.pid = pid
        self._steps: list[_Step] = []
        self._loaders: list[dict[str, Any]] = []
        self._copies: list[tuple[int | None, dict[str, Any]]] = []
        self._syncs: list[tuple[int | None, dict[str, Any]]] = []
        self._forks: list[dict[str, Any]] = []
        self._threads: list[dict[str, Any]] = []
        self._processes: list[_Process] = []
        self._host: dict[str, Any] | None = None
        self._gpu_samples: dict[int, dict[str, Any]] = {}
        self._gpu_interval_s = 0.1
        self._ops: list[_GpuOp] = []
        self._runtime: list[tuple[str, float, float]] = []
        self._raw: dict[str, list[dict[str, Any]]] = {}
        self._trace_wanted: bool | None = None
        self._profiler_reason = "the script ended before the profiling window could write its trace"
        self._exit: dict[str, Any] = {"ending": "completed", "status": 0}
        self._env: dict[str, Any] = {
            "cores": 8, "cpu_count": None, "affinity": None, "memory_total": 64 * GiB, "gil_enabled": True,
            "start_method": None, "intra_op_threads": None, "inter_op_threads": None, "python": "3.11.7",
            "torch": "2.5.1+cu124", "cuda_build": "12.4", "driver": None, "gpus": None, "cuda_device": None,
            "cuda_initialized": None, "switch_interval_s": 0.005,
        }

    # -- steps -----------------------------------------------------------------------------------
    def step(self, wall_s: float = 0.1, data_wait_s: float = 0.0, *, forward_s: float | None = None,
             backward_s: float | None = None, optimizer_s: float | None = None, gpu_busy_s: float | None = None,
             kernels: int | None = None, kernel_name: str = "volta_sgemm_128x64_nn", gil: float | dict | None = None,
             cuda_memory: dict[str, int] | None = None, batches: int = 1, source: str = "optimizer",
             window: str | None = None, copies: Iterable[dict[str, Any]] = (),
             syncs: Iterable[dict[str, Any]] = ()) -> int:
        """Add one step; returns its index.

        `gpu_busy_s` puts `kernels` kernels (default 1) of equal length in the trace, spread evenly over the
        part of the step after its data wait, so the step's GPU busy time is exactly `gpu_busy_s`.
        `gil` is the GIL probe's mean wake-up delay (seconds) or its summary dict. `copies` and `syncs` are
        rows as the recorder writes them (see `copy()` and `sync()` for the keys).
        """
        if wall_s <= 0 or data_wait_s < 0 or data_wait_s > wall_s:
            raise ValueError(f"step {len(self._steps)}: need 0 <= data_wait_s ({data_wait_s}) <= wall_s ({wall_s}), wall_s > 0")
        if gpu_busy_s is not None and not 0 <= gpu_busy_s <= wall_s:
            raise ValueError(f"step {len(self._steps)}: gpu_busy_s ({gpu_busy_s}) must lie between 0 and wall_s ({wall_s})")
        index = len(self._steps)
        start = self._steps[-1].end if self._steps else self.start
        phases = {"forward": forward_s or 0.0, "backward": backward_s or 0.0, "optimizer": optimizer_s or 0.0}
        step = _Step(index, start, wall_s, data_wait_s, window or self._window_of(index), batches, source, phases,
                     _gil_summary(gil, wall_s), cuda_memory, [_copy_row(**c) for c in copies],
                     [_sync_row(**s) for s in syncs])
        self._steps.append(step)
        if gpu_busy_s:
            self._spread_kernels(step, gpu_busy_s, kernels or 1, kernel_name)
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

    def _spread_kernels(self, step: _Step, busy_s: float, count: int, name: str) -> None:
        begin = step.start + step.data_wait_s
        room = step.end - begin
        if busy_s > room:  # the kernels cannot all follow the data wait: end them with the step
            begin, room = step.end - busy_s, busy_s
        for k in range(count):
            self._ops.append(_GpuOp("kernel", name, begin + k * room / count, busy_s / count, 0, DEFAULT_STREAM, None))

    # -- instrumentation events ------------------------------------------------------------------
    def loader(self, num_workers: int = 0, pin_memory: bool = False, batch_size: int | None = 32, *,
               site: Site = SITE_DEFAULT, prefetch_factor: int | None = None, persistent_workers: bool = False,
               drop_last: bool = False, dataset: str = "Dataset", dataset_len: int | None = None,
               start_method: str | None = None) -> BundleBuilder:
        """A DataLoader the script iterated (the first one is `run.loader.main`)."""
        self._loaders.append({
            "kind": "loader", "loader_id": 140_000_000_000 + len(self._loaders), "site": self._site(site, "loader"),
            "num_workers": num_workers, "pin_memory": pin_memory, "batch_size": batch_size,
            "prefetch_factor": prefetch_factor if prefetch_factor is not None or not num_workers else 2,
            "persistent_workers": persistent_workers, "drop_last": drop_last, "dataset": dataset,
            "dataset_len": dataset_len, "start_method": start_method,
        })
        return self

    def copy(self, direction: str = "h2d", pinned: bool | None = False, non_blocking: bool = False, *,
             bytes: int = 4 * 1024 * 1024, host_s: float = 0.001, count: int = 1, max_s: float | None = None,
             site: Site = SITE_DEFAULT, step: int | None = None) -> BundleBuilder:
        """Host<->device copies from one call site, per step: in step `step`, or (None) in every window step."""
        row = _copy_row(direction, pinned, non_blocking, bytes, host_s, count, max_s, self._site(site, "copy"))
        self._copies.append((step, row))
        return self

    def sync(self, kind: str = "item", *, host_s: float = 0.001, count: int = 1, max_s: float | None = None,
             site: Site = SITE_DEFAULT, step: int | None = None) -> BundleBuilder:
        """Synchronizing calls (item, tolist, bool, float, int, print, synchronize, empty_cache) from one
        call site, per step: in step `step`, or (None) in every window step."""
        self._syncs.append((step, _sync_row(kind, host_s, count, max_s, self._site(site, "sync"))))
        return self

    def fork(self, cuda_initialized: bool = True, start_method: str | None = None, dataloader_worker: bool = True, *,
             count: int = 1, site: Site = SITE_DEFAULT, t: float | None = None) -> BundleBuilder:
        """`count` forks of the script's process (DataLoader workers by default), before the first step."""
        for _ in range(count):
            self._forks.append({
                "kind": "fork", "parent_pid": self.pid, "cuda_initialized": cuda_initialized,
                "start_method": start_method, "site": self._site(site, "fork"),
                "dataloader_worker": dataloader_worker, "t": t,
            })
        return self

    def thread(self, name: str = "Thread-1", target: str | None = "worker", *, module: str | None = "__main__",
               daemon: bool = False, site: Site = SITE_DEFAULT, native_id: int | None = None) -> BundleBuilder:
        """A thread the script started (module "torch..." or "multiprocessing..." marks a library's thread).

        `native_id` is its OS thread id: in the main process's samples (see `process`), thread i of
        `thread_cores` has id `pid * 100 + i` (thread 0, the main thread, has id `pid`)."""
        self._threads.append({"kind": "thread_start", "name": name, "daemon": daemon, "target": target,
                              "module": module, "site": self._site(site, "thread"), "native_id": native_id})
        return self

    def exit(self, ending: str = "completed", status: int = 0, *, exception: str | None = None,
             message: str | None = None, where: Site = None) -> BundleBuilder:
        """How the script ended (manifest `exit`, and the script's `end` event)."""
        self._exit = {"ending": ending, "status": status, "exception": exception, "message": message,
                      "where": site_dict(where)}
        return self

    def _site(self, site: Site, kind: str) -> dict[str, Any] | None:
        if site is SITE_DEFAULT:
            return {"file": self.script, "line": _DEFAULT_LINES[kind], "function": "main"}
        return site_dict(site)

    # -- samples ---------------------------------------------------------------------------------
    def process(self, cores: float | None = None, *, name: str = "python", thread_cores: Sequence[float] | None = None,
                threads: int | None = None, rss: int = 2 * GiB, ctx_invol_per_s: float = 10.0,
                ctx_vol_per_s: float = 100.0, ppid: int | None = None) -> int:
        """A process of the script's tree, sampled at a steady rate; the first one added is the script's
        main process, later ones are its children unless `ppid` says otherwise. Returns its pid.

        `cores` is its CPU use; `thread_cores` splits it by thread (default: one thread using `cores`).
        """
        if thread_cores is None:
            thread_cores = [1.0 if cores is None else cores]
        pid = self.pid + len(self._processes) * 10
        main = not self._processes
        self._processes.append(_Process(
            pid, (ppid if ppid is not None else (self.pid - 1 if main else self.pid)), name, list(thread_cores),
            threads if threads is not None else len(thread_cores), rss, ctx_invol_per_s, ctx_vol_per_s))
        return pid

    def workers(self, n: int, cores: float = 1.0, **kwargs: Any) -> list[int]:
        """`n` DataLoader worker processes (children of the main process), each using `cores`."""
        if not self._processes:
            self.process()
        return [self.process(cores, name="pt_data_worker", **kwargs) for _ in range(n)]

    def host_samples(self, other_cores: float = 0.0, *, tree_cores: float | None = None, busy_cores: float | None = None,
                     swap_in_bps: float = 0.0, swap_out_bps: float = 0.0, swap_used: int = 0,
                     mem_available: int | None = None, load1: float | None = None,
                     interval_s: float = 0.1) -> BundleBuilder:
        """The host, sampled every `interval_s` over the run: the script's tree uses `tree_cores` (or what
        its `process()`es use), other programs `other_cores`, so the host is `busy_cores` busy (by default
        their sum); swap traffic in bytes per second; `mem_available` in bytes (default 80% of memory)."""
        self._host = {"other_cores": other_cores, "tree_cores": tree_cores, "busy_cores": busy_cores,
                      "swap_in_bps": swap_in_bps, "swap_out_bps": swap_out_bps, "swap_used": swap_used,
                      "mem_available": mem_available, "load1": load1, "interval_s": interval_s}
        return self

    def gpu_samples(self, util: float | None = None, *, gpu: int = 0, mem_used: int | None = None,
                    mem_util: float | None = None, sm_mhz: float | None = None, power_w: float | None = None,
                    pcie_rx_kbs: float | None = None, pcie_tx_kbs: float | None = None,
                    interval_s: float = 0.1) -> BundleBuilder:
        """NVML samples of one GPU over the run; fields left None are left out, as NVML leaves them out."""
        values = {"util": util, "mem_util": mem_util, "mem_used": mem_used, "sm_mhz": sm_mhz, "power_w": power_w,
                  "pcie_rx_kbs": pcie_rx_kbs, "pcie_tx_kbs": pcie_tx_kbs}
        self._gpu_samples[gpu] = {k: v for k, v in values.items() if v is not None}
        self._gpu_interval_s = interval_s
        return self

    def sample_rows(self, kind: str, rows: Iterable[dict[str, Any]]) -> BundleBuilder:
        """Raw sample lines for samples/{host,procs,gpu}.jsonl, in the samplers' format, instead of generated ones."""
        if kind not in bundle_io.SAMPLE_FILES:
            raise ValueError(f"kind must be one of {', '.join(bundle_io.SAMPLE_FILES)}, not {kind!r}")
        self._raw[kind] = list(rows)
        return self

    # -- the trace -------------------------------------------------------------------------------
    def kernels(self, ops: Iterable[dict[str, Any] | tuple]) -> BundleBuilder:
        """GPU activity in the trace. Each op is a dict, or a tuple (step, at, dur[, name]):

        step: the step it runs in; at: seconds from that step's start (or "start": seconds since the
        epoch, instead of step and at); dur: seconds; name; kind: kernel | memcpy | memset;
        device (0); stream (7); bytes (memcpy, memset).
        """
        for op in ops:
            spec = dict(zip(("step", "at", "dur", "name"), op)) if isinstance(op, tuple) else dict(op)
            kind = spec.get("kind", "kernel")
            if kind not in ("kernel", "memcpy", "memset"):
                raise ValueError(f"kind must be kernel, memcpy or memset, not {kind!r}")
            default_name = {"kernel": "void at::native::vectorized_elementwise_kernel",
                            "memcpy": "Memcpy HtoD (Pageable -> Device)", "memset": "Memset (Device)"}[kind]
            self._ops.append(_GpuOp(kind, spec.get("name", default_name), self._time(spec), float(spec["dur"]),
                                    int(spec.get("device", 0)), int(spec.get("stream", DEFAULT_STREAM)),
                                    spec.get("bytes")))
        return self

    def cuda_call(self, name: str = "cudaStreamSynchronize", *, step: int | None = None, at: float = 0.0,
                  dur: float = 0.001, start: float | None = None) -> BundleBuilder:
        """A CUDA runtime call on the host in the trace (a synchronize, a cudaMemcpy, a launch, ...)."""
        spec = {"step": step, "at": at} if start is None else {"start": start}
        self._runtime.append((name, self._time(spec), dur))
        return self

    def without_trace(self, reason: str = "the script ended before the profiling window could write its trace") -> BundleBuilder:
        """No trace.json.gz, as when the profiler failed; the manifest says why."""
        self._trace_wanted, self._profiler_reason = False, reason
        return self

    def _time(self, spec: dict[str, Any]) -> float:
        if spec.get("start") is not None:
            return float(spec["start"])
        index = spec.get("step")
        if index is None or not 0 <= index < len(self._steps):
            raise ValueError(f"step {index!r} does not exist yet: add the steps first, then what runs in them")
        return self._steps[index].start + float(spec.get("at", 0.0))

    # -- the environment -------------------------------------------------------------------------
    def env(self, **facts: Any) -> BundleBuilder:
        """Where the script ran: cores (available to it), cpu_count (the host's; default cores), affinity,
        memory_total, gil_enabled, start_method, intra_op_threads, inter_op_threads, python, torch,
        cuda_build, driver, gpus (NVML descriptions), cuda_device (torch's, in the window), cuda_initialized,
        switch_interval_s."""
        unknown = set(facts) - set(self._env)
        if unknown:
            raise TypeError(f"unknown env fact(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(self._env))}")
        self._env.update(facts)
        return self

    # -- writing ---------------------------------------------------------------------------------
    def write(self) -> Path:
        """Write the bundle and return its directory."""
        self.path.mkdir(parents=True, exist_ok=True)
        for name in (bundle_io.EVENTS, bundle_io.TRACE, bundle_io.FINDINGS, bundle_io.REPORT):
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / bundle_io.SAMPLES_DIR, ignore_errors=True)
        self._place_rows()
        files = [bundle_io.EVENTS]
        _write_jsonl(self.path / bundle_io.EVENTS, self._events())
        if self._writes_trace:
            _write_trace(self.path / bundle_io.TRACE, self._trace())
            files.append(bundle_io.TRACE)
        for kind, rows in self._sample_files().items():
            relative = f"{bundle_io.SAMPLES_DIR}/{bundle_io.SAMPLE_FILES[kind]}"
            _write_jsonl(self.path / relative, rows)
            files.append(relative)
        bundle_io.write_json_atomic(self.path / bundle_io.MANIFEST, self._manifest(files))
        return self.path

    def build(self, *, trace_only: bool = False) -> Run:
        """Write the bundle and load it with the real loader: `Run.from_bundle` (or, with trace_only,
        `Run.from_trace` on its trace, as `gpudoctor analyze trace.json.gz` would)."""
        path = self.write()
        if trace_only:
            if not self._writes_trace:
                raise ValueError("this bundle has no trace: add steps in the window, and do not call without_trace()")
            return Run.from_trace(path / bundle_io.TRACE)
        return Run.from_bundle(path)

    @property
    def _writes_trace(self) -> bool:
        if self._trace_wanted is False:
            return False
        return any(s.window == "active" for s in self._steps) or bool(self._ops) or bool(self._runtime)

    @property
    def _has_gpu(self) -> bool:
        return bool(self._ops or self._gpu_samples or self._env["gpus"] or self._env["cuda_device"])

    def _place_rows(self) -> None:
        """Put each copy()/sync() row into its step (or every window step), once per write."""
        for s in self._steps:
            s.copies = [r for r in s.copies if not r.get("_builder")]
            s.syncs = [r for r in s.syncs if not r.get("_builder")]
        for rows, attr in ((self._copies, "copies"), (self._syncs, "syncs")):
            for index, row in rows:
                if index is not None and not 0 <= index < len(self._steps):
                    raise ValueError(f"{attr[:-1]} for step {index}, which does not exist")
                targets = [self._steps[index]] if index is not None else [s for s in self._steps if s.in_window]
                for s in targets:
                    getattr(s, attr).append({**row, "_builder": True})

    # -- events.jsonl ----------------------------------------------------------------------------
    def _events(self) -> list[dict[str, Any]]:
        t0 = self._steps[0].start if self._steps else self.start
        events: list[dict[str, Any]] = [
            {**self._process_facts(), "t": t0 - 3.0},
            {"kind": "torch", **self._torch_facts(), "t": t0 - 2.5},
        ]
        for i, thread in enumerate(self._threads):
            events.append({**thread, "t": t0 - 2.0 + i * 1e-3})
        for i, loader in enumerate(self._loaders):
            events.append({**loader, "t": t0 - 1.5 + i * 1e-3})
        for i, fork in enumerate(self._forks):
            events.append({**fork, "t": fork["t"] if fork["t"] is not None else t0 - 1.0 + i * 1e-3})
        if self._steps:
            events.append({"kind": "step_source", "source": self._steps[0].source, "at_step": 0, "t": t0})
        events += self._step_and_window_events()
        if self._exit["ending"] in ("signal", "timeout"):
            return events  # the script's process was killed: it wrote no end event
        end_t = self._steps[-1].end + 0.01 if self._steps else t0
        end = {"kind": "end", "reason": self._exit["ending"], "steps": len(self._steps), "pid": self.pid, "t": end_t}
        if self._exit.get("exception"):
            end.update(exception=self._exit["exception"], message=self._exit.get("message") or "",
                       where=self._exit.get("where"))
        events.append(end)
        return events

    def _step_and_window_events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        first = self._first_window_step
        for s in self._steps:
            if s.index == first:
                events.append({"kind": "window", "state": "opened", "index": 0, "first_step": first,
                               "cuda": self._has_gpu, "trace": bundle_io.TRACE, "t": s.start})
                events.append({"kind": "env_window", **self._window_facts(), "t": s.start})
            events.append(self._step_event(s))
        window = [s for s in self._steps if s.in_window]
        if window and self._writes_trace:
            events.append({"kind": "window", "state": "closed", "index": 0, "first_step": first, "export_s": 0.05,
                           "trace_bytes": 0, "trace": bundle_io.TRACE, "t": window[-1].end})
        elif window:
            events.append({"kind": "collector", "name": "profiler", "ok": False, "reason": self._profiler_reason,
                           "t": window[-1].end})
        return events

    @property
    def _first_window_step(self) -> int | None:
        return next((s.index for s in self._steps if s.in_window), None)

    def _step_event(self, s: _Step) -> dict[str, Any]:
        event: dict[str, Any] = {
            "kind": "step", "step": s.index, "t0": s.start, "t1": s.end, "wall_s": s.wall_s,
            "data_wait_s": s.data_wait_s, "batches": s.batches, "source": s.source, "window": s.window,
        }
        if s.in_window:
            event["window_index"] = 0
            event["phases"] = dict(s.phases)
            event["copies"] = [{k: v for k, v in r.items() if k != "_builder"} for r in s.copies]
            event["syncs"] = [{k: v for k, v in r.items() if k != "_builder"} for r in s.syncs]
            event["gil"] = s.gil
            if s.cuda_memory:
                event["cuda_memory"] = s.cuda_memory
        event["t"] = s.end
        return event

    def _process_facts(self) -> dict[str, Any]:
        e = self._env
        return {"kind": "process", "pid": self.pid, "python": e["python"], "implementation": "CPython",
                "executable": "/usr/bin/python3", "gil_enabled": e["gil_enabled"], "cpu_count": self._cpu_count,
                "affinity": self._affinity, "start_method": e["start_method"],
                "switch_interval_s": e["switch_interval_s"], "main_native_id": self.pid}

    def _torch_facts(self) -> dict[str, Any]:
        e = self._env
        return {"version": e["torch"], "cuda_build": e["cuda_build"], "cuda_built": e["cuda_build"] is not None}

    def _window_facts(self) -> dict[str, Any]:
        e = self._env
        initialized = e["cuda_initialized"] if e["cuda_initialized"] is not None else self._has_gpu
        facts: dict[str, Any] = {
            "intra_op_threads": e["intra_op_threads"] if e["intra_op_threads"] is not None else e["cores"],
            "inter_op_threads": e["inter_op_threads"] if e["inter_op_threads"] is not None else e["cores"],
            "cuda_initialized": initialized,
        }
        if initialized:
            device = e["cuda_device"] or {"index": 0, **H100, "free_memory": H100["total_memory"] - 4 * GiB}
            facts["cuda_device"] = device
        return facts

    @property
    def _cpu_count(self) -> int:
        return self._env["cpu_count"] or self._env["cores"]

    @property
    def _affinity(self) -> list[int]:
        return list(self._env["affinity"]) if self._env["affinity"] is not None else list(range(self._env["cores"]))

    # -- manifest.json ---------------------------------------------------------------------------
    def _manifest(self, files: list[str]) -> dict[str, Any]:
        e = self._env
        gpus = e["gpus"] if e["gpus"] is not None else (
            [{"index": i, "name": H100["name"], "uuid": f"GPU-{i:08d}", "memory_total": H100["total_memory"],
              "pcie_gen": 5, "pcie_width": 16} for i in sorted(self._gpu_samples)] if self._gpu_samples else [])
        first, last = (self._steps[0].start, self._steps[-1].end) if self._steps else (self.start, self.start)
        window = self._events_window_facts()
        return {
            "schema_version": bundle_io.SCHEMA_VERSION, "gpudoctor_version": __version__,
            "created": "1970-01-12T13:46:40+00:00", "status": "finished",
            "target": {"script": self.script, "module": None, "args": []}, "cwd": "/work",
            "python": e["python"],
            "host": {"hostname": "builder", "platform": "Linux-x86_64", "cpu_count": self._cpu_count,
                     "affinity": self._affinity, "memory_total": e["memory_total"]},
            "gpus": gpus, "driver": e["driver"] if e["driver"] is not None else ("550.54.15" if gpus else None),
            "window": {"wait": self.wait, "warmup": self.warmup,
                       "active": self.active if self.active is not None else max(1, len(self._steps)),
                       "every_s": None},
            "max_steps": None, "with_stack": False, "timeout_s": None, "collectors": self._collectors(),
            "files": files, "duration_s": last - first + 3.0,
            "exit": {"ending": self._exit["ending"], "status": self._exit["status"],
                     "returncode": self._exit["status"], "signal": None, "steps": len(self._steps),
                     "exception": {k: self._exit[k] for k in ("exception", "message", "where")
                                   if self._exit.get("exception")}},
            "child": {"process": _without(self._process_facts(), "kind"), "torch": self._torch_facts(), **window},
        }

    def _events_window_facts(self) -> dict[str, Any]:
        return {"env_window": self._window_facts()} if self._first_window_step is not None else {}

    def _collectors(self) -> dict[str, Any]:
        host_ok = self._host is not None or bool(self._processes) or "host" in self._raw
        gpu_ok = bool(self._gpu_samples) or "gpu" in self._raw
        return {
            "host": {"ok": True, "interval_s": 0.1} if host_ok else {"ok": False, "reason": "not sampled in this bundle"},
            "nvml": {"ok": True, "interval_s": self._gpu_interval_s} if gpu_ok else
            {"ok": False, "reason": "NVML could not be initialized: NVML Shared Library Not Found"},
            "profiler": {"ok": True} if self._writes_trace else {"ok": False, "reason": self._profiler_reason},
        }

    # -- samples/*.jsonl -------------------------------------------------------------------------
    def _sample_span(self) -> tuple[float, float]:
        if not self._steps:
            return self.start - 1.0, self.start + 1.0
        return self._steps[0].start - 1.0, self._steps[-1].end + 0.5

    def _sample_files(self) -> dict[str, list[dict[str, Any]]]:
        files: dict[str, list[dict[str, Any]]] = {}
        if self._host is not None or self._processes:
            files["host"], files["procs"] = self._host_and_proc_rows()
        if self._gpu_samples:
            files["gpu"] = self._gpu_rows()
        files.update(self._raw)
        return files

    def _grid(self, interval_s: float) -> list[float]:
        lo, hi = self._sample_span()
        count = int((hi - lo) / interval_s) + 2
        return [lo + k * interval_s for k in range(count)]

    def _host_and_proc_rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if self._host is None:  # processes alone still need the host series
            self.host_samples()
        host: dict[str, Any] = self._host or {}
        processes = self._processes or [_Process(self.pid, self.pid - 1, "python", [host["tree_cores"] or 1.0], 1,
                                                 2 * GiB, 10.0, 100.0)]
        tree = sum(p.cores for p in processes)
        busy = host["busy_cores"] if host["busy_cores"] is not None else tree + host["other_cores"]
        if busy > self._cpu_count + 1e-9:
            raise ValueError(f"the host would be {busy:g} cores busy, more than its cpu_count {self._cpu_count}; "
                             "raise env(cpu_count=...) or lower the CPU figures")
        available = host["mem_available"] if host["mem_available"] is not None else int(0.8 * self._env["memory_total"])
        grid = self._grid(host["interval_s"])
        host_rows, proc_rows = [], []
        for t in grid:
            elapsed = t - grid[0]
            host_rows.append({
                "t": t, "cpu_pct": _per_core(busy, self._cpu_count),
                "load": [host["load1"] if host["load1"] is not None else busy, busy, busy],
                "mem_total": self._env["memory_total"], "mem_available": available, "swap_used": host["swap_used"],
                "swap_in": int(host["swap_in_bps"] * elapsed), "swap_out": int(host["swap_out_bps"] * elapsed),
            })
            proc_rows.append({"t": t, "procs": [_proc_row(p, elapsed) for p in processes]})
        return host_rows, proc_rows

    def _gpu_rows(self) -> list[dict[str, Any]]:
        return [{"t": t, "gpus": [{"gpu": gpu, **values} for gpu, values in sorted(self._gpu_samples.items())]}
                for t in self._grid(self._gpu_interval_s)]

    # -- trace.json.gz ---------------------------------------------------------------------------
    def _trace(self) -> dict[str, Any]:
        times = [s.start for s in self._steps] + [op.start for op in self._ops] + [t for _, t, _ in self._runtime]
        base_s = int(min(times)) - 1 if times else int(self.start) - 1
        us = lambda t: round((t - base_s) * 1e6, 3)  # noqa: E731 - Kineto: microseconds from the base time
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0, "args": {"name": "python"}},
        ]
        first = self._first_window_step or 0
        for s in self._steps:
            if s.window != "active":
                continue
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s.index - first}",
                           "pid": self.pid, "tid": self.pid, "ts": us(s.start), "dur": round(s.wall_s * 1e6, 3),
                           "args": {"External id": s.index}})
            if s.data_wait_s > 0:
                events.append({"ph": "X", "cat": "user_annotation",
                               "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                               "pid": self.pid, "tid": self.pid, "ts": us(s.start),
                               "dur": round(s.data_wait_s * 1e6, 3), "args": {}})
        correlation = 1000
        for op in sorted(self._ops, key=lambda o: o.start):
            correlation += 1
            args: dict[str, Any] = {"device": op.device, "stream": op.stream, "correlation": correlation}
            if op.bytes is not None:
                args["bytes"] = op.bytes
            cat = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}[op.kind]
            events.append({"ph": "X", "cat": cat, "name": op.name, "pid": op.device, "tid": op.stream,
                           "ts": us(op.start), "dur": round(op.dur * 1e6, 3), "args": args})
        for name, start, dur in self._runtime:
            correlation += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": self.pid,
                           "ts": us(start), "dur": round(dur * 1e6, 3), "args": {"correlation": correlation}})
        devices = sorted({op.device for op in self._ops})
        return {
            "schemaVersion": 1, "record_shapes": 1, "displayTimeUnit": "ms", "traceName": str(self.path / "trace"),
            "baseTimeNanoseconds": base_s * 1_000_000_000,
            "deviceProperties": [{"id": d, "name": H100["name"], "totalGlobalMem": H100["total_memory"],
                                  "computeMajor": 9, "computeMinor": 0, "numSms": H100["multiprocessors"]}
                                 for d in devices],
            "traceEvents": events,
        }



def _copy_row(direction: str = "h2d", pinned: bool | None = False, non_blocking: bool = False,
              bytes: int = 4 * 1024 * 1024, host_s: float = 0.001, count: int = 1, max_s: float | None = None,
              site: Site = None) -> dict[str, Any]:
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction must be h2d or d2h, not {direction!r}")
    return {"direction": direction, "pinned": pinned, "non_blocking": non_blocking, "count": count,
            "bytes": bytes, "host_s": host_s, "max_s": max_s if max_s is not None else host_s / max(count, 1),
            "site": site_dict(site)}


def _sync_row(kind: str = "item", host_s: float = 0.001, count: int = 1, max_s: float | None = None,
              site: Site = None) -> dict[str, Any]:
    return {"kind": kind, "count": count, "host_s": host_s,
            "max_s": max_s if max_s is not None else host_s / max(count, 1), "site": site_dict(site)}


def _gil_summary(gil: float | dict[str, Any] | None, wall_s: float) -> dict[str, Any] | None:
    if gil is None:
        return None
    if isinstance(gil, dict):
        mean = float(gil["mean_s"])
        return {"samples": int(gil.get("samples", 10)), "mean_s": mean, "p95_s": float(gil.get("p95_s", mean)),
                "max_s": float(gil.get("max_s", gil.get("p95_s", mean)))}
    return {"samples": max(1, int(wall_s / 0.005)), "mean_s": float(gil), "p95_s": float(gil), "max_s": float(gil)}


def _per_core(busy: float, cores: int) -> list[float]:
    """psutil.cpu_percent(percpu=True) for a host `busy` cores busy: cores filled one after another."""
    return [round(100.0 * min(1.0, max(0.0, busy - i)), 6) for i in range(cores)]


def _proc_row(p: _Process, elapsed: float) -> dict[str, Any]:
    tids = [str(p.pid)] + [str(p.pid * 100 + i) for i in range(1, len(p.thread_cores))]
    return {
        "pid": p.pid, "ppid": p.ppid, "name": p.name, "cpu_s": p.cores * elapsed, "rss": p.rss, "threads": p.threads,
        "ctx_vol": int(p.ctx_vol_per_s * elapsed), "ctx_invol": int(p.ctx_invol_per_s * elapsed),
        "thread_cpu": {tid: cores * elapsed for tid, cores in zip(tids, p.thread_cores)},
    }


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def _write_trace(path: Path, trace: dict[str, Any]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(trace, f)

