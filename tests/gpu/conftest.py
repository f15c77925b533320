"""The GPU suite: each job runs plainly and under `gpudoctor profile` on the GPU, and both must end alike.

Run on a machine with CUDA (`python -m pytest -m gpu tests/gpu`); without CUDA every test here is skipped. Each
comparison asserts the same exit status and the same `suite:` lines on stdout, a wall time within a bound of the
plain run's, no process of the job left running, and a report written. A table of the wall times is printed at the
end of the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import checked_findings, env_with

SCRIPTS = Path(__file__).resolve().parent / "scripts"
JOB_TIMEOUT_S = 300
# gpudoctor's fixed cost on a job (its start, the window, the analysis and the report: a few seconds on these
# machines, docs/performance.md) and the share of the plain time it may add while the script runs.
FIXED_S = 15.0
RATIO = 1.3
SETTLE_S = 10.0  # how long a job's processes get to be gone once its command has returned
TOKEN = "GPUDOCTOR_SUITE_TOKEN"
_rows: list[str] = []


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    count = None
    for item in items:
        if here not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        count = gpus() if count is None else count
        if count == 0:
            item.add_marker(pytest.mark.skip(reason="the GPU suite needs CUDA"))
        needed = item.get_closest_marker("gpus")
        if needed is not None and count and count < needed.args[0]:
            item.add_marker(pytest.mark.skip(reason=f"needs {needed.args[0]} GPUs, this machine has {count}"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _rows:
        terminalreporter.write_line("GPU suite: wall time plainly and under gpudoctor profile")
        for row in _rows:
            terminalreporter.write_line("  " + row)


def script(name: str) -> str:
    return str(SCRIPTS / name)


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    @property
    def lines(self) -> list[str]:
        """The script's own lines: library output (Lightning's, Hugging Face's) varies from run to run."""
        return [line for line in self.stdout.splitlines() if line.startswith("suite:")]


def _run(command: list[str], cwd: Path, token: str, timeout: float) -> Ran:
    env = env_with(**{TOKEN: token})
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{' '.join(command)} did not end within {timeout} s\n{out}\n{err}")
    status = 128 - process.returncode if process.returncode < 0 else process.returncode  # as a shell says it
    return Ran(status, out, err, time.monotonic() - started)


def _left_running(token: str) -> list[str]:
    """The processes whose environment carries this job's token: any is a process the job left behind."""
    needle = f"{TOKEN}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {command}")
        except OSError:
            continue
    return found


def assert_nothing_left(token: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while (left := _left_running(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left running: {left}"


@dataclass
class Pair:
    plain: Ran
    profiled: Ran
    run_dir: Path


class Suite:
    """Runs one job plainly, then under gpudoctor, in a fresh working directory each."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.tmp_path = tmp_path
        self.name = name

    def plain(self, command: list[str], timeout: float = JOB_TIMEOUT_S) -> Ran:
        return self._once("plain", command, timeout)

    def profiled(self, options: list[str], command: list[str], timeout: float = JOB_TIMEOUT_S) -> tuple[Ran, Path]:
        """`gpudoctor profile --out run OPTIONS` of `command`, which is `python SCRIPT ARGS` run plainly."""
        target = command[1:] if command[0] == sys.executable else command
        gpudoctor = [sys.executable, "-m", "gpudoctor", "profile", "--out", "run", *options]
        return self._once("gpudoctor", gpudoctor + target, timeout), self.tmp_path / "gpudoctor" / "run"

    def _once(self, how: str, command: list[str], timeout: float) -> Ran:
        cwd = self.tmp_path / how
        cwd.mkdir(exist_ok=True)
        token = uuid.uuid4().hex
        ran = _run(command, cwd, token, timeout)
        assert_nothing_left(token)
        return ran

    def compare(self, command: list[str], options: list[str] | None = None,
                gpudoctor_command: list[str] | None = None) -> Pair:
        """The same job plainly and under gpudoctor: the same status and lines, a bounded wall time, a report."""
        plain = self.plain(command)
        profiled, run_dir = self.profiled(options or [], gpudoctor_command or command)
        self.record(plain, profiled)
        assert profiled.returncode == plain.returncode, f"plain:\n{plain.stderr}\nunder gpudoctor:\n{profiled.stderr}"
        assert profiled.lines == plain.lines, profiled.stderr
        assert_within_bound(profiled.wall_s, plain.wall_s)
        assert_reported(run_dir)
        return Pair(plain, profiled, run_dir)

    def record(self, plain: Ran | None, profiled: Ran) -> None:
        before = f"plain {plain.wall_s:6.1f} s (exit {plain.returncode})" if plain else "plain      -"
        _rows.append(f"{self.name:<48} {before}   gpudoctor {profiled.wall_s:6.1f} s (exit {profiled.returncode})")


def assert_within_bound(profiled_s: float, plain_s: float) -> None:
    bound = plain_s * RATIO + FIXED_S
    assert profiled_s <= bound, f"{profiled_s:.1f} s under gpudoctor, over {bound:.1f} s (plain {plain_s:.1f} s)"


def assert_reported(run_dir: Path) -> None:
    assert (run_dir / "report.html").is_file(), f"no report in {run_dir}"
    checked_findings(run_dir / "findings.json")


@pytest.fixture
def suite(tmp_path: Path, request: pytest.FixtureRequest) -> Suite:
    return Suite(tmp_path, request.node.name)
