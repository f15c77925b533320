"""What torch and Kineto print around gpudoctor's own profiler calls goes to RUN_DIR/gpudoctor.log, not the terminal;
the script's own stdout and stderr pass through whole and in order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WINDOW, Gpudoctor, env_with
from gpudoctor.ui.status_line import LINE_PREFIX

# Prints to stdout and stderr at every step, from the main thread and from a thread that writes all along,
# so that some of its lines are written while gpudoctor is inside a profiler call.
CHATTY = """\
import sys
import threading
import time

import torch

def other_thread():
    for i in range(300):
        sys.stderr.write(f"thread {i}\\n")  # one write a line: two threads' print()s interleave, gpudoctor or not
        time.sleep(0.002)

thread = threading.Thread(target=other_thread)
thread.start()
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    sys.stderr.write(f"step {step} err\\n")
    print(f"step {step} out")
thread.join()
"""

# Marks its steps without importing torch: gpudoctor's own import of torch, for the profiler, is the first.
NO_TORCH = """\
import sys
import gpudoctor

for step in range(8):
    gpudoctor.step()
    print(f"step {step} err", file=sys.stderr)
"""

KINETO_LINES = ("USDT:", "profiler_start", "profiler_stop", "output_json.cpp", "SyncActivityProfilerHandler")


@pytest.fixture
def numpy_missing(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import numpy` fails as if it were not installed: torch then warns about it."""
    fake = tmp_path / "no-numpy" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    env = env_with()
    env["PYTHONPATH"] = f"{fake.parent}:{env['PYTHONPATH']}"
    return env


def _script_lines(stderr: str) -> list[str]:
    """The script's lines: not gpudoctor's messages, nor its progress lines (stderr is a pipe here)."""
    return [line for line in stderr.splitlines() if not line.startswith(("gpudoctor:", "  ", LINE_PREFIX))]


def test_the_scripts_output_passes_through_and_kinetos_goes_to_the_log(gd: Gpudoctor) -> None:
    (gd.cwd / "chatty.py").write_text(CHATTY)
    result = gd.profile("chatty.py", options=WINDOW)
    assert result.returncode == 0, result
    assert not [line for line in result.stderr.splitlines() if line.startswith(KINETO_LINES)], result.stderr
    assert result.stdout.splitlines() == [f"step {i} out" for i in range(10)]
    lines = _script_lines(result.stderr)
    assert [line for line in lines if line.startswith("step")] == [f"step {i} err" for i in range(10)]
    assert [line for line in lines if line.startswith("thread")] == [f"thread {i}" for i in range(300)]
    log = (result.run_dir / "gpudoctor.log").read_text()
    assert "step " not in log and "thread " not in log
    assert "profiler_start" in log or not log  # what Kineto prints varies with torch's build


def test_a_warning_from_gpudoctors_import_of_torch_goes_to_the_log(gd: Gpudoctor, numpy_missing: dict) -> None:
    (gd.cwd / "no_torch.py").write_text(NO_TORCH)
    result = gd.profile("no_torch.py", options=WINDOW, env=numpy_missing)
    assert result.returncode == 0, result
    assert "NumPy" not in result.stderr, result.stderr
    assert _script_lines(result.stderr) == [f"step {i} err" for i in range(8)]
    assert "Failed to initialize NumPy" in (result.run_dir / "gpudoctor.log").read_text()


def test_a_warning_from_the_scripts_own_import_of_torch_is_the_scripts(gd: Gpudoctor, numpy_missing: dict) -> None:
    """As under plain python: the script's stderr is not filtered."""
    (gd.cwd / "chatty.py").write_text(CHATTY)
    plain = subprocess.run([sys.executable, "chatty.py"], cwd=gd.cwd, env=numpy_missing, capture_output=True,
                           text=True, timeout=120)
    result = gd.profile("chatty.py", options=WINDOW, env=numpy_missing)
    assert result.returncode == 0, result
    assert ("Failed to initialize NumPy" in result.stderr) == ("Failed to initialize NumPy" in plain.stderr)


LINES_IN_A_CALL = """\
import os, sys, warnings
from pathlib import Path
from gpudoctor.collect.window import ProfilerChatter

print("before", file=sys.stderr, flush=True)
chatter = ProfilerChatter(Path(sys.argv[1]))
with chatter.quiet():
    os.write(2, b"USDT:2026-11-23 12:02:54 11726:11726 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
    os.write(2, b"a line of the script, from another thread\\n")
    os.write(2, b"ERROR:2026-11-23 12:02:55 11726:11726 output_json.cpp:585] Failed to write\\n")
    warnings.warn("Failed to initialize NumPy")
    with chatter.quiet():  # nested, as when a signal handler closes the window inside a call
        os.write(2, b"[W1123 12:02:56.123456789 tensor_numpy.cpp:84] Warning: chatter\\n")
print("after", file=sys.stderr)
"""


@pytest.mark.e2e
def test_lines_written_during_a_call_are_sorted_between_terminal_and_log(tmp_path: Path) -> None:
    log = tmp_path / "gpudoctor.log"
    done = subprocess.run([sys.executable, "-c", LINES_IN_A_CALL, str(log)], env=env_with(), capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stderr == "before\na line of the script, from another thread\nafter\n"
    kept = log.read_text().splitlines()
    assert [line.split(" ")[0] for line in kept[:3]] == ["USDT:2026-11-23", "ERROR:2026-11-23", "[W1123"]
    assert "UserWarning: Failed to initialize NumPy" in kept[3]
