"""Processes the script starts itself: torch.multiprocessing.spawn's are followed and profiled as ranks of the job;
others (a multiprocessing.Process that trains) are not, and the report says so, and what they ran, instead of
describing the main process as if it were the whole job."""

from __future__ import annotations

from pathlib import Path

from conftest import Gpudoctor, script
from gpudoctor.bundle.events import ProcessStartEvent, StepEvent
from gpudoctor.engine import run_rules
from gpudoctor.report import build_report
from gpudoctor.testing import BundleBuilder

SPAWN_LINE = 29  # the mp.spawn(...) line of tests/scripts/spawned_training.py


def _report(builder: BundleBuilder) -> dict:
    run = builder.build()
    return build_report(run, run_rules(run, []))


def _unprofiled(report: dict) -> list[dict]:
    return [row for row in report["not_measured"] if row["what"].startswith("the work of")]


def _steps_and_child(tmp_path: Path, *, cores: float, gpu: bool | None, start_method: str = "spawn",
                     dataloader_worker: bool = False) -> BundleBuilder:
    builder = BundleBuilder(tmp_path)
    builder.steps(5, wall_s=0.1)
    builder.process(1.0)
    child = builder.process(cores, gpu=gpu)
    return builder.started_process(child, "train", start_method, dataloader_worker=dataloader_worker,
                                   site=("train.py", 87, "main"))


def test_a_spawned_process_that_used_the_gpu_is_named_as_not_profiled(tmp_path: Path) -> None:
    rows = _unprofiled(_report(_steps_and_child(tmp_path, cores=0.1, gpu=True)))
    assert rows == [{"what": "the work of 1 process the script started to run train (train.py:87)",
                     "reason": "it used the GPU, and gpudoctor profiles only the process it runs: its steps are "
                               "not in this report"}]


def test_a_busy_process_is_named_by_the_cores_it_used(tmp_path: Path) -> None:
    rows = _unprofiled(_report(_steps_and_child(tmp_path, cores=1.5, gpu=False, start_method="fork")))
    assert [row["reason"].split(",")[0] for row in rows] == ["it used 1.5 cores"]


def test_a_forked_childs_inherited_gpu_files_do_not_count(tmp_path: Path) -> None:
    """A forked child holds its parent's open files, the GPU's among them: only its CPU tells it worked."""
    assert _unprofiled(_report(_steps_and_child(tmp_path, cores=0.1, gpu=True, start_method="fork"))) == []


def test_idle_helpers_and_dataloader_workers_are_not_named(tmp_path: Path) -> None:
    idle = _report(_steps_and_child(tmp_path / "idle", cores=0.1, gpu=False))
    worker = _report(_steps_and_child(tmp_path / "worker", cores=1.0, gpu=True, dataloader_worker=True))
    assert _unprofiled(idle) == [] and _unprofiled(worker) == []
    alone = BundleBuilder(tmp_path / "alone")
    alone.steps(5, wall_s=0.1)
    alone.process(1.0)
    assert idle["not_measured"] == worker["not_measured"] == _report(alone)["not_measured"]


def test_with_no_step_of_its_own_the_verdict_points_at_the_started_processes(tmp_path: Path) -> None:
    builder = BundleBuilder(tmp_path).without_trace()
    builder.process(0.05)
    child = builder.process(1.0, gpu=True)
    builder.started_process(child, "main", site=("multigpu.py", 104, "<module>"))
    verdict = _report(builder)["summary"]["verdict"]
    assert verdict == ("No training step was detected in the script's own process: its work ran in 1 process the "
                       "script started to run main (multigpu.py:104), which gpudoctor does not profile.")


def test_training_in_a_spawned_process_is_profiled_as_its_rank(gd: Gpudoctor) -> None:
    """mp.spawn's process is followed: its steps are rank 0's, and the script's own process, which only waited,
    is the job's launcher."""
    result = gd.profile(script("spawned_training.py"), "--seconds", "2.5")
    assert result.returncode == 0, result
    assert "spawned_training: process 0 ran" in result.stdout
    [started] = result.events(ProcessStartEvent, "launcher")
    assert (started.target, started.start_method, started.dataloader_worker) == ("train", "spawn", False)
    assert started.site is not None and (Path(started.site.file).name, started.site.line) == (
        "spawned_training.py", SPAWN_LINE)
    assert len(result.events(StepEvent, "rank-0")) >= 5
    findings = result.findings()
    assert findings["run"]["world_size"] == 1 and findings["summary"]["status"] != "no_steps"
    assert "No training step was detected" not in result.stderr


def test_dataloader_workers_are_started_processes_the_report_leaves_alone(gd: Gpudoctor) -> None:
    result = gd.profile(script("loader_workers.py"))
    assert result.returncode == 0, result
    started = result.events(ProcessStartEvent)
    assert len(started) == 2 and all(e.dataloader_worker for e in started)
    assert "the work of" not in result.stderr
