"""Helpers shared by the tests: run `python -m gpudoctor ...` for real, in a temporary working directory.

The tests run gpudoctor from this checkout (PYTHONPATH), as a separate process, the way a user runs it. Those that
start processes (gpudoctor's command line, a script under gpudoctor, torchrun) are marked `e2e`: by the fixtures
below that run gpudoctor (E2E_FIXTURES), by their module (`pytestmark`) or one by one; `pytest -m "not e2e"` runs
the others, in a few minutes. A test without the mark that starts a process fails, saying so.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import jsonschema
import pytest

from gpudoctor.bundle import read_jsonl
from gpudoctor.bundle.events import EVENT_DECODER, AnyEvent
from gpudoctor.paths import findings_schema

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
E = TypeVar("E", bound=AnyEvent)

# The fixtures that run gpudoctor: a test that uses one is an end-to-end test.
E2E_FIXTURES = frozenset({"gd", "training_run", "bundle_copy"})


GPU_SUITE = Path(__file__).resolve().parent / "gpu"  # its jobs run on a GPU, plainly and under gpudoctor


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())) or GPU_SUITE in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)


def _no_process(*args: object, **kwargs: object) -> None:
    raise AssertionError("this test starts a process: mark it @pytest.mark.e2e (or its module, pytestmark), so that "
                         '`pytest -m "not e2e"` stays the fast subset')


@pytest.fixture(autouse=True)
def _processes_only_in_e2e(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test outside the e2e mark starts no process."""
    if request.node.get_closest_marker("e2e") is None:
        monkeypatch.setattr(subprocess.Popen, "__init__", _no_process)


# A small profiling window, so that a trace is written after a handful of steps.
WINDOW = ("--wait-steps", "1", "--warmup-steps", "1", "--active-steps", "2", "--detail-steps", "1")
RUN_TIMEOUT_S = 180  # a test that hangs fails instead of blocking the suite


def default_sigint() -> None:
    """In a gpudoctor the tests start: Ctrl-C's default disposition, as a terminal gives it. A suite started in the
    background of a non-interactive shell inherits SIGINT ignored, and gpudoctor, like the script, keeps what it
    inherits: the tests of Ctrl-C would then test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def script(name: str) -> str:
    return str(SCRIPTS / name)


def env_with(**extra: str) -> dict[str, str]:
    """The environment gpudoctor (and plain python, for comparisons) runs in: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("PYTHONSTARTUP", None)
    env.update(extra)
    return env


def _refuse_constant(constant: str) -> float:
    raise ValueError(f"findings.json holds {constant}, which is not JSON")


@functools.cache
def _findings_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(findings_schema().read_text(encoding="utf-8")))


def checked_findings(path: Path) -> dict:
    """A findings.json that gpudoctor wrote, read strictly and validated against its schema (every test that reads
    one through here checks the contract as well)."""
    document = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    errors = sorted(_findings_validator().iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, f"{path} breaks the schema: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5])
    return document


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path | None

    @property
    def messages(self) -> list[str]:
        """gpudoctor's own lines on stderr (not the script's)."""
        return [line for line in self.stderr.splitlines() if line.startswith("gpudoctor:")]

    @property
    def first_message(self) -> str:
        assert self.messages, f"gpudoctor printed no message; stderr was:\n{self.stderr}"
        return self.messages[0]

    def manifest(self) -> dict:
        return json.loads((self.run_dir / "manifest.json").read_text())

    def findings(self) -> dict:
        """findings.json, checked: strict JSON (no NaN or Infinity) that the shipped schema accepts."""
        return checked_findings(self.run_dir / "findings.json")

    def events(self, kind: type[E], bundle: str = "") -> list[E]:
        """The run's events of one kind, as the bundle's records (e.g. `result.events(StepEvent)`); of one bundle
        of a job's run directory with `bundle` (`rank-1`, `launcher`)."""
        written = read_jsonl(self.run_dir / bundle / "events.jsonl", EVENT_DECODER)
        return [e for e in written if isinstance(e, kind)]

    def __str__(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def _run_dir_of(args: tuple[str, ...], stderr: str, cwd: Path) -> Path | None:
    """The run directory: --out when given (before the script), else the one the report line names."""
    if "--out" in args:
        return cwd / args[args.index("--out") + 1]
    match = re.search(r"^  report: (.+)/report\.html$", stderr, re.MULTILINE)
    return Path(match.group(1)) if match else None


class Gpudoctor:
    """Runs the gpudoctor CLI in `cwd`, a fresh temporary directory."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpudoctor", *args]

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT_S) -> Result:
        done = subprocess.run(
            self.command(*args), cwd=self.cwd, env=env or env_with(), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout, preexec_fn=default_sigint,
        )
        return Result(done.returncode, done.stdout, done.stderr, _run_dir_of(args, done.stderr, self.cwd))

    def profile(self, target: str, *script_args: str, options: tuple[str, ...] = WINDOW, out: str | None = "run",
                env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT_S) -> Result:
        """`gpudoctor profile [--out out] OPTIONS target ARGS`."""
        out_args = ("--out", out) if out else ()
        return self.run("profile", *out_args, *options, target, *script_args, env=env, timeout=timeout)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start gpudoctor without waiting for it (to signal it while it runs)."""
        return subprocess.Popen(
            self.command(*args), cwd=self.cwd, env=env or env_with(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=default_sigint,  # noqa: PLW1509 - one signal call, safe between fork and exec
        )


@pytest.fixture(scope="session", autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """gpudoctor's state (the secret its command records are keyed with, gpudoctor.launch.command_record) in a folder
    of the tests' own, for gpudoctor in this process and in those the tests start, never the user's."""
    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(state))
        yield state


@pytest.fixture
def gd(tmp_path: Path) -> Gpudoctor:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return Gpudoctor(cwd)


@pytest.fixture(scope="session")
def training_run(tmp_path_factory: pytest.TempPathFactory) -> Result:
    """One real profile of the training-loop fixture, shared by the tests that only read its bundle.

    8 optimizer steps of batch 4, each sample sleeping 5 ms in the main process.
    """
    cwd = tmp_path_factory.mktemp("training")
    result = Gpudoctor(cwd).profile(script("train_loop.py"), "--steps", "8", "--batch-size", "4", "--sleep-ms", "5",
                                    "--report", str(cwd / "script_report.json"))
    assert result.returncode == 0, result
    return result


@pytest.fixture
def bundle_copy(training_run: Result, tmp_path: Path) -> Path:
    """A private copy of the shared training run's bundle, for tests that change or break it."""
    copy = tmp_path / "bundle"
    shutil.copytree(training_run.run_dir, copy)
    return copy
