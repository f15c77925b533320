"""`gpudoctor profile` starts the script before it imports the analysis and loads the built-in rules; rules that
come from the user (--rules, --select, pyproject.toml's [tool.gpudoctor]) are still checked before the script runs."""

from __future__ import annotations

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
    import gpudoctor.diagnose
    def refuse(selection, project_dir=None):
        raise gpudoctor.errors.RuleLoadError("the built-in rules are broken")
    gpudoctor.diagnose.prepare_rules = refuse
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
