"""docs/custom-rules.md runs as a test: the files it shows are docs/examples/ verbatim; its commands run in
order, in a fresh directory holding the files shown so far, and print what it shows; and each example rule
finds what the page says it finds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Gpudoctor, env_with
from gpudoctor.engine import load_rules
from gpudoctor.testing import BundleBuilder, assert_fires, assert_not_evaluated, assert_silent, load_fixture, run_rule

DOC = REPO / "docs" / "custom-rules.md"
EXAMPLES = REPO / "docs" / "examples"
BLOCK = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str, str]]:
    """(language, title, body) of each fenced block; a titled block shows the file docs/examples/TITLE."""
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def example(name: str):
    [r] = load_rules([str(EXAMPLES / "team_rules" / f"{name}.py")], builtins=False, packages=False)
    return r


@pytest.mark.e2e
def test_the_page_shows_every_example_file_as_it_is() -> None:
    shown = {title: body for _, title, body in blocks() if title}
    files = {p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert set(shown) == files
    for title, body in shown.items():
        expected = (EXAMPLES / title).read_text(encoding="utf-8")
        assert body == expected, f"the page's {title} is not docs/examples/{title}"


# -- the walk-through, as a new user follows it ------------------------------------------------------
def _commands(body: str) -> list[tuple[str, list[str]]]:
    """`$ command` lines, each with the output lines shown under it."""
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line)
    return commands


def _matches(expected: list[str], output: str) -> bool:
    """Line by line, as shown; a line `...` stands for any number of lines, `...` in a line for any text."""
    parts = [r"(?:[^\n]*\n)*?" if line == "..." else "[^\n]*".join(map(re.escape, line.rstrip().split("..."))) + r"\n"
             for line in expected]
    actual = "".join(line.rstrip() + "\n" for line in output.splitlines())
    return re.fullmatch("".join(parts), actual) is not None


def _shell_env(bin_dir: Path) -> dict[str, str]:
    """`gpudoctor` and `python` on the PATH, both this interpreter running this checkout."""
    bin_dir.mkdir()
    for name, command in (("gpudoctor", f'"{sys.executable}" -m gpudoctor'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = env_with()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.e2e
def test_the_walk_through_runs_as_shown(tmp_path: Path) -> None:
    project = tmp_path / "acme"
    project.mkdir()
    (project / "fixtures").symlink_to(REPO / "fixtures")  # "Before you start"
    env = _shell_env(tmp_path / "bin")
    ran = 0
    for language, title, body in blocks():
        if title:  # the reader saves the file
            (project / title).parent.mkdir(parents=True, exist_ok=True)
            (project / title).write_text(body, encoding="utf-8")
        elif language == "console":
            for command, expected in _commands(body):
                done = subprocess.run(command, shell=True, cwd=project, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
                assert _matches(expected, done.stdout), f"$ {command}\n--- the page shows\n" + "\n".join(expected) + \
                    f"\n--- it printed (exit {done.returncode})\n{done.stdout}"
                ran += 1
    assert ran >= 15


def test_the_output_matcher_is_strict() -> None:
    assert _matches(["a", "...", "d ... f"], "a\nb\nc\nd e f\n")
    assert not _matches(["a", "d ... f"], "a\nb\nd e f\n")  # a line skipped without `...`
    assert not _matches(["a"], "a\nb\n")


# -- what each example finds ---------------------------------------------------------------------------
def test_slow_loader_wait_finds_the_long_waits_of_the_recorded_runs() -> None:
    rule = example("nfs_loader_wait")
    [finding] = run_rule(rule, load_fixture("data_starvation_cpu_bound_bad"))
    assert finding["title"] == "2 of 30 steps waited more than 200 ms for data"
    assert finding["location"]["line"] == 85
    assert_silent(rule, load_fixture("data_starvation_bad"))  # every step waits, but under 200 ms
    assert_fires(rule, load_fixture("data_starvation_bad"), count=1, options={"max_wait_s": 0.1},
                 title="25 of 25 steps waited more than 100 ms")
    assert_silent(rule, load_fixture("data_starvation_fixed"))


def test_sync_in_training_step_flags_syncs_by_the_function_they_are_in(tmp_path: Path) -> None:
    rule = example("training_step_syncs")
    b = BundleBuilder(tmp_path)
    b.steps(5, wall_s=0.1, gpu_busy_s=0.08)
    b.sync("item", host_s=0.002, site=("model.py", 88, "training_step"))
    b.sync("print", host_s=0.002, site=("train.py", 30, "log_metrics"))
    run = b.build()
    findings = assert_fires(rule, run, count=1, location=("model.py", 88, "training_step"),
                            title="item in training_step() waits for the GPU 1x per step")
    assert findings[0]["impact"] == pytest.approx(0.02, abs=0.001)
    assert len(run_rule(rule, run, functions=("training_step", "log_metrics"))) == 2
    recorded = load_fixture("sync_point_bad")
    assert_silent(rule, recorded)
    lines = {f["location"]["line"] for f in run_rule(rule, recorded, functions=("main",))}
    assert lines == {64, 69, 72, 74, 75}


def test_loader_settings_checks_each_loader_against_the_policy() -> None:
    rule = example("loader_settings")
    [finding] = run_rule(rule, load_fixture("fork_after_cuda_bad"))
    assert finding["title"] == "DataLoader over Spectra does not set persistent_workers=True"
    assert (finding["location"]["line"], finding["impact"]) == (76, None) and finding["impact_reason"]
    assert_fires(rule, load_fixture("data_starvation_bad"), count=1, title="does not set pin_memory=True")
    assert_silent(rule, load_fixture("data_starvation_bad"), options={"require_pin_memory": False})
    assert_silent(rule, load_fixture("healthy_vision"))
    assert_not_evaluated(rule, load_fixture("sync_point_bad"), "no DataLoader")


def test_the_package_example_installs_and_its_rules_are_listed(gd: Gpudoctor, tmp_path: Path) -> None:
    """Section 8, with `pip install --target` so that nothing is installed into this environment."""
    package = tmp_path / "acme-gpudoctor-rules"
    for title in ("acme-gpudoctor-rules/pyproject.toml", "acme-gpudoctor-rules/acme_rules/__init__.py"):
        (package / Path(title).relative_to("acme-gpudoctor-rules")).parent.mkdir(parents=True, exist_ok=True)
        (package / Path(title).relative_to("acme-gpudoctor-rules")).write_text((EXAMPLES / title).read_text())
    for name in ("nfs_loader_wait", "training_step_syncs", "loader_settings"):
        (package / "acme_rules" / f"{name}.py").write_text((EXAMPLES / "team_rules" / f"{name}.py").read_text())
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(package)], check=True, capture_output=True, cwd=tmp_path)
    listed = gd.run("rules", "list", env=env_with(PYTHONPATH=f"{REPO}{os.pathsep}{site}"))
    assert listed.returncode == 0, listed
    shown = next(body for language, _, body in blocks() if language == "text" and "package:" in body)
    for line in shown.splitlines():
        assert line in listed.stdout.splitlines(), listed.stdout


def test_the_category_table_names_every_category_with_the_slices_it_claims() -> None:
    from gpudoctor.analysis.budget import SLICES_OF_CATEGORY
    from gpudoctor.vocabulary import CATEGORIES

    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|$", DOC.read_text(encoding="utf-8"), re.MULTILINE)
    table = {name: tuple(re.findall(r"`(\w+)`", slices)) for name, slices in rows if name in CATEGORIES}
    assert set(table) == set(CATEGORIES)
    assert all(set(table[name]) == set(SLICES_OF_CATEGORY.get(name, ())) for name in CATEGORIES), table
