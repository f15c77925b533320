"""The script runs under `gpudoctor profile` exactly as under plain `python`: argv, sys.path[0], cwd, __main__."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WINDOW, Gpudoctor, env_with, script
from gpudoctor.bundle.events import EndEvent, LoaderEvent, StepEvent, ThreadStartEvent

OPTION_LIKE = ["--out", "x", "--lr", "3e-4", "-v"]


def _record_env(path: Path) -> dict[str, str]:
    return env_with(GD_TEST_RECORD=str(path), GD_TEST_MARKER="marker-value")


def _plain_python(cwd: Path, *args: str) -> dict:
    record = cwd.parent / "plain.json"
    subprocess.run([sys.executable, *args], cwd=cwd, env=_record_env(record), check=True, capture_output=True,
                   timeout=60)
    return json.loads(record.read_text())


def _under_gpudoctor(gd: Gpudoctor, target: str, *args: str, options: tuple[str, ...] = ()) -> dict:
    record = gd.cwd.parent / "profiled.json"
    result = gd.profile(target, *args, options=options, env=_record_env(record))
    assert result.returncode == 0, result
    assert "record_launch: done" in result.stdout  # the script's stdout reaches ours
    return json.loads(record.read_text())


@pytest.fixture
def local_script(gd: Gpudoctor) -> str:
    """record_launch.py copied below the working directory and named relative to it, as users often do."""
    (gd.cwd / "sub").mkdir()
    shutil.copy(script("record_launch.py"), gd.cwd / "sub" / "record_launch.py")
    return "sub/record_launch.py"


def test_script_sees_what_plain_python_gives(gd: Gpudoctor, local_script: str) -> None:
    plain = _plain_python(gd.cwd, local_script, *OPTION_LIKE)
    profiled = _under_gpudoctor(gd, local_script, *OPTION_LIKE)
    assert profiled == plain
    assert profiled["argv"] == [local_script, *OPTION_LIKE]
    assert profiled["path0"] == str(gd.cwd / "sub")
    assert profiled["cwd"] == str(gd.cwd)
    assert profiled["name"] == "__main__"
    assert profiled["file"] == str(gd.cwd / "sub" / "record_launch.py")
    assert profiled["env"] == "marker-value"
    assert profiled["main_is_self"] is True


def test_options_before_the_script_are_gpudoctors_and_after_are_the_scripts(gd: Gpudoctor, local_script: str) -> None:
    profiled = _under_gpudoctor(gd, local_script, "--timeout", "60", "--max-steps", "5", options=WINDOW)
    assert profiled["argv"] == [local_script, "--timeout", "60", "--max-steps", "5"]
    manifest = json.loads((gd.cwd / "run" / "manifest.json").read_text())
    assert manifest["window"] == {"wait": 1, "warmup": 1, "active": 2, "detail": 1, "every_s": None}
    assert manifest["timeout_s"] is None and manifest["max_steps"] is None
    assert manifest["target"]["args"] == ["--timeout", "60", "--max-steps", "5"]


def test_double_dash_before_the_script(gd: Gpudoctor, local_script: str) -> None:
    profiled = _under_gpudoctor(gd, "--", local_script, *OPTION_LIKE)
    assert profiled["argv"] == [local_script, *OPTION_LIKE]


def test_double_dash_after_the_script_passes_through_as_with_python(gd: Gpudoctor, local_script: str) -> None:
    plain = _plain_python(gd.cwd, local_script, "--", *OPTION_LIKE)
    profiled = _under_gpudoctor(gd, local_script, "--", *OPTION_LIKE)
    assert profiled["argv"] == plain["argv"] == [local_script, "--", *OPTION_LIKE]


@pytest.mark.parametrize("module_option", [("-m", "launchmod"), ("--module", "launchmod"), ("--module=launchmod",)])
def test_module_runs_like_python_dash_m(gd: Gpudoctor, module_option: tuple[str, ...]) -> None:
    shutil.copy(script("record_launch.py"), gd.cwd / "launchmod.py")
    plain = _plain_python(gd.cwd, "-m", "launchmod", *OPTION_LIKE)
    profiled = _under_gpudoctor(gd, *module_option, *OPTION_LIKE, options=WINDOW)
    assert profiled == plain
    assert profiled["argv"] == [str(gd.cwd / "launchmod.py"), *OPTION_LIKE]
    assert profiled["path0"] == str(gd.cwd)
    assert profiled["name"] == "__main__"
    assert not (gd.cwd / "x").exists()  # the module's --out x was not taken as gpudoctor's


def test_module_in_a_package(gd: Gpudoctor) -> None:
    package = gd.cwd / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(script("record_launch.py"), package / "tool.py")
    plain = _plain_python(gd.cwd, "-m", "pkg.tool", "-v")
    profiled = _under_gpudoctor(gd, "-m", "pkg.tool", "-v")
    assert profiled == plain
    assert profiled["argv"] == [str(package / "tool.py"), "-v"]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_multiprocessing_pool(gd: Gpudoctor, method: str) -> None:
    result = gd.profile(script("multiproc.py"), "--method", method)
    assert result.returncode == 0, result
    assert f"multiproc {method}: [0, 1, 4, 9, 16, 25]" in result.stdout
    assert result.manifest()["exit"]["ending"] == "completed"


def test_dataloader_with_worker_processes(gd: Gpudoctor) -> None:
    result = gd.profile(script("loader_workers.py"))
    assert result.returncode == 0, result
    assert "loader_workers: total 120" in result.stdout
    assert [(e.num_workers, e.dataset, e.sampler) for e in result.events(LoaderEvent)] == [
        (2, "Numbers", "SequentialSampler")]
    # Forked workers must not write into the bundle: only the script's own process reports steps.
    assert len(result.events(StepEvent)) == 4
    assert {e.pid for e in result.events(EndEvent)} == {result.manifest()["child"]["process"]["pid"]}


def test_threads(gd: Gpudoctor) -> None:
    result = gd.profile(script("threads.py"))
    assert result.returncode == 0, result
    assert "threads: [499500, 1999000, 4498500]" in result.stdout
    names = {e.name for e in result.events(ThreadStartEvent)}
    assert {"worker-1", "worker-2", "worker-3"} <= names


def test_steps_that_end_on_worker_threads_never_start_the_profiler_there(gd: Gpudoctor) -> None:
    # Kineto started from a thread other than the one it registered on can crash the process, and hooks that go on
    # while a thread is inside a forward must not fail it: the script ends as it would alone, every time.
    for attempt in range(3):
        result = gd.profile(script("pool_forwards.py"), "--requests", "300", out=f"run-{attempt}")
        assert result.returncode == 0, str(result)  # a string is shown whole: the script's traceback with it
        assert "pool_forwards: 300 answers" in result.stdout
        assert "Traceback" not in result.stderr, result.stderr
        assert result.manifest()["collectors"]["profiler"]["reason"].startswith("the steps end on threads other")
        assert result.findings()["run"]["step_source"] == "forward"
