"""The run directory: where it is, made writable and emptied of an earlier run's files; and the script checked
before anything runs."""

from __future__ import annotations

import datetime as dt
import difflib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from gpudoctor.bundle import EVENTS, FINDINGS, MANIFEST, REPORT, SAMPLE_FILES, SAMPLES_DIR, trace_names
from gpudoctor.bundle.free_space import short_of_space
from gpudoctor.bundle.layout import RANK_DIR
from gpudoctor.collect.window import LOG
from gpudoctor.errors import OutputInUseError, OutputNotWritableError, ScriptNotFoundError, ScriptNotPythonError
from gpudoctor.launch.inner_job import DONE
from gpudoctor.launch.ranks import launched_rank
from gpudoctor.launch.recording import recorder


def python_program(name: str) -> str | None:
    """The file of a Python program installed on PATH (`accelerate`, `lightning`: a console script whose first
    line runs python), for a bare name that is no file of the working directory; else None."""
    if os.sep in name or Path(name).exists():
        return None
    found = shutil.which(name)
    if found is None:
        return None
    try:
        with open(found, "rb") as program:
            first = program.readline(512)
    except OSError:
        return None
    return found if first.startswith(b"#!") and b"python" in first else None


def check_script(script: str) -> None:
    path = Path(script)
    if not path.exists():
        raise ScriptNotFoundError(f"{script} does not exist{_did_you_mean(path) or '.'}")
    if path.is_dir():
        raise ScriptNotFoundError(f"{script} is a directory, not a Python script.")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ScriptNotFoundError(f"{script} cannot be read: {exc.strerror}.") from None
    if b"\0" in source:  # compile() reports these as a SyntaxError or a ValueError, depending on the Python
        raise ScriptNotPythonError(f"{script} is not a Python script: it is a binary file (it contains null bytes).")
    try:
        compile(source, script, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise ScriptNotPythonError(f"{script} is not valid Python: {exc.msg}{where}.") from None


def _did_you_mean(path: Path) -> str:
    """'; did you mean train.py?' when a .py file beside the missing one has a close name, else ''."""
    try:
        neighbours = [p.name for p in path.parent.glob("*.py") if p.is_file()]
    except OSError:
        return ""
    # By stem: the shared ".py" would make any two names look alike.
    close = difflib.get_close_matches(path.stem, [name.removesuffix(".py") for name in neighbours], n=1)
    return f"; did you mean {path.with_name(close[0] + '.py')}?" if close else ""


def make_run_dir(out: Path | None, target_name: str) -> Path:
    """The run directory, made and emptied of an earlier run's files. As a rank of a job (`torchrun ... -m gpudoctor
    profile ...`, `srun gpudoctor profile ...`: gpudoctor.launch.ranks) each rank writes its own bundle, `rank-K/`
    (K its global rank), in the run directory its ranks share."""
    launched = launched_rank()
    if out is not None:
        run_dir = out
    elif launched is not None:  # every rank's parent on a node is its launcher's agent: one directory for them all
        run_dir = Path("gpudoctor-runs") / f"{target_name}-{launched.launcher}-{os.getppid()}"
    else:
        run_dir = stamped_dir(Path("gpudoctor-runs"), target_name)
    if launched is not None:
        run_dir = run_dir / f"rank-{launched.rank}"
        _refuse_if_recording(run_dir)
        return prepare_run_dir(run_dir)
    _refuse_if_recording(run_dir)
    return prepare_run_dir(run_dir, replaced=_job_bundles(run_dir))


def _refuse_if_recording(run_dir: Path) -> None:
    """Before anything in it is emptied: another `gpudoctor profile` records into `run_dir` now."""
    found = recorder(run_dir)
    if found is not None:
        pid, started = found
        raise OutputInUseError(f"{run_dir} is where another gpudoctor profile (pid {pid}, started {started}) is "
                               "recording now; the script was not run: choose another directory with --out.")


def _job_bundles(run_dir: Path) -> list[Path]:
    """The bundles of an earlier job in `run_dir`: its ranks' and its launcher's, which this run's replace."""
    from gpudoctor.launch.followed import LAUNCHER_DIR

    found = [path for path in run_dir.glob("rank-*") if RANK_DIR.match(path.name) and path.is_dir()]
    launcher = run_dir / LAUNCHER_DIR
    return [*found, launcher] if (launcher / MANIFEST).is_file() or (launcher / EVENTS).is_file() else found


def stamped_dir(parent: Path, name: str) -> Path:
    """parent/name-YYYYmmdd-HHMMSS, with -2, -3, ... after it when that exists already."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir, suffix = parent / f"{name}-{stamp}", 1
    while run_dir.exists():
        suffix += 1
        run_dir = parent / f"{name}-{stamp}-{suffix}"
    return run_dir


def prepare_run_dir(run_dir: Path, earlier: Iterable[Path] = (), replaced: Iterable[Path] = ()) -> Path:
    """`run_dir` made, writable, and emptied of an earlier run's files (and of those of the `earlier` bundles in
    it; the `replaced` bundles are removed whole); its absolute path. Raises OutputNotWritableError, naming --out,
    when it cannot be written, or when its disk has less free than gpudoctor leaves to the script (before anything
    in it is touched)."""
    short = short_of_space(run_dir)
    if short is not None:
        raise OutputNotWritableError(
            f"{run_dir}: {short.strerror}; the script was not started: choose a directory with room with --out, "
            "or set GPUDOCTOR_MIN_FREE_MB.")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for directory in (run_dir, *earlier):
            _remove_previous_run(directory)
        for bundle in replaced:
            shutil.rmtree(bundle)
        probe = run_dir / f".write-test-{os.getpid()}"  # two nodes may prepare one shared directory at once
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputNotWritableError(
            f"cannot write to {run_dir} ({exc.strerror}); choose another directory with --out."
        ) from None
    return run_dir.resolve()


def _remove_previous_run(run_dir: Path) -> None:
    """An --out directory used before: its files would mix with this run's (events and samples are appended)."""
    for name in (MANIFEST, EVENTS, LOG, *trace_names(run_dir), FINDINGS, REPORT, DONE,
                 *(f"{SAMPLES_DIR}/{f}" for f in SAMPLE_FILES.values())):
        (run_dir / name).unlink(missing_ok=True)
