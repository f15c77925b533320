"""`gpudoctor profile` starts the script before it imports the analysis and loads the built-in rules; rules that
come from the user (--rules, --select, pyproject.toml's [tool.gpudoctor]) are still checked before the script runs."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import RUN_TIMEOUT_S, Gpudoctor, env_with

# Writes a marker file when it runs, then ends with the status it is given.
MARKED = "import pathlib, sys\npathlib.Path('ran').write_text('yes')\nsys.exit(int(sys.argv[1]))\n"

# Runs `gpudoctor ARGS` in this process, first saying on stderr, as the script's process is started, whether the
# analysis was imported by then; with `broken`, loading the rules fails as a bug in gpudoctor's rules would.
DRIVER = """
import subprocess, sys
import gpudoctor.errors
started = subprocess.Popen.__init__

def start(self, *args, **kwargs):
    print(f"analysis imported at the start: {'gpudoctor.analysis' in sys.modules}", file=sys.stderr)
    return started(self, *args, **kwargs)

subprocess.Popen.__init__ = start
if sys.argv[1] == "broken":
    import gpudoctor.pipeline
    def refuse(selection, project_dir=None):
        raise gpudoctor.errors.RuleLoadError("the built-in rules are broken")
    gpudoctor.pipeline.prepare_rules = refuse
sys.argv = ["gpudoctor", *sys.argv[2:]]
from gpudoctor.cli import main
main()
"""


def _drive(gd: Gpudoctor, mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", DRIVER, mode, *args], cwd=gd.cwd, env=env_with(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def test_the_script_starts_before_the_analysis_is_imported(gd: Gpudoctor) -> None:
    (gd.cwd / "job.py").write_text(MARKED)
    done = _drive(gd, "plain", "profile", "--out", "run", "--format", "json", "job.py", "0")
    assert done.returncode == 0, done.stderr
    assert "analysis imported at the start: False" in done.stderr
    assert (gd.cwd / "ran").is_file()
    assert (gd.cwd / "run" / "findings.json").is_file()  # the rules were loaded while it ran, and used after


def test_rules_that_fail_to_load_while_the_script_runs_are_reported_after_it(gd: Gpudoctor) -> None:
    (gd.cwd / "job.py").write_text(MARKED)
    done = _drive(gd, "broken", "profile", "--out", "run", "job.py", "3")
    assert done.returncode == 3, done.stderr  # the script's own status
    assert (gd.cwd / "ran").is_file()
    said = [line for line in done.stderr.splitlines() if line.startswith("gpudoctor:")]
    assert said == ["gpudoctor: job.py exited with status 3.",
                    (f"gpudoctor: the bundle was written to {gd.cwd / 'run'}, but the rules could not be loaded: "
                     "the built-in rules are broken")], said
    assert (gd.cwd / "run" / "manifest.json").is_file()
    assert not (gd.cwd / "run" / "findings.json").exists()


def test_a_rule_file_that_cannot_be_used_stops_profile_before_the_script_runs(gd: Gpudoctor) -> None:
    (gd.cwd / "job.py").write_text(MARKED)
    (gd.cwd / "bad.py").write_text("this is not python\n")
    result = gd.run("profile", "--out", "run", "--rules", "bad.py", "job.py", "0")
    assert result.returncode == 2, result
    assert not (gd.cwd / "ran").exists()


def test_a_bad_setting_in_pyproject_stops_profile_before_the_script_runs(gd: Gpudoctor) -> None:
    (gd.cwd / "job.py").write_text(MARKED)
    (gd.cwd / "pyproject.toml").write_text("[tool.gpudoctor.rules.GD101]\nno_such_option = 1\n")
    result = gd.run("profile", "--out", "run", "job.py", "0")
    assert result.returncode == 2, result
    assert "no_such_option" in result.stderr
    assert not (gd.cwd / "ran").exists()


# Runs `gpudoctor ARGS` in this process and says, once it has exited, which interpreters gpudoctor started ahead
# of time and whether each is still running.
AHEAD = """
import atexit, os, subprocess, sys
started = []
opened = subprocess.Popen.__init__

def start(self, *args, **kwargs):
    opened(self, *args, **kwargs)
    if "main_when_told" in " ".join(args[0]):
        started.append(self)

def report():
    for process in started:
        print(f"ahead: pid {process.pid} {'running' if process.poll() is None else 'ended'}", file=sys.stderr)

atexit.register(report)  # registered first, it runs after gpudoctor's own exit handlers
subprocess.Popen.__init__ = start
sys.argv = ["gpudoctor", *sys.argv[1:]]
from gpudoctor.cli import main
main()
"""
# Says what the script's process was given: its environment's additions and where it found gpudoctor's hook.
ENVIRONMENT = ("import os, sys\nprint('follow:', 'GPUDOCTOR_FOLLOW' in os.environ)\n"
               "print('hook first:', os.environ['PYTHONPATH'].split(os.pathsep)[0].endswith('hook'))\n"
               "print('argv:', sys.argv[1:])\n")


def _ahead(gd: Gpudoctor, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", AHEAD, *args], cwd=gd.cwd, env=env_with(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def test_the_scripts_interpreter_is_started_while_the_command_line_is_read(gd: Gpudoctor) -> None:
    (gd.cwd / "job.py").write_text(ENVIRONMENT)
    done = _ahead(gd, "profile", "--out", "run", "--format", "json", "job.py", "--lr", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["follow: True", "hook first: True", "argv: ['--lr', '3']"]
    ahead = [line for line in done.stderr.splitlines() if line.startswith("ahead:")]
    assert len(ahead) == 1 and ahead[0].endswith("ended"), done.stderr
    pid = int(ahead[0].split()[2])
    assert json.loads((gd.cwd / "run" / "manifest.json").read_text())["child"]["process"]["pid"] == pid


def test_an_interpreter_started_ahead_for_nothing_ends_with_gpudoctor(gd: Gpudoctor) -> None:
    (gd.cwd / "job.py").write_text(MARKED)
    done = _ahead(gd, "profile", "--fail-on", "bogus", "job.py", "0")
    assert done.returncode == 2, done.stderr
    ahead = [line for line in done.stderr.splitlines() if line.startswith("ahead:")]
    assert len(ahead) == 1 and ahead[0].endswith("ended"), done.stderr
    assert not (gd.cwd / "ran").exists()
    assert "Traceback" not in done.stderr
