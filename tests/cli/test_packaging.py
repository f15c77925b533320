"""A wheel installed (not editable) into a fresh virtual environment works on its own: rules and templates ship inside.

The venv sees the system's packages (torch and the other dependencies) but gets gpudoctor only from the wheel,
and runs from a directory outside the repository without PYTHONPATH, so nothing can come from the checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, WINDOW, script

pytestmark = pytest.mark.e2e  # every test here starts processes

SOURCES = ("pyproject.toml", "README.md", "gpudoctor", "rules", "templates")


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _build_wheel(work: Path) -> Path:
    """Build from a copy of the files the wheel is made of, so the checkout is left as it is."""
    source = work / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, source / name)
    # Without hatchling at hand, pip fetches it into an isolated build environment.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", work / "dist", source, cwd=work)
    wheels = list((work / "dist").glob("gpudoctor-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _make_venv(venv: Path, cwd: Path) -> None:
    """A venv with the system's packages; when the tests run in a venv themselves, with that venv's packages too.

    The extra paths are plain entries of a .pth file, so the .pth files inside them (an editable gpudoctor's
    among them) are not processed.
    """
    _run(sys.executable, "-m", "venv", "--system-site-packages", venv, cwd=cwd)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    outer = venv / "lib" / version / "site-packages" / "_outer_packages.pth"
    outer.write_text("\n".join(site.getsitepackages()) + "\n")


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join((str(venv / "bin"), env.get("PATH", "")))
    return env


def test_wheel_in_a_fresh_venv(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    _make_venv(venv, tmp_path)
    env = _clean_env(venv)
    # --force-reinstall: an editable gpudoctor in the system site-packages must not count as already installed.
    _run(venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--force-reinstall", wheel,
         cwd=tmp_path, env=env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    located = json.loads(_run(
        venv / "bin" / "python", "-c",
        "import json, gpudoctor, gpudoctor.paths as p; "
        "print(json.dumps([gpudoctor.__file__, str(p.templates_dir()), str(p.builtin_rules_dir()), "
        "str(p.findings_schema()) if p.findings_schema().is_file() else 'missing: findings.schema.json']))",
        cwd=elsewhere, env=env,
    ).strip().splitlines()[-1])
    for path in located:
        assert Path(path).resolve().is_relative_to(venv.resolve()), located

    gpudoctor = venv / "bin" / "gpudoctor"
    assert _run(gpudoctor, "--version", cwd=elsewhere, env=env).strip().startswith("gpudoctor ")
    listed = _run(gpudoctor, "rules", "list", cwd=elsewhere, env=env)
    assert "GD101" in listed and "built-in" in listed

    shutil.copy(script("train_loop.py"), elsewhere / "train.py")
    _run(gpudoctor, "profile", "--out", "run", *WINDOW, "train.py", "--steps", "5", "--sleep-ms", "1",
         cwd=elsewhere, env=env)
    report = elsewhere / "run" / "report.html"
    assert report.is_file() and "<!DOCTYPE html>" in report.read_text()
    findings = json.loads((elsewhere / "run" / "findings.json").read_text())
    assert findings["run"]["steps_total"] == 5
    assert (elsewhere / "run" / "trace.json.gz").is_file()
