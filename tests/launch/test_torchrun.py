"""Under torchrun (`torchrun ... -m gpudoctor profile ...`), every rank writes its own complete bundle."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import RUN_TIMEOUT_S, WINDOW, Gpudoctor, checked_findings, env_with, script
from gpudoctor.analysis import Run


def _torchrun(gd: Gpudoctor, *gpudoctor_args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "gpudoctor", "profile", *gpudoctor_args]
    return subprocess.run(command, cwd=gd.cwd, env=env_with(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def test_each_rank_writes_its_own_bundle(gd: Gpudoctor) -> None:
    result = _torchrun(gd, "--out", "run", *WINDOW, script("ddp_train.py"), "--steps", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert f"ddp_train: rank {rank} of 2 did 10 steps" in result.stdout
        bundle = gd.cwd / "run" / f"rank-{rank}"
        findings = json.loads((bundle / "findings.json").read_text())
        assert findings["run"]["step_source"] == "optimizer"
        assert (bundle / "report.html").is_file() and (bundle / "trace.json.gz").is_file()
        assert len(Run.from_bundle(bundle).step_view.all_steps) == 10


def test_ranks_analyse_the_same_steps_when_only_rank_0_evaluates_first(gd: Gpudoctor) -> None:
    # Rank 0's 12 evaluation calls are counted as steps until its optimizer takes over; its window then starts
    # over, and its training steps are numbered from 0 as rank 1's are, so that the ranks' steps line up.
    result = _torchrun(gd, "--out", "run", *WINDOW, script("ddp_train.py"), "--steps", "10",
                       "--evaluate-on-rank0", "12")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [Run.from_bundle(gd.cwd / "run" / f"rank-{rank}") for rank in (0, 1)]
    assert [[s.index for s in run.steps] for run in runs] == [[2, 3], [2, 3]]
    assert [len(run.step_view.all_steps) for run in runs] == [10, 10]


def test_the_default_run_directory_holds_every_rank(gd: Gpudoctor) -> None:
    result = _torchrun(gd, *WINDOW, script("ddp_train.py"), "--steps", "6")
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (gd.cwd / "gpudoctor-runs").iterdir()
    assert run_dir.name.startswith("ddp_train-torchrun-")
    assert sorted(p.name for p in run_dir.iterdir() if not p.name.startswith(".merged-")) == [
        "findings.json", "rank-0", "rank-1", "report.html"]


def test_the_last_rank_to_finish_merges_the_job(gd: Gpudoctor) -> None:
    result = _torchrun(gd, "--out", "run", *WINDOW, script("ddp_train.py"), "--steps", "8")
    assert result.returncode == 0, result.stderr[-3000:]
    merged = checked_findings(gd.cwd / "run" / "findings.json")
    assert merged["run"]["world_size"] == 2 and [r["rank"] for r in merged["run"]["ranks"]] == [0, 1]
    assert (gd.cwd / "run" / "report.html").is_file()
    # One summary on the terminal, the job's: the ranks write their own reports without one.
    assert result.stderr.count("gpudoctor: 2 ranks;") == 1
    assert sorted(p.name for p in (gd.cwd / "run" / "rank-1").iterdir() if p.name.startswith(".")) == []


def test_analyze_of_the_shared_directory_merges_the_ranks(gd: Gpudoctor) -> None:
    ranks = _torchrun(gd, "--out", "run", *WINDOW, script("ddp_train.py"), "--steps", "6")
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    result = gd.run("analyze", "run")
    assert result.returncode == 0, result
    assert result.first_message.startswith("gpudoctor: 2 ranks;")
    merged = checked_findings(gd.cwd / "run" / "findings.json")
    assert merged["run"]["world_size"] == 2
    assert [r["rank"] for r in merged["run"]["ranks"]] == [0, 1]
    assert all(r["collective_s"] is not None and r["ending"] == "completed" for r in merged["run"]["ranks"])
    page = (gd.cwd / "run" / "report.html").read_text()
    assert 'href="rank-0/report.html"' in page and 'href="rank-1/report.html"' in page
