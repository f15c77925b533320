"""Every way a profile can end: one `gpudoctor:` sentence, the right exit status, and a report when data exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from conftest import WINDOW, Gpudoctor, Result, env_with, script
from gpudoctor import bundle
from gpudoctor.analysis import Run
from gpudoctor.bundle.events import StepEvent, WindowEvent

ENDINGS = script("endings.py")


def _line_of(code: str) -> int:
    """The line number in endings.py of the first line containing `code`."""
    lines = Path(ENDINGS).read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if code in line)


def _one_sentence(message: str) -> bool:
    body = message.removeprefix("gpudoctor: ")
    return message.startswith("gpudoctor: ") and body.endswith(".") and "\n" not in body


def _assert_reported(result: Result) -> None:
    """The bundle loads and the report and findings were written."""
    assert result.run_dir is not None and (result.run_dir / "report.html").is_file(), result
    assert (result.run_dir / "findings.json").is_file()
    assert f"report: {result.run_dir / 'report.html'}" in result.stderr
    Run.from_bundle(result.run_dir).steps  # noqa: B018 - parses the whole bundle


def _assert_nothing_written(gd: Gpudoctor) -> None:
    assert not (gd.cwd / "run").exists()
    assert not (gd.cwd / "gpudoctor-runs").exists()


# -- the command line is wrong -----------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("profile",), ("profile", "--max-steps", "0", "x.py"), ("profile", "--fail-on", "bogus", "x.py"), ("analyze",),
    ("no-such-command",),
])
def test_usage_errors(gd: Gpudoctor, args: tuple[str, ...]) -> None:
    result = gd.run(*args)
    assert result.returncode == 2, result
    [said] = result.stderr.splitlines()  # one sentence, gpudoctor's own, with the command's usage in it
    assert said.startswith("gpudoctor: ") and " Usage: " in said and "--help` says more" in said
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    _assert_nothing_written(gd)


# -- the script cannot be run ------------------------------------------------------------------------
def test_missing_script(gd: Gpudoctor) -> None:
    result = gd.profile("no_such_script.py")
    assert result.returncode == 2, result
    assert result.messages == ["gpudoctor: no_such_script.py does not exist."]
    _assert_nothing_written(gd)


def test_directory_instead_of_script(gd: Gpudoctor) -> None:
    (gd.cwd / "folder").mkdir()
    result = gd.profile("folder")
    assert result.returncode == 2, result
    assert _one_sentence(result.first_message) and "folder is a directory" in result.first_message
    _assert_nothing_written(gd)


def test_syntax_error(gd: Gpudoctor) -> None:
    (gd.cwd / "broken.py").write_text("open('ran', 'w').close()\ndef broken(:\n    pass\n")
    result = gd.profile("broken.py")
    assert result.returncode == 1, result
    assert _one_sentence(result.first_message)
    assert "broken.py is not valid Python" in result.first_message and "line 2" in result.first_message
    assert not (gd.cwd / "ran").exists()
    _assert_nothing_written(gd)


def test_binary_file(gd: Gpudoctor) -> None:
    (gd.cwd / "model.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)))
    result = gd.profile("model.bin")
    assert result.returncode == 1, result
    assert _one_sentence(result.first_message)
    assert "model.bin is not a Python script: it is a binary file" in result.first_message
    _assert_nothing_written(gd)


def test_output_directory_below_a_regular_file(gd: Gpudoctor) -> None:
    (gd.cwd / "a_file").write_text("")
    record = gd.cwd / "record.json"
    result = gd.profile(script("record_launch.py"), out="a_file/run", env=env_with(GD_TEST_RECORD=str(record)))
    assert result.returncode == 73, result
    assert _one_sentence(result.first_message) and "a_file/run" in result.first_message
    assert "--out" in result.first_message
    assert not record.exists()  # the script did not run
    assert "record_launch: done" not in result.stdout


# -- the script ends badly ---------------------------------------------------------------------------
def test_script_raises(gd: Gpudoctor) -> None:
    result = gd.profile(ENDINGS, "raise")
    assert result.returncode == 1, result
    # Said once, as the summary's first sentence: the exception and where, before anything measured or not.
    where = f"{ENDINGS}:{_line_of('raise RuntimeError')}, in fail"
    raised = f"gpudoctor: {ENDINGS} raised RuntimeError at {where}: the script failed on purpose. "
    assert result.first_message.startswith(raised) and sum("raised" in m for m in result.messages) == 1, result
    stderr = result.stderr
    traceback = stderr[stderr.index("Traceback (most recent call last):"):stderr.index("gpudoctor:")]
    frames = [line for line in traceback.splitlines() if line.startswith("  File ")]
    # As under plain python: the first frame is the script's top level, every frame is in the script.
    assert frames[0] == f'  File "{ENDINGS}", line {_line_of("main(sys.argv[1])")}, in <module>'
    assert all(line.startswith(f'  File "{ENDINGS}"') for line in frames), traceback
    assert "_bootstrap" not in traceback and "runpy" not in traceback
    assert "RuntimeError: the script failed on purpose" in traceback
    exit_info = result.manifest()["exit"]
    assert exit_info["ending"] == "exception" and exit_info["status"] == 1
    assert exit_info["exception"]["exception"] == "RuntimeError"
    where = {"file": ENDINGS, "line": _line_of("raise RuntimeError"), "function": "fail"}
    assert exit_info["exception"]["where"] == where
    _assert_reported(result)


def test_script_exits_with_a_status(gd: Gpudoctor) -> None:
    result = gd.profile(ENDINGS, "exit3")
    assert result.returncode == 3, result
    assert result.first_message == f"gpudoctor: {ENDINGS} exited with status 3."
    assert result.manifest()["exit"]["ending"] == "exit"
    _assert_reported(result)


def test_script_killed_by_sigkill(gd: Gpudoctor) -> None:
    result = gd.profile(ENDINGS, "sigkill")
    assert result.returncode == 128 + signal.SIGKILL, result
    assert _one_sentence(result.first_message) and "SIGKILL" in result.first_message
    manifest = result.manifest()
    assert manifest["exit"]["ending"] == "signal" and manifest["exit"]["signal"] == "SIGKILL"
    assert len(list(bundle.read_jsonl(result.run_dir / "samples" / "host.jsonl"))) >= 3
    assert len(list(bundle.read_jsonl(result.run_dir / "samples" / "procs.jsonl"))) >= 3
    assert len(result.events(StepEvent)) == 4  # written before the kill
    _assert_reported(result)


def test_timeout(gd: Gpudoctor) -> None:
    started = time.monotonic()
    result = gd.profile(ENDINGS, "hang", options=("--timeout", "2"))
    assert result.returncode == 124, result
    assert time.monotonic() - started < 60
    assert _one_sentence(result.first_message) and "--timeout 2 s" in result.first_message
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr  # gpudoctor stopped it
    assert result.manifest()["exit"]["ending"] == "timeout"
    assert not (result.run_dir / "stopping").exists()
    _assert_reported(result)


def _wait_for(path: Path, process, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the script never got going"
        time.sleep(0.05)


def _signal_gpudoctor_mid_window(gd: Gpudoctor, sig: signal.Signals) -> Result:
    """Profile a loop whose window stays open, and send `sig` to gpudoctor once the script is in the window."""
    ready = gd.cwd / "ready"
    # The script signals readiness at its third step, inside the window, which stays open until the signal.
    process = gd.start("profile", "--out", "run", "--wait-steps", "1", "--warmup-steps", "1", "--active-steps", "1000",
                       ENDINGS, "loop", env=env_with(GD_TEST_READY=str(ready)))
    try:
        _wait_for(ready, process)
        os.kill(process.pid, sig)
        stdout, stderr = process.communicate(timeout=90)
    finally:
        process.kill()
    return Result(process.returncode, stdout, stderr, gd.cwd / "run")


def test_sigint_to_gpudoctor_interrupts_the_script(gd: Gpudoctor) -> None:
    from gpudoctor.collect import bootstrap

    result = _signal_gpudoctor_mid_window(gd, signal.SIGINT)
    assert result.returncode == 130, result
    assert "KeyboardInterrupt" in result.stderr  # the script itself was interrupted
    shown = result.stderr[result.stderr.index("Traceback"):result.stderr.index("KeyboardInterrupt")]
    package = str(Path(bootstrap.__file__).parents[1])
    assert package not in shown and ENDINGS in shown  # the script's frames, none of gpudoctor's
    assert _one_sentence(result.first_message) and "interrupted" in result.first_message
    assert result.manifest()["exit"]["ending"] == "interrupted"
    assert (result.run_dir / "trace.json.gz").is_file()  # the interrupted window still wrote its trace
    assert any(e.state == "ended_early" for e in result.events(WindowEvent))
    _assert_reported(result)


def test_sigterm_to_gpudoctor_still_writes_the_window(gd: Gpudoctor) -> None:
    result = _signal_gpudoctor_mid_window(gd, signal.SIGTERM)
    assert result.returncode == 128 + signal.SIGTERM, result
    assert _one_sentence(result.first_message) and "SIGTERM" in result.first_message
    assert result.manifest()["exit"]["ending"] == "signal"
    assert (result.run_dir / "trace.json.gz").is_file()  # written before the script died of SIGTERM
    _assert_reported(result)


def test_a_process_that_does_not_exit_after_its_script_is_stopped_with_the_scripts_own_status(gd: Gpudoctor) -> None:
    result = gd.profile(ENDINGS, "stuck_exit", options=(*WINDOW, "--exit-grace", "2"), timeout=120)
    assert result.returncode == 0, result
    assert "endings: stuck_exit finished normally" in result.stdout
    assert result.first_message == (
        f"gpudoctor: {ENDINGS} had finished, but its process was still exiting 2 s after its atexit handlers ran, "
        "so gpudoctor stopped it; the report covers the whole run.")
    _assert_reported(result)
    assert result.manifest()["exit"]["ending"] == "completed"
    assert not (result.run_dir / "exiting").exists()


def test_the_scripts_own_work_at_exit_is_waited_for(gd: Gpudoctor) -> None:
    """Its non-daemon threads and atexit handlers run as long as they take: the grace starts after them."""
    result = gd.profile(ENDINGS, "slow_exit", options=(*WINDOW, "--exit-grace", "2"))
    assert result.returncode == 0, result
    assert result.stdout.splitlines()[-2:] == ["endings: thread done", "endings: atexit done"], result
    assert not any("still exiting" in message for message in result.messages), result
    assert result.manifest()["exit"]["ending"] == "completed"


def test_max_steps_stops_the_script_cleanly(gd: Gpudoctor) -> None:
    result = gd.profile(ENDINGS, "loop", options=("--max-steps", "3", "--wait-steps", "1", "--warmup-steps", "0",
                                                  "--active-steps", "5"))
    assert result.returncode == 0, result
    assert _one_sentence(result.first_message) and "--max-steps 3" in result.first_message
    manifest = result.manifest()
    assert manifest["exit"]["ending"] == "max_steps" and manifest["exit"]["steps"] == 3
    assert len(result.events(StepEvent)) == 3
    assert (result.run_dir / "trace.json.gz").is_file()
    _assert_reported(result)


def test_script_that_never_steps(gd: Gpudoctor) -> None:
    result = gd.profile(ENDINGS, "nosteps")
    assert result.returncode == 0, result
    assert "endings: 3 without a step" in result.stdout
    assert result.manifest()["exit"]["ending"] == "completed"
    profiler = result.manifest()["collectors"]["profiler"]
    assert profiler["ok"] is False and "no training step was detected" in profiler["reason"]
    verdict = result.findings()["summary"]["verdict"]
    assert "No training step was detected" in verdict
    assert verdict in (result.run_dir / "report.html").read_text()
    _assert_reported(result)


# -- analyze on bad input ----------------------------------------------------------------------------
def _analyze_fails(gd: Gpudoctor, path: Path, status: int, *expected: str) -> None:
    result = gd.run("analyze", str(path))
    assert result.returncode == status, result
    assert len(result.messages) == 1 and _one_sentence(result.first_message), result
    for text in expected:
        assert text in result.first_message, result.first_message


def test_analyze_manifest_not_json(gd: Gpudoctor, bundle_copy: Path) -> None:
    (bundle_copy / "manifest.json").write_text('{"schema_version": 1, ')
    _analyze_fails(gd, bundle_copy, 65, "manifest.json", "not valid JSON")


def test_analyze_unknown_schema_version(gd: Gpudoctor, bundle_copy: Path) -> None:
    manifest = (bundle_copy / "manifest.json").read_text().replace('"schema_version": 1,', '"schema_version": 99,')
    (bundle_copy / "manifest.json").write_text(manifest)
    _analyze_fails(gd, bundle_copy, 65, "schema version 99")


def test_analyze_missing_trace(gd: Gpudoctor, bundle_copy: Path) -> None:
    (bundle_copy / "trace.json.gz").unlink()
    _analyze_fails(gd, bundle_copy, 65, "trace.json.gz", "missing")


def test_analyze_truncated_trace(gd: Gpudoctor, bundle_copy: Path) -> None:
    """A trace cut short (the disk filled while it was written): what it holds before the cut still makes the report
    with the events and samples, and one sentence says where it ends."""
    trace = bundle_copy / "trace.json.gz"
    trace.write_bytes(trace.read_bytes()[: trace.stat().st_size // 2])
    result = gd.run("analyze", str(bundle_copy))
    assert result.returncode == 0, result
    assert result.first_message.startswith(f"gpudoctor: {trace} ends early, "), result.first_message
    assert result.first_message.endswith("the events before that are analysed.")
    assert (bundle_copy / "report.html").is_file() and (bundle_copy / "findings.json").is_file()


def test_analyze_path_that_does_not_exist(gd: Gpudoctor) -> None:
    _analyze_fails(gd, gd.cwd / "nowhere", 66, "nowhere", "does not exist")


def test_only_a_process_that_may_hold_process_groups_waits_for_their_threads_at_exit(monkeypatch) -> None:
    import torch.distributed  # noqa: F401 - `import torch` imports it in every script

    from gpudoctor.collect import session

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not session.may_hold_process_groups()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert session.may_hold_process_groups()


@pytest.mark.e2e
def test_gpudoctors_own_work_at_the_end_has_a_deadline() -> None:
    """Finishing that never returns (a native call stuck) ends the process with the script's status after the
    deadline, in one sentence, instead of holding it."""
    stuck = ("import time\nfrom gpudoctor.collect.session import exit_after\n"
             "exit_after(0.5, 3)\ntime.sleep(60)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", stuck], env=env_with(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done
    assert time.monotonic() - started < 30
    assert done.stderr == ("gpudoctor: writing the recording took over 0.5 s, so the process exits without the rest "
                           "of it; the report has what was written before.\n")


@pytest.mark.e2e
def test_ending_a_stopped_ranks_process_group_has_a_deadline() -> None:
    """A group whose shutdown never returns (an NCCL peer gone) ends the process with the status its ending gives,
    in one sentence: the rank's recording is written before, and the job is not held."""
    stuck = ("import sys, time, types\n"
             "from gpudoctor.collect import session\n"
             "dist = types.ModuleType('torch.distributed')\n"
             "dist.is_available = dist.is_initialized = lambda: True\n"
             "dist.destroy_process_group = lambda: time.sleep(60)\n"
             "sys.modules['torch.distributed'] = dist\n"
             "session.GROUP_END_DEADLINE_S = 0.5\n"
             "session.end_process_group_left_by_stop(2)\n"
             "sys.exit(5)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", stuck], env=env_with(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert time.monotonic() - started < 30
    assert done.stderr == ("gpudoctor: ending the stopped rank's process group took over 0.5 s, so the process exits "
                           "without it; its recording was written before.\n")


@pytest.mark.parametrize("initialized", [True, False])
def test_a_stopped_ranks_process_group_is_ended_only_if_there_is_one_and_its_deadline_goes(initialized: bool) -> None:
    from gpudoctor.collect import session

    calls: list[str] = []
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: initialized  # type: ignore[attr-defined]
    dist.destroy_process_group = lambda: calls.append("destroyed")  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "torch.distributed", dist)
        session.end_process_group_left_by_stop()
    assert calls == (["destroyed"] if initialized else [])
    deadlines = [t for t in threading.enumerate() if t.name == "gpudoctor-finish-deadline"]
    for deadline in deadlines:  # cancelled: each ends at once, and none is left to end this process later
        deadline.join(10)
    assert not any(deadline.is_alive() for deadline in deadlines)


def test_the_deadline_is_cancelled_once_finishing_is_done() -> None:
    from gpudoctor.collect.session import exit_after

    deadline = exit_after(0.05, 3)
    deadline.cancel()
    deadline.join(1)
    assert not deadline.is_alive()


def test_a_traceback_shown_for_ctrl_c_has_none_of_gpudoctors_frames() -> None:
    import traceback

    from gpudoctor.collect import bootstrap

    inside = os.path.join(os.path.dirname(bootstrap.__file__), "loader_hooks.py")
    wrappers: dict[str, object] = {}
    exec(compile("def wrapper(call):\n    return call()\n", inside, "exec"), wrappers)

    def users_code() -> None:
        raise KeyboardInterrupt

    try:
        wrappers["wrapper"](users_code)  # type: ignore[operator]
    except KeyboardInterrupt as exc:
        shown = bootstrap._without_gpudoctor(exc.__traceback__)
    names = [frame.name for frame in traceback.extract_tb(shown)]
    assert names == ["test_a_traceback_shown_for_ctrl_c_has_none_of_gpudoctors_frames", "users_code"]
