"""What a profile on the CPU leaves in the run bundle, and how steps are counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import Gpudoctor, Result, script
from gpudoctor import bundle
from gpudoctor.analysis import Run
from gpudoctor.bundle.events import StepEvent, StepSourceEvent

BATCH, SLEEP_S, STEPS = 4, 0.005, 8
BUNDLE_FILES = ("manifest.json", "events.jsonl", "samples/host.jsonl", "samples/procs.jsonl", "trace.json.gz",
                "findings.json", "report.html")


def test_bundle_has_every_file(training_run: Result) -> None:
    for name in BUNDLE_FILES:
        assert (training_run.run_dir / name).is_file(), name
    assert (training_run.run_dir / "trace.json.gz").stat().st_size > 0
    assert not list(training_run.run_dir.glob("*.tmp")) and not list(training_run.run_dir.glob("*partial*"))


def test_bundle_loads(training_run: Result) -> None:
    loaded = bundle.load(training_run.run_dir)
    assert loaded.manifest.schema_version == bundle.SCHEMA_VERSION
    assert loaded.trace_path == training_run.run_dir / "trace.json.gz"
    run = Run.from_bundle(training_run.run_dir)
    assert run.trace is not None and run.trace.ops  # a CPU-only script's window records CPU operators
    assert not run.trace.steps  # no profiler schedule, so no ProfilerStep ranges: the steps' own clock places them
    first, last = run.steps[0], run.steps[-1]
    in_steps = [op for op in run.trace.ops if first.start <= op.start and op.end <= last.end]
    assert len(in_steps) > 0.5 * len(run.trace.ops)
    main = run.sites.loader.main
    assert main is not None and main.batch_size == BATCH and main.num_workers == 0


def test_one_step_event_per_optimizer_step(training_run: Result) -> None:
    done = json.loads((training_run.run_dir.parent / "script_report.json").read_text())["steps"]
    steps = training_run.events(StepEvent)
    assert done == STEPS
    assert [e.step for e in steps] == list(range(STEPS))
    assert {e.source for e in steps} == {"optimizer"}
    assert training_run.manifest()["exit"]["steps"] == STEPS
    run = Run.from_bundle(training_run.run_dir)
    assert len(run.step_view.all_steps) == STEPS
    assert [s.window for s in run.steps] == ["active", "active"]  # --active-steps 2


def test_data_wait_matches_the_datasets_sleep(training_run: Result) -> None:
    expected = BATCH * SLEEP_S
    for step in Run.from_bundle(training_run.run_dir).step_view.all_steps:
        assert 0.9 * expected <= step.data_wait_s < 0.5, step
        assert step.data_wait_s <= step.wall_s


def test_host_sampled_at_least_ten_times_a_second(training_run: Result) -> None:
    manifest = training_run.manifest()
    times = [s["t"] for s in bundle.read_jsonl(training_run.run_dir / "samples" / "host.jsonl")]
    span = times[-1] - times[0]
    assert len(times) >= 10 * span, (len(times), span)
    assert span >= 0.8 * manifest["duration_s"] - 0.2, (span, manifest["duration_s"])
    assert manifest["collectors"]["host"]["ok"] is True
    assert manifest["collectors"]["host"]["samples"] == len(times)
    procs = list(bundle.read_jsonl(training_run.run_dir / "samples" / "procs.jsonl"))
    script_pid = manifest["child"]["process"]["pid"]
    assert any(p["pid"] == script_pid for s in procs for p in s["procs"])


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


def test_gpu_samples_only_when_nvml_works_never_zeros_in_their_place(training_run: Result) -> None:
    manifest = training_run.manifest()
    nvml = manifest["collectors"]["nvml"]
    if _nvml_works():  # a machine with a GPU
        assert nvml["ok"] is True and manifest["gpus"]
        assert (training_run.run_dir / "samples" / "gpu.jsonl").is_file()
        return
    assert nvml["ok"] is False and nvml["reason"]
    assert manifest["gpus"] == [] and manifest["driver"] is None
    assert not (training_run.run_dir / "samples" / "gpu.jsonl").exists()
    run = Run.from_bundle(training_run.run_dir)
    assert run.gpu is None and run.host.samples.gpu == {}
    assert all(s.gpu_busy_s is None and s.gpu_idle_s is None for s in run.step_view.all_steps)
    findings = training_run.findings()
    assert findings["summary"]["gpu_idle_share"] is None
    assert findings["run"]["gpus"] == []
    assert f"not measured: GPU samples (NVML): {nvml['reason']}" in training_run.stderr


def test_manifest_describes_the_run(training_run: Result) -> None:
    manifest = training_run.manifest()
    assert manifest["status"] == "finished"
    assert manifest["target"]["script"] == script("train_loop.py")
    assert manifest["target"]["args"][:2] == ["--steps", "8"]
    assert manifest["window"] == {"wait": 1, "warmup": 1, "active": 2, "detail": 1, "every_s": None}
    assert manifest["exit"] == {**manifest["exit"], "ending": "completed", "status": 0, "returncode": 0}
    assert manifest["collectors"]["profiler"] == {"ok": True}
    assert manifest["child"]["torch"]["version"]
    gpu_samples = ["samples/gpu.jsonl"] if manifest["collectors"]["nvml"]["ok"] else []
    assert sorted(manifest["files"]) == sorted([*BUNDLE_FILES[1:5], *gpu_samples])


@pytest.mark.parametrize(("mode", "source"),
                         [("train", "optimizer"), ("infer", "dataloader"), ("explicit", "marker"),
                          ("sgd", "backward"), ("forward", "forward")])
def test_step_detection(gd: Gpudoctor, mode: str, source: str) -> None:
    report = gd.cwd / "script_report.json"
    result = gd.profile(script("train_loop.py"), "--steps", "6", "--sleep-ms", "1", "--mode", mode,
                        "--report", str(report))
    assert result.returncode == 0, result
    # The model pickles as it would alone. torch.optim's optimizers import torch's inductor (through dynamo); the
    # other loops never do, and the profiler's start, which asks whether torch has it, does not import it for them.
    assert json.loads(report.read_text()) == {"steps": 6, "saved_hooks": 0, "inductor_imported": mode == "train"}
    steps = result.events(StepEvent)
    assert len(steps) == 6
    assert {e.source for e in steps} == {source}
    assert [e.source for e in result.events(StepSourceEvent)][-1] == source
    assert (result.run_dir / "trace.json.gz").is_file()
    assert result.findings()["run"]["step_source"] == source


@pytest.mark.parametrize("mode", ["sgd", "forward"])
def test_what_runs_after_the_loop_is_no_steps_time(gd: Gpudoctor, mode: str) -> None:
    # Steps counted by backward() or forward calls end when the next begins; the script's end closes the last,
    # which then holds the second of work after the loop (an evaluation): it is not the run's pace.
    result = gd.profile(script("train_loop.py"), "--steps", "12", "--mode", mode, "--after-s", "1.0")
    assert result.returncode == 0, result
    steps = result.events(StepEvent)
    assert [e.ends_run for e in steps] == [False] * 11 + [True]
    assert steps[-1].wall_s >= 1.0
    run = result.findings()["run"]
    assert run["step_s_basis"] == "unprofiled" and run["step_s"] < 0.1


def test_the_profilers_distortion_is_measured_against_the_steps_outside_the_window(training_run: Result) -> None:
    run = training_run.findings()["run"]  # 8 steps: 1 waiting, 1 warm-up, 2 profiled, 1 detail, 3 after the window
    steps = Run.from_bundle(training_run.run_dir).step_view.all_steps
    profiled = sorted(s.wall_s for s in steps if s.window == "active")
    outside = sorted(s.wall_s for s in steps if s.window == "closed")
    assert [s.window for s in steps].count("detail") == 1  # hooked, so neither profiled nor outside
    assert len(outside) == 3 and run["window_distortion_reason"] is None
    expected = (sum(profiled) / 2) / outside[1]
    assert run["window_distortion"] == pytest.approx(expected, abs=1e-3)


def test_a_window_with_too_few_steps_after_it_says_why_its_distortion_is_unknown(gd: Gpudoctor) -> None:
    result = gd.profile(script("train_loop.py"), "--steps", "6", "--sleep-ms", "1")  # 1 + 1 + 2 + 1 + 1 after it
    assert result.returncode == 0, result
    run = result.findings()["run"]
    assert run["window_distortion"] is None
    assert run["window_distortion_reason"] == (
        "only 1 steps ran after the profiling window (at least 3 are needed to compare)")


def test_reusing_an_output_directory_replaces_the_previous_run(gd: Gpudoctor) -> None:
    first = gd.profile(script("train_loop.py"), "--steps", "6", "--sleep-ms", "1")
    assert first.returncode == 0, first
    second = gd.profile(script("endings.py"), "nosteps")
    assert second.returncode == 0, second
    assert second.run_dir == first.run_dir
    assert second.events(StepEvent) == []
    assert not (second.run_dir / "trace.json.gz").exists()
    assert Run.from_bundle(second.run_dir).step_view.all_steps == []
    assert second.findings()["run"]["steps_total"] == 0


class _InterruptingFile:
    """A file whose first write is interrupted, as a signal handler would, by another write on the same thread."""

    def __init__(self, writer: bundle.JsonlWriter, inner) -> None:
        self._writer, self._inner, self._interrupted = writer, inner, False
        self.closed = False

    def write(self, text: str) -> int:
        if not self._interrupted:
            self._interrupted = True
            self._writer.write({"from": "handler"})
        return self._inner.write(text)

    def close(self) -> None:
        self._inner.close()


def test_a_write_interrupted_by_a_writing_signal_handler_completes(tmp_path: Path) -> None:
    import threading

    writer = bundle.JsonlWriter(tmp_path / "events.jsonl")
    writer._file = _InterruptingFile(writer, writer._file)
    done = threading.Event()

    def write() -> None:
        writer.write({"from": "script"})
        writer.close()
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(timeout=10), "the reentrant write deadlocked"
    assert [r["from"] for r in bundle.read_jsonl(tmp_path / "events.jsonl")] == ["handler", "script"]


@pytest.mark.e2e
def test_the_sigterm_watchdog_ends_the_process_with_sigterm() -> None:
    import signal
    import subprocess
    import sys

    code = "import time; from gpudoctor.collect.session import terminate_after; terminate_after(0.2); time.sleep(30)"
    result = subprocess.run([sys.executable, "-c", code], timeout=25)
    assert result.returncode == -signal.SIGTERM
