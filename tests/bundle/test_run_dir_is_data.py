"""A run directory is data, often someone else's: the commands that read one (analyze, diff, the job merge) never
follow a link out of it, never write outside it, and never import code it holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import Gpudoctor
from gpudoctor.testing import BundleBuilder
from gpudoctor.trying.outputs import KeptOutputs, WorkingDirectory

STEPS = 8


def _bundle(path: Path, pid: int = 4000) -> Path:
    """A small bundle with a trace: its DataLoader loads in the main process, and the GPU waits for it."""
    b = BundleBuilder(path, pid=pid)
    b.loader(num_workers=0)
    for step in b.steps(STEPS, wall_s=0.020, data_wait_s=0.010):
        b.kernels([(step, 0.011, 0.008, "sm90_xmma_gemm_f32f32_tf32f32_f32_nn")])
    return b.write()


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A folder outside every run directory, with a file of the user's in it."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "precious.txt").write_text("the user's own file\n")
    return folder


def test_a_rank_linked_out_of_a_job_is_neither_read_nor_written(gd: Gpudoctor, elsewhere: Path) -> None:
    _bundle(gd.cwd / "job" / "rank-0")
    _bundle(elsewhere / "rank-1", pid=4100)
    (gd.cwd / "job" / "rank-1").symlink_to(elsewhere / "rank-1", target_is_directory=True)
    outside = sorted(elsewhere.rglob("*"))
    result = gd.run("analyze", "job")
    assert result.returncode == 0, result
    assert sorted(elsewhere.rglob("*")) == outside  # no report written there
    report = (gd.cwd / "job" / "report.html").read_text()
    assert "elsewhere" in report and 'href="rank-1' not in report and 'href="rank-0/report.html"' in report
    assert "outside the run directory" in report


def test_a_trace_linked_out_of_the_run_directory_is_refused(gd: Gpudoctor, elsewhere: Path) -> None:
    run = _bundle(gd.cwd / "run")
    shutil.move(run / "trace.json.gz", elsewhere / "trace.json.gz")
    (run / "trace.json.gz").symlink_to(elsewhere / "trace.json.gz")
    result = gd.run("analyze", "run")
    assert result.returncode == 65, result
    assert result.first_message == (f"gpudoctor: run/trace.json.gz is a link to {elsewhere / 'trace.json.gz'}, "
                                    "outside the run directory run: gpudoctor reads a run directory's files only "
                                    "inside it.")
    assert not (run / "findings.json").exists()


def test_a_manifest_that_lists_a_file_outside_the_run_directory_is_refused(gd: Gpudoctor) -> None:
    run = _bundle(gd.cwd / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["files"].append("../elsewhere/precious.txt")
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = gd.run("analyze", "run")
    assert result.returncode == 65, result
    assert result.first_message == ("gpudoctor: run's manifest lists ../elsewhere/precious.txt, which is not inside "
                                    "the run directory: gpudoctor reads a run directory's files only inside it.")


def test_analyze_replaces_outputs_that_are_links_and_never_writes_through_them(gd: Gpudoctor, elsewhere: Path) -> None:
    run = _bundle(gd.cwd / "run")
    precious = elsewhere / "precious.txt"
    for name in ("findings.json", "report.html", ".findings.json.tmp"):
        (run / name).symlink_to(precious)
    result = gd.run("analyze", "run")
    assert result.returncode == 0, result
    assert precious.read_text() == "the user's own file\n"
    assert not (run / "findings.json").is_symlink() and json.loads((run / "findings.json").read_text())["findings"]
    assert not (run / "report.html").is_symlink()


def test_diff_writes_nothing_into_the_job_it_analyses(gd: Gpudoctor) -> None:
    for rank in (0, 1):
        _bundle(gd.cwd / "job" / f"rank-{rank}", pid=4000 + 100 * rank)
    before = sorted(p.relative_to(gd.cwd) for p in (gd.cwd / "job").rglob("*"))
    result = gd.run("diff", "job", "job")
    assert result.returncode == 0, result
    assert sorted(p.relative_to(gd.cwd) for p in (gd.cwd / "job").rglob("*")) == before


def test_diff_refuses_a_findings_json_linked_out_of_its_run_directory(gd: Gpudoctor, elsewhere: Path) -> None:
    run = _bundle(gd.cwd / "run")
    assert gd.run("analyze", "run", "--format", "json").returncode == 0
    shutil.move(run / "findings.json", elsewhere / "findings.json")
    (run / "findings.json").symlink_to(elsewhere / "findings.json")
    result = gd.run("diff", "run", "run")
    assert result.returncode == 65, result
    assert result.first_message.startswith("gpudoctor: run/findings.json is a link to ")


def test_the_traces_of_a_tensorboard_directory_that_lead_out_of_it_are_not_read(gd: Gpudoctor,
                                                                                 elsewhere: Path) -> None:
    run = _bundle(elsewhere / "run")
    (gd.cwd / "log").mkdir()
    (gd.cwd / "log" / "worker0.1700000000.pt.trace.json.gz").symlink_to(run / "trace.json.gz")
    result = gd.run("analyze", "log")
    assert result.returncode == 65, result
    assert "holds no *.pt.trace.json traces" in result.first_message


def test_a_pyproject_inside_a_run_directory_loads_no_rules(gd: Gpudoctor) -> None:
    """`cd RUN && gpudoctor analyze .`: the [tool.gpudoctor] rules a received directory names are never imported."""
    run = _bundle(gd.cwd / "run")
    marker = gd.cwd / "imported"
    (run / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (run / "pyproject.toml").write_text('[tool.gpudoctor]\nrules = ["evil.py"]\n')
    for args in (("analyze", "."), ("diff", ".", "."), ("try", "--yes", ".")):
        result = Gpudoctor(run).run(*args)
        assert result.returncode == 2, result
        assert result.first_message == (f"gpudoctor: {run / 'pyproject.toml'} lies inside the run directory ., which "
                                        "gpudoctor reads as data: its [tool.gpudoctor] settings and rules are not "
                                        "loaded from there; run gpudoctor from your project's directory instead.")
        assert not marker.exists()


def test_the_kept_outputs_are_never_written_through_a_link(tmp_path: Path, elsewhere: Path) -> None:
    """A store planted as a link out of the tries' folder is replaced; a folder of the working directory that a try
    made a link out of it is not written through when the run's own files are put back."""
    cwd = tmp_path / "cwd"
    (cwd / "ckpt").mkdir(parents=True)
    (cwd / "ckpt" / "model.pt").write_text("the run's\n")
    store = tmp_path / "run" / "tries" / ".kept"
    store.parent.mkdir(parents=True)
    store.symlink_to(elsewhere, target_is_directory=True)
    directory = WorkingDirectory(cwd, ())
    kept = KeptOutputs(directory, ["ckpt/model.pt"], store)
    assert not store.is_symlink() and (store / "ckpt" / "model.pt").read_text() == "the run's\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious.txt"]
    before = directory.listing()
    shutil.rmtree(cwd / "ckpt")
    (cwd / "ckpt").symlink_to(elsewhere, target_is_directory=True)  # what a try did
    kept.after_try(before, tmp_path / "run" / "tries" / "GD101" / "outputs")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious.txt"]


def test_the_report_shows_source_lines_of_python_files_only(tmp_path: Path) -> None:
    """A received bundle's finding that points at a file of the reader's that is not Python shows no lines of it."""
    from gpudoctor.report.cards import source_snippet

    secret = tmp_path / ".netrc"
    secret.write_text("machine example.com login me password hunter2\n")
    assert source_snippet({"file": str(secret), "line": 1, "function": "main"}) is None
    assert source_snippet({"file": ".netrc", "line": 1, "function": "main"}, run_cwd=str(tmp_path)) is None
    source = tmp_path / "train.py"
    source.write_text("x = 1\n")
    assert source_snippet({"file": str(source), "line": 1, "function": "main"}) is not None
