"""gpudoctor.testing: the bundles BundleBuilder writes load through the real loader, and every view carries
the values given; the fixture loader and the rule helpers behave as documented."""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gpudoctor import Finding, NotEvaluated, Run, bundle, rule
from gpudoctor.bundle.events import EVENT_DECODER, CudaMemory, EndEvent, StepEvent
from gpudoctor.bundle.samples import GPU_ROWS, HOST_ROWS, PROCS_ROWS
from gpudoctor.engine import load_rules, run_rules
from gpudoctor.report import build_report
from gpudoctor.testing import (
    BundleBuilder,
    RuleRaised,
    assert_fires,
    assert_not_evaluated,
    assert_silent,
    fixture_path,
    load_fixture,
    run_rule,
)
from gpudoctor.testing.built_files import write_bundle

REPO = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
approx = pytest.approx


def kind_of(event: msgspec.Struct) -> str:
    """An event record's `kind`: its class's tag."""
    return str(type(event).__struct_config__.tag)


# -- a custom rule, as a user writes one, to exercise the helpers ---------------------------------------
# Their docstrings are a line each on purpose: the helpers warn of the missing sections (UndocumentedRuleWarning,
# tested in tests/engine/test_custom_rules.py), which the tests that run these rules do not need to hear.
UNDOCUMENTED_ON_PURPOSE = pytest.mark.filterwarnings("ignore::gpudoctor.testing.UndocumentedRuleWarning")


@rule("ACME101", "loader-starves-gpu", category="data_starvation", severity="warning")
def loader_starves_gpu(run: Run, max_idle: float = 0.25) -> Iterator[Finding]:
    """GPU idle while the next batch is loaded. Fix: raise num_workers, set pin_memory=True."""
    gpu_steps = [s for s in run.require_steps() if s.gpu_idle_s is not None]
    if not gpu_steps:
        raise NotEvaluated("no GPU timeline")
    waits = [s for s in gpu_steps if s.gpu_idle_s / s.wall_s > max_idle and s.data_wait_s > (s.gpu_busy_s or 0)]
    if waits:
        yield Finding(f"GPU idle {len(waits)} of {len(gpu_steps)} steps waiting on the DataLoader",
                      impact=sum(s.data_wait_s for s in waits) / run.step_view.wall_s,
                      location=run.sites.loader.location)


@rule("ACME102", "always-raises", category="data_starvation")
def always_raises(run: Run) -> Iterator[Finding]:
    """A broken rule."""
    raise ZeroDivisionError("oops")


def starved(tmp_path: Path) -> BundleBuilder:
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=0, batch_size=32, site=("train.py", 41, "main"))
    b.steps(5, wall_s=0.100, data_wait_s=0.060, gpu_busy_s=0.030)
    return b


# -- the bundle itself -----------------------------------------------------------------------------------
def test_the_bundle_is_what_the_real_loader_reads(tmp_path):
    b = starved(tmp_path)
    b.host_samples(other_cores=0.5)
    b.gpu_samples(util=30)
    path = b.write()
    loaded = bundle.load(path)  # checks the schema version and that every listed file is there
    assert loaded.manifest.schema_version == bundle.SCHEMA_VERSION
    assert sorted(loaded.manifest.files) == sorted(
        ["events.jsonl", "trace.json.gz", "samples/host.jsonl", "samples/procs.jsonl", "samples/gpu.jsonl"])
    assert all((path / f).is_file() for f in loaded.manifest.files)
    kinds = {kind_of(e) for e in loaded.events()}
    assert kinds >= {"process", "torch", "loader", "step", "window", "env_window", "end"}
    trace = bundle.read_trace(path / "trace.json.gz")
    assert "baseTimeNanoseconds" in trace
    assert {e.get("cat") for e in trace["traceEvents"]} >= {"user_annotation", "kernel"}
    run = Run.from_bundle(path)
    assert len(run.steps) == 5 and run.host.exit.ending == "completed"


def test_writing_again_replaces_the_previous_bundle(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(3)
    b.copy(bytes=MB)
    b.write()
    b.step()
    run = b.build()
    assert len(run.steps) == 4
    assert run.sites.copies[0].count == 4  # one row per step, placed once per write
    assert len(list(bundle.load(tmp_path).events())) == len(b._events())


def every_feature(tmp_path: Path) -> BundleBuilder:
    """A bundle that uses every method of the builder and every form of their arguments."""
    b = BundleBuilder(tmp_path, window=(1, 1, 3))
    b.env(cores=16, cpu_count=32, affinity=list(range(16)), start_method="fork", intra_op_threads=4, driver="560.1",
          gpus=[{"index": 0, "name": "NVIDIA H200", "memory_total": 140 * 1024 * MB}],
          cuda_device={"index": 0, "name": "NVIDIA H200", "total_memory": 140 * 1024 * MB}, switch_interval_s=0.01)
    b.loader(num_workers=4, pin_memory=True, site=("train.py", 41, "main"), dataset_len=100)
    b.loader(site=None)
    b.steps(7, wall_s=0.1, data_wait_s=0.02, gpu_busy_s=0.05, kernels=2, forward_s=0.01, backward_s=0.02,
            gil=lambda i: {"mean_s": 0.001, "p95_s": 0.002} if i % 2 else 0.003,
            cuda_memory={"allocated": 1, "reserved": 2, "max_allocated": 3},
            copies=[{"direction": "d2h", "bytes": MB, "host_s": 0.002, "count": 2, "site": ("train.py", 60, "f")}],
            syncs=[{"kind": "print", "site": {"file": "train.py", "line": 61}}])
    b.copy("h2d", pinned=True, non_blocking=True, bytes=64 * MB, host_s=0.004, count=2)
    b.copy("d2h", step=3, max_s=0.003)
    b.sync("item", host_s=0.003, count=3)
    b.sync("synchronize", step=4, site=None)
    b.fork(count=2)
    b.fork(cuda_initialized=False, dataloader_worker=False, t=999_990.0)
    b.thread("trainer-0", "Worker.run")
    b.thread("pin_memory", module="torch.utils.data._utils.pin_memory", daemon=True, native_id=424201)
    b.process(thread_cores=[0.5, 0.2])
    b.workers(2, cores=0.9, threads=3)
    b.host_samples(other_cores=1.0, swap_in_bps=MB, load1=2.0, interval_s=0.2)
    b.gpu_samples(util=40, mem_used=10 * 1024 * MB, power_w=300.0)
    b.gpu_samples(util=0, gpu=1, interval_s=0.05)
    b.sample_rows("gpu", [{"t": 1_000_000.0, "gpus": [{"gpu": 0, "util": 99}]}])
    b.kernels([(0, 0.0, 0.01, "gemm"), {"step": 2, "at": 0.01, "dur": 0.002, "kind": "memcpy", "bytes": MB},
               {"start": 1_000_000.5, "dur": 0.001, "kind": "memset", "stream": 9}])
    b.cuda_call(step=1, at=0.05, dur=0.01)
    b.cuda_call("cudaMemcpy", start=1_000_000.3)
    b.exit("exception", 1, exception="RuntimeError", message="boom", where=("train.py", 77, "main"))
    return b


def test_every_file_decodes_with_the_bundles_own_decoders(tmp_path):
    path = every_feature(tmp_path).write()
    manifest = bundle.read_manifest(path)
    decoders = {"events.jsonl": EVENT_DECODER, "samples/host.jsonl": HOST_ROWS, "samples/procs.jsonl": PROCS_ROWS,
                "samples/gpu.jsonl": GPU_ROWS}
    assert sorted(manifest.files) == sorted([*decoders, "trace.json.gz"])
    for name, decoder in decoders.items():
        lines = (path / name).read_bytes().splitlines()
        records = list(bundle.read_jsonl(path / name, decoder))
        assert len(records) == len(lines) > 0, name
        # Each line is exactly its record: no key the records do not know, none lost on the way.
        assert [msgspec.to_builtins(r) for r in records] == [json.loads(line) for line in lines], name
    kinds = {kind_of(e) for e in bundle.load(path).events()}
    assert kinds == {"process", "torch", "thread_start", "loader", "fork", "step_source", "window", "env_window",
                     "step", "end"}
    assert bundle.read_trace(path / "trace.json.gz")["traceEvents"]


def test_the_manifest_round_trips(tmp_path):
    b = every_feature(tmp_path)
    written = write_bundle(b._current())
    assert bundle.load(tmp_path).manifest == written
    assert written.exit is not None and written.exit.exception.where.line == 77
    assert written.collectors["nvml"].ok and written.child.env_window.cuda_device.name == "NVIDIA H200"


def test_what_a_test_gives_is_validated(tmp_path):
    b = BundleBuilder(tmp_path)
    with pytest.raises(ValueError, match=r"sample_rows\('host'\) row 1: .*`\$.t`"):
        b.sample_rows("host", [{"t": 1.0}, {"t": "later"}])
    with pytest.raises(ValueError, match="kind must be one of host, procs, gpu"):
        b.sample_rows("disk", [])
    with pytest.raises(ValueError, match=r"env\(\).*cores"):
        b.env(cores="eight")
    with pytest.raises(ValueError, match="count"):
        b.step(copies=[{"direction": "h2d", "count": -1}])
    with pytest.raises(ValueError, match="direction must be h2d or d2h"):
        b.copy("sideways")
    with pytest.raises(ValueError, match="kind must be kernel, memcpy or memset"):
        b.kernels([{"start": 1.0, "dur": 0.1, "kind": "launch"}])
    with pytest.raises(ValueError, match="call site"):
        b.loader(site={"line": 3})
    assert b._spec.steps == []  # nothing half-added


# -- steps -----------------------------------------------------------------------------------------------
def test_steps_carry_the_given_times(tmp_path):
    b = BundleBuilder(tmp_path)
    b.step(wall_s=0.2, data_wait_s=0.05, forward_s=0.03, backward_s=0.06, optimizer_s=0.01, gil=0.004,
           cuda_memory={"allocated": 10, "reserved": 20, "max_allocated": 30}, batches=2, source="dataloader")
    b.steps(3, wall_s=lambda i: 0.1 * (i + 1))
    run = b.build()
    first = run.steps[0]
    assert (first.wall_s, first.data_wait_s) == (approx(0.2), approx(0.05))
    assert (first.forward_s, first.backward_s, first.optimizer_s) == (approx(0.03), approx(0.06), approx(0.01))
    assert first.other_s == approx(0.2 - 0.05 - 0.03 - 0.06 - 0.01)
    assert first.gil.mean_s == approx(0.004) and first.gil.samples >= 1
    assert first.cuda_memory == CudaMemory(allocated=10, reserved=20, max_allocated=30)
    assert [s.wall_s for s in run.steps[1:]] == [approx(0.1), approx(0.2), approx(0.3)]
    assert [s.index for s in run.steps] == [0, 1, 2, 3]
    for before, after in zip(run.steps, run.steps[1:]):
        assert after.start == approx(before.end)  # every step starts where the previous one ended
    assert run.step_view.wall_s == approx(0.8)


def test_the_window_decides_which_steps_are_analysed(tmp_path):
    b = BundleBuilder(tmp_path, window=(5, 2, 5))
    b.steps(14, wall_s=0.05, forward_s=0.01, gpu_busy_s=0.02)
    run = b.build()
    windows = [s.window for s in run.step_view.all_steps]
    assert windows == ["waiting"] * 5 + ["warmup"] * 2 + ["active"] * 5 + ["closed"] * 2
    assert [s.index for s in run.steps] == [7, 8, 9, 10, 11]
    waiting, warmup, active = run.step_view.all_steps[0], run.step_view.all_steps[5], run.step_view.all_steps[7]
    assert waiting.forward_s is None and waiting.copy_s is None  # measured only inside the window
    assert warmup.forward_s == approx(0.01) and warmup.gpu_busy_s is None  # warm-up is not in the trace
    assert active.gpu_busy_s == approx(0.02) and active.gpu_idle_s == approx(0.03)
    trace_steps = sorted(run.trace.steps)
    assert trace_steps == [2, 3, 4, 5, 6]  # ProfilerStep#N counts from the window's first (warm-up) step


def test_gpu_busy_and_idle_come_from_the_trace(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(4, wall_s=0.1, data_wait_s=0.06, gpu_busy_s=0.03, kernels=6)
    run = b.build()
    assert run.gpu is not None
    for s in run.steps:
        assert s.gpu_busy_s == approx(0.03) and s.gpu_compute_s == approx(0.03)
        assert s.gpu_idle_s == approx(0.07) and s.kernels == 6
        gaps = run.gpu.idle_gaps(s.start, s.end)
        assert gaps[0] == (approx(s.start), approx(s.start + 0.06))  # idle while the data is loaded
    assert run.gpu.busy_fraction == approx(0.3)
    assert statistics.median(k.dur for k in run.gpu.kernels) == approx(0.005)


def test_busy_time_that_cannot_follow_the_data_wait_ends_with_the_step(tmp_path):
    b = BundleBuilder(tmp_path)
    b.step(wall_s=0.1, data_wait_s=0.09, gpu_busy_s=0.05)
    s = b.build().steps[0]
    assert s.gpu_busy_s == approx(0.05) and s.gpu_idle_s == approx(0.05)


def test_explicit_kernels_and_copies_on_several_streams(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(2, wall_s=0.1)
    b.kernels([
        (0, 0.010, 0.020, "gemm"),
        {"step": 0, "at": 0.020, "dur": 0.020, "kind": "memcpy", "bytes": 64 * MB, "stream": 9},
        {"step": 1, "at": 0.0, "dur": 0.010, "kind": "memset", "bytes": MB},
    ])
    run = b.build()
    first, second = run.steps
    assert first.gpu_busy_s == approx(0.030)  # the union over streams: 10-40 ms
    assert first.gpu_compute_s == approx(0.020)  # kernels only
    assert first.kernels == 1 and second.kernels == 0
    assert second.gpu_busy_s == approx(0.010)
    memcpy = run.gpu.memcpys[0]
    assert (memcpy.bytes, memcpy.stream, memcpy.name) == (64 * MB, 9, "Memcpy HtoD (Pageable -> Device)")


def test_steps_without_gpu_work_have_no_gpu_fields(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(3)
    run = b.build()
    assert run.trace is not None and run.gpu is None  # a CPU-only run still writes its trace
    assert all(s.gpu_busy_s is None and s.gpu_idle_s is None for s in run.steps)
    with pytest.raises(NotEvaluated):
        run.require_gpu()


def test_step_arguments_are_checked(tmp_path):
    b = BundleBuilder(tmp_path)
    with pytest.raises(ValueError, match="data_wait_s"):
        b.step(wall_s=0.1, data_wait_s=0.2)
    with pytest.raises(ValueError, match="gpu_busy_s"):
        b.step(wall_s=0.1, gpu_busy_s=0.3)
    with pytest.raises(ValueError, match="does not exist"):
        b.kernels([(3, 0.0, 0.01)])


# -- instrumentation views -------------------------------------------------------------------------------
def test_loader_view(tmp_path):
    b = BundleBuilder(tmp_path)
    b.loader(num_workers=4, pin_memory=True, batch_size=64, site=("train.py", 41, "main"), persistent_workers=True,
             dataset="Images", dataset_len=1000, start_method="spawn")
    b.loader(num_workers=0, batch_size=8, site=None)
    b.steps(2)
    run = b.build()
    main = run.sites.loader.main
    assert (main.num_workers, main.pin_memory, main.batch_size, main.prefetch_factor) == (4, True, 64, 2)
    assert (main.persistent_workers, main.dataset, main.dataset_len, main.start_method) == (
        True, "Images", 1000, "spawn")
    assert run.sites.loader.location == run.sites.loader.main.location
    assert (main.location.file, main.location.line, main.location.function) == ("train.py", 41, "main")
    assert len(run.sites.loader.loaders) == 2 and run.sites.loader.loaders[1].location is None


def test_copies_and_syncs_per_step(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(4, wall_s=0.1)
    b.copy("h2d", pinned=False, non_blocking=True, bytes=64 * MB, host_s=0.008, site=("train.py", 52, "step"))
    b.copy("d2h", pinned=False, bytes=MB, host_s=0.002, count=2, step=1)
    b.sync("item", host_s=0.003, count=3, site=("train.py", 58, "step"))
    b.sync("synchronize", host_s=0.01, step=2)
    run = b.build()
    h2d = next(c for c in run.sites.copies if c.direction == "h2d")
    assert (h2d.count, h2d.bytes, h2d.host_s, h2d.max_s) == (4, 4 * 64 * MB, approx(0.032), approx(0.008))
    assert (h2d.pinned, h2d.non_blocking, str(h2d.location)) == (False, True, "train.py:52")
    d2h = next(c for c in run.sites.copies if c.direction == "d2h")
    assert (d2h.count, d2h.bytes, d2h.max_s) == (2, MB, approx(0.001))
    item = next(s for s in run.sites.syncs if s.kind == "item")
    assert (item.count, item.host_s, item.location.function) == (12, approx(0.012), "step")
    assert [s.kind for s in run.sites.syncs] == ["item", "synchronize"]  # by host time blocked, largest first
    assert [s.copy_s for s in run.steps] == [approx(0.008), approx(0.010), approx(0.008), approx(0.008)]
    assert [s.sync_s for s in run.steps] == [approx(0.003), approx(0.003), approx(0.013), approx(0.003)]


def test_copy_and_sync_rows_given_to_a_step(tmp_path):
    b = BundleBuilder(tmp_path)
    b.step(copies=[{"direction": "h2d", "bytes": MB, "host_s": 0.004}], syncs=[{"kind": "print", "host_s": 0.002}])
    run = b.build()
    assert run.sites.copies[0].bytes == MB and run.sites.syncs[0].kind == "print"
    assert run.steps[0].copy_s == approx(0.004) and run.steps[0].sync_s == approx(0.002)


def test_forks_and_threads(tmp_path):
    b = BundleBuilder(tmp_path)
    b.fork(cuda_initialized=True, start_method="fork", count=2, site=("train.py", 60, "main"))
    b.fork(cuda_initialized=False, dataloader_worker=False, t=999_999.0)
    b.thread("trainer-0", "Worker.run", site=("train.py", 30, "main"))
    b.thread("pin_memory", "_pin_memory_loop", module="torch.utils.data._utils.pin_memory", daemon=True)
    b.steps(2)
    run = b.build()
    assert [(f.cuda_initialized, f.start_method, f.dataloader_worker) for f in run.host.forks] == [
        (True, "fork", True), (True, "fork", True), (False, None, False)]
    assert str(run.host.forks[0].location) == "train.py:60" and run.host.forks[2].time == 999_999.0
    assert all(f.time < run.steps[0].start for f in run.host.forks)
    assert [t.name for t in run.host.threads] == ["trainer-0", "pin_memory"]
    assert [t.name for t in run.host.user_threads] == ["trainer-0"]  # the library's own thread is told apart
    assert run.host.threads[1].daemon and run.host.threads[0].target == "Worker.run"


# -- samples ---------------------------------------------------------------------------------------------
def test_host_samples_split_the_cpu_between_the_job_and_others(tmp_path):
    b = BundleBuilder(tmp_path)
    b.env(cores=16)
    b.steps(10, wall_s=0.1)
    b.host_samples(other_cores=6.0, tree_cores=3.0, swap_in_bps=2 * MB, swap_out_bps=MB, mem_available=8 * 1024 * MB)
    run = b.build()
    points = run.require_host_samples().host
    assert len(points) >= 10
    for p in points:
        assert p.values["busy_cores"] == approx(9.0)
        assert p.values["tree_cores"] == approx(3.0) and p.values["other_cores"] == approx(6.0)
        assert p.values["swap_in_bps"] == approx(2 * MB, rel=1e-3) and p.values["swap_out_bps"] == approx(MB, rel=1e-3)
        assert p.values["mem_available"] == 8 * 1024 * MB
    assert points[0].t < run.steps[0].start and points[-1].t > run.steps[-1].end  # the samples cover the run
    main = run.require_processes()[0]
    assert (main.role, main.cpu_mean) == ("main", approx(3.0))


def test_processes_threads_and_workers(tmp_path):
    b = BundleBuilder(tmp_path)
    b.env(cores=4)
    main = b.process(name="python", thread_cores=[0.9, 0.8, 0.1], rss=3 * 1024 * MB, ctx_invol_per_s=500)
    workers = b.workers(2, cores=0.95, threads=4)
    b.steps(10, wall_s=0.1)
    b.host_samples(other_cores=0.1)
    run = b.build()
    by_pid = {p.pid: p for p in run.host.processes}
    assert set(by_pid) == {main, *workers}
    proc = by_pid[main]
    assert (proc.role, proc.name, proc.cpu_mean, proc.busy_threads) == ("main", "python", approx(1.8), 2)
    assert (proc.rss_max, proc.threads_max, proc.ctx_invol_per_s) == (3 * 1024 * MB, 3, approx(500, rel=1e-2))
    for pid in workers:
        worker = by_pid[pid]
        assert (worker.role, worker.ppid, worker.name) == ("child", main, "pt_data_worker")
        assert worker.cpu_mean == approx(0.95) and worker.threads_max == 4
    assert run.host.samples.host[0].values["tree_cores"] == approx(1.8 + 2 * 0.95)


def test_busy_cores_beyond_the_host_are_refused(tmp_path):
    b = BundleBuilder(tmp_path)
    b.env(cores=2)
    b.steps(2)
    b.host_samples(other_cores=4.0)
    with pytest.raises(ValueError, match="cpu_count"):
        b.write()


def test_gpu_samples(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(5)
    b.gpu_samples(util=35, mem_used=20 * 1024 * MB, sm_mhz=1980, power_w=300.0)
    b.gpu_samples(util=0, gpu=1)
    run = b.build()
    assert run.host.samples.has_gpu and sorted(run.host.samples.gpu) == [0, 1]
    point = run.host.samples.gpu[0][0]
    assert point.values == {"util": 35, "mem_used": 20 * 1024 * MB, "sm_mhz": 1980, "power_w": 300.0}
    assert "pcie_rx_kbs" not in point.values  # a field not given is left out, never written as zero
    assert [g.index for g in run.host.env.gpus] == [0, 1]
    assert run.manifest.collectors["nvml"].ok is True


def test_raw_sample_rows(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(2)
    b.sample_rows("gpu", [{"t": 1_000_000.0, "gpus": [{"gpu": 0, "util": 99}]}])
    run = b.build()
    assert run.host.samples.gpu[0][0].values == {"util": 99}


# -- environment, missing data, endings ------------------------------------------------------------------
def test_env(tmp_path):
    b = BundleBuilder(tmp_path)
    b.env(cores=6, cpu_count=32, gil_enabled=False, start_method="spawn", intra_op_threads=3,
          memory_total=256 * 1024 * MB, python="3.13.1", torch="2.6.0",
          cuda_device={"index": 0, "name": "NVIDIA H200", "total_memory": 140 * 1024 * MB})
    b.steps(3)
    env = b.build().host.env
    assert (env.cores, env.cpu_count, env.gil_enabled, env.start_method) == (6, 32, False, "spawn")
    assert (env.intra_op_threads, env.memory_total, env.python, env.torch) == (3, 256 * 1024 * MB, "3.13.1", "2.6.0")
    assert env.cuda_device.name == "NVIDIA H200"
    with pytest.raises(TypeError, match="unknown env"):
        b.env(gpu_count=3)


def test_default_env_is_a_gpu_host_when_the_run_used_the_gpu(tmp_path):
    run = starved(tmp_path).build()
    assert run.host.env.cores == 8 and run.host.env.gil_enabled is True
    assert run.host.env.cuda_device.total_memory > 0 and run.host.env.intra_op_threads == 8


def test_what_was_not_collected_is_not_evaluated(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(3)
    b.without_trace("torch.profiler could not start: RuntimeError: boom")
    run = b.build()
    assert run.trace is None and not (tmp_path / "trace.json.gz").exists()
    with pytest.raises(NotEvaluated, match="boom"):
        run.require_gpu()
    with pytest.raises(NotEvaluated):
        run.require_host_samples()
    with pytest.raises(NotEvaluated):
        run.require_processes()
    collectors = run.manifest.collectors
    assert collectors["host"].ok is False and collectors["nvml"].ok is False
    reason = "torch.profiler could not start: RuntimeError: boom"
    assert collectors["profiler"].to_json() == {"ok": False, "reason": reason}
    assert len(run.steps) == 3  # the instrumentation's steps stand without a trace


def test_an_exception_ending(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(2)
    b.exit("exception", 1, exception="RuntimeError", message="Cannot re-initialize CUDA in forked subprocess",
           where=("train.py", 77, "__getitem__"))
    run = b.build()
    assert (run.host.exit.ending, run.host.exit.status, run.host.exit.exception) == ("exception", 1, "RuntimeError")
    assert "forked subprocess" in run.host.exit.message and str(run.host.exit.location) == "train.py:77"
    end = [e for e in bundle.load(tmp_path).events() if isinstance(e, EndEvent)]
    assert end[0].reason == "exception"


def test_cuda_calls_in_the_trace_make_the_sync_stall(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(2, wall_s=0.1)
    b.kernels([(0, 0.0, 0.04), (1, 0.0, 0.04)])
    b.cuda_call("cudaStreamSynchronize", step=0, at=0.0, dur=0.05)  # the GPU drains, then idles 40-50 ms
    b.sync("item", host_s=0.05, step=0)
    run = b.build()
    assert run.trace.runtime[0].name == "cudaStreamSynchronize"
    assert run.gpu_work.sync_stall_s == approx(0.06)  # the idle gap of step 0 (40-100 ms) overlaps the call


def test_trace_only_run(tmp_path):
    b = BundleBuilder(tmp_path, window=(1, 1, 3))
    b.steps(6, wall_s=0.1, data_wait_s=0.04, gpu_busy_s=0.05)
    run = b.build(trace_only=True)
    assert run.trace_only and len(run.steps) == 3
    assert [s.data_wait_s for s in run.steps] == [approx(0.04)] * 3  # from the DataLoader annotations
    assert [s.gpu_busy_s for s in run.steps] == [approx(0.05)] * 3
    with pytest.raises(NotEvaluated):
        run.require_host_samples()


def test_the_whole_pipeline_runs_on_a_built_bundle(tmp_path):
    b = starved(tmp_path)
    b.env(cores=16)
    b.copy(bytes=64 * MB, host_s=0.008)
    b.sync("item", host_s=0.004, count=2)
    b.fork()
    b.thread()
    b.workers(0)
    b.host_samples(other_cores=1.0)
    b.gpu_samples(util=30, mem_used=10 * 1024 * MB)
    run = b.build()
    result = run_rules(run, load_rules(()))
    assert result.errors == []  # every built-in rule could read the bundle
    assert "GD101" in {f.code for f in result.findings}  # the loader in the main process is seen
    assert build_report(run, result)["findings"]


# -- the format is the collectors' format ----------------------------------------------------------------
@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory) -> Path:
    """A bundle recorded for real, on this machine's CPU."""
    out = tmp_path_factory.mktemp("real") / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", "gpudoctor", "profile", "--out", str(out), "--wait-steps", "1",
                    "--warmup-steps", "1", "--active-steps", "2", str(REPO / "examples" / "starved_training.py"),
                    "--samples", "96"], env=env, capture_output=True, check=True, timeout=240)
    return out


def _keys_by_kind(path: Path) -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    for event in bundle.load(path).events():
        # A record leaves out a field at its default, so a line's keys depend on its values: read the record's fields.
        kind = kind_of(event) if not isinstance(event, StepEvent) else f"step:{event.window}"
        keys.setdefault(kind, set()).update({"kind", *event.__struct_fields__})
    return keys


@pytest.mark.e2e
def test_builder_writes_the_fields_the_collectors_write(tmp_path, real_bundle):
    b = BundleBuilder(tmp_path, window=(1, 1, 2))
    b.loader(num_workers=0, batch_size=16)
    b.steps(6, wall_s=0.03, data_wait_s=0.02, gil=0.001)
    b.host_samples()
    built, real = _keys_by_kind(b.write()), _keys_by_kind(real_bundle)
    for kind in ("process", "torch", "loader", "step_source", "window", "env_window", "end",
                 "step:waiting", "step:warmup", "step:active"):
        assert built[kind] == real[kind], kind
    real_manifest = json.loads((real_bundle / "manifest.json").read_text())
    built_manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert set(built_manifest) == set(real_manifest)
    assert set(built_manifest["host"]) == set(real_manifest["host"])
    assert set(built_manifest["child"]) == set(real_manifest["child"])
    for kind in ("host", "procs"):
        name = f"samples/{bundle.SAMPLE_FILES[kind]}"
        # A sample taken as the script's process ended can find no process: compare the last that found one.
        real_rows = [row for line in (real_bundle / name).read_text().splitlines()
                     if "procs" in (row := json.loads(line)) or kind == "host"]
        built_rows = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        assert set(built_rows[-1]) == set(real_rows[-1]), kind
    real_proc = [row for line in (real_bundle / "samples/procs.jsonl").read_text().splitlines()
                 if "procs" in (row := json.loads(line))][-1]
    built_proc = [json.loads(line) for line in (tmp_path / "samples/procs.jsonl").read_text().splitlines()][-1]
    assert set(built_proc["procs"][0]) == set(real_proc["procs"][0])
    with gzip.open(real_bundle / "trace.json.gz", "rt") as f:
        real_trace = json.load(f)
    built_trace = bundle.read_trace(tmp_path / "trace.json.gz")
    assert set(real_trace) - {"trace_id", "host_name"} <= set(built_trace)


# -- recorded fixtures -----------------------------------------------------------------------------------
def test_load_fixture_from_a_directory_and_from_an_archive(tmp_path, monkeypatch):
    root = tmp_path / "bundles"
    starved(root / "starved").write()
    b = BundleBuilder(tmp_path / "packed" / "healthy")
    b.steps(3, gpu_busy_s=0.09)
    b.write()
    with tarfile.open(root / "fixtures.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "packed" / "healthy", arcname="healthy")
    assert load_fixture("starved", root).sites.loader.main.num_workers == 0
    healthy = load_fixture("healthy", root)
    assert healthy.steps[0].gpu_busy_s == approx(0.09)
    assert fixture_path("healthy", root) == fixture_path("healthy", root)  # extracted once, then reused
    monkeypatch.setenv("GPUDOCTOR_FIXTURES", str(root))
    assert len(load_fixture("healthy").steps) == 3
    with pytest.raises(FileNotFoundError, match="available: healthy, starved"):
        load_fixture("missing", root)


# -- the rule helpers ------------------------------------------------------------------------------------
@UNDOCUMENTED_ON_PURPOSE
def test_run_rule_and_the_assertions(tmp_path):
    run = starved(tmp_path).build()
    findings = run_rule(loader_starves_gpu, run)
    assert len(findings) == 1 and findings[0]["code"] == "ACME101"
    assert_fires(loader_starves_gpu, run, count=1, severity="warning", impact=0.6, title="5 of 5 steps",
                 location=("train.py", 41, "main"))
    assert_fires(loader_starves_gpu, run, impact=(0.5, 0.7), location="train.py:41")
    assert_silent(loader_starves_gpu, run, options={"max_idle": 0.9})
    assert run_rule(loader_starves_gpu, run, max_idle=0.9) == []
    with pytest.raises(AssertionError, match="found nothing"):
        assert_fires(loader_starves_gpu, run, options={"max_idle": 0.9})
    with pytest.raises(AssertionError, match="should be silent"):
        assert_silent(loader_starves_gpu, run)
    with pytest.raises(AssertionError, match="impact"):
        assert_fires(loader_starves_gpu, run, impact=0.2)
    with pytest.raises(TypeError, match="no option"):
        run_rule(loader_starves_gpu, run, max_wait=0.1)


@UNDOCUMENTED_ON_PURPOSE
def test_not_evaluated_and_raising_rules_are_not_silence(tmp_path):
    b = BundleBuilder(tmp_path)
    b.steps(3)  # no GPU timeline
    run = b.build()
    with pytest.raises(NotEvaluated, match="no GPU timeline"):
        run_rule(loader_starves_gpu, run)
    with pytest.raises(AssertionError, match="not evaluated"):
        assert_silent(loader_starves_gpu, run)
    assert assert_not_evaluated(loader_starves_gpu, run, "GPU") == "no GPU timeline"
    with pytest.raises(RuleRaised, match="ZeroDivisionError: oops"):
        run_rule(always_raises, run)


def test_built_in_rules_by_code_or_name(tmp_path):
    run = starved(tmp_path).build()
    assert run_rule("GD101", run)[0]["name"] == "loader-in-main-process"
    assert_fires("loader-in-main-process", run, location="train.py:41")
    with pytest.raises(LookupError):
        run_rule("GD999", run)
