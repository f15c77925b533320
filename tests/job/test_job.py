"""A torchrun job diagnosed as one (gloo on the CPU, real two-rank runs): the straggler named with its cause, a
balanced job quiet, node directories merged by `gpudoctor analyze DIR_A DIR_B`."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import RUN_TIMEOUT_S, Gpudoctor, checked_findings, env_with, script
from gpudoctor.analysis import Run

# Eight analysed steps: GD601 compares the ranks step by step, and two steps are too few to tell noise from a
# rank that arrives last every time.
JOB_WINDOW = ("--wait-steps", "2", "--warmup-steps", "1", "--active-steps", "8", "--detail-steps", "2")


def _job(gd: Gpudoctor, out: str, *script_and_args: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "gpudoctor", "profile", "--out", out, *JOB_WINDOW, "--format", "json", *script_and_args]
    ran = subprocess.run(command, cwd=gd.cwd, env=env_with(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert ran.returncode == 0, ran.stderr[-3000:]


@pytest.fixture(scope="module")
def straggler_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gpudoctor, dict]:
    gd = Gpudoctor(tmp_path_factory.mktemp("straggler"))
    _job(gd, "run", script("ddp_loader_straggler.py"), "--slow-ranks", "1")
    result = gd.run("analyze", "run")
    assert result.returncode == 0, result
    return gd, checked_findings(gd.cwd / "run" / "findings.json")


@pytest.mark.e2e
def test_the_straggler_is_named_with_its_loader(straggler_job: tuple[Gpudoctor, dict]) -> None:
    _, merged = straggler_job
    first = merged["findings"][0]
    assert (first["code"], first["category"]) == ("GD601", "straggler")
    assert first["title"].startswith("Rank 1 holds back the others: rank 0 waits")
    assert "ranks" not in first  # a finding of the whole job
    evidence = {e["name"]: e["value"] for e in first["evidence"]}
    assert evidence["slow rank"] == 1
    assert evidence["cause"].startswith("its input pipeline (0 workers)")
    assert first["location"]["file"].endswith("ddp_loader_straggler.py")
    lines = Path(script("ddp_loader_straggler.py")).read_text().splitlines()
    assert "DataLoader(" in lines[first["location"]["line"] - 1]
    assert first["saving_s"] == pytest.approx(first["impact"] * merged["run"]["step_s"], rel=1e-3)
    assert merged["run"]["step_s"] == max(rank["step_s"] for rank in merged["run"]["ranks"])  # the slowest rank's


@pytest.mark.e2e
def test_the_slow_ranks_own_finding_is_counted_once(straggler_job: tuple[Gpudoctor, dict]) -> None:
    _, merged = straggler_job
    loader = next(f for f in merged["findings"] if f["code"] == "GD101")
    assert loader["ranks"] == [1]
    assert loader["impact"] is None and loader["impact_reason"].startswith("counted in GD601's finding")
    ranks = {r["rank"]: r for r in merged["run"]["ranks"]}
    # Rank 1 loads each batch itself: 16 samples of 0.5 ms of sleep, which no host makes shorter. Rank 0's workers
    # load ahead, as far as a busy host leaves them cores (2.7 ms against 11.4 ms on 2 cores beside the suite).
    assert ranks[1]["data_wait_s"] >= 0.9 * 16 * 0.5e-3
    assert ranks[0]["data_wait_s"] < ranks[1]["data_wait_s"]
    assert ranks[0]["collective_wait_s"] > ranks[1]["collective_wait_s"] == 0.0


@pytest.mark.e2e
def test_each_rank_keeps_its_own_report(straggler_job: tuple[Gpudoctor, dict]) -> None:
    gd, _ = straggler_job
    own = checked_findings(gd.cwd / "run" / "rank-1" / "findings.json")
    assert "world_size" not in own["run"]
    assert [f["code"] for f in own["findings"]][:1] == ["GD101"]
    page = (gd.cwd / "run" / "report.html").read_text()
    assert '<section id="ranks">' in page and "on rank 1" in page


def test_a_balanced_job_has_no_straggler(gd: Gpudoctor) -> None:
    _job(gd, "run", script("ddp_train.py"), "--steps", "16")
    result = gd.run("analyze", "run")
    assert result.returncode == 0, result
    merged = checked_findings(gd.cwd / "run" / "findings.json")
    assert [f for f in merged["findings"] if f["category"] == "straggler"] == []
    assert not [r for r in merged["not_evaluated"] if r["code"] == "GD601"]  # it was evaluated, and found nothing


def test_the_other_ranks_are_the_jobs_cpu_not_other_programs(gd: Gpudoctor) -> None:
    """Rank 1 computes beside rank 0: the job's own demand, never "other programs". What other programs used is
    measured here too (the host's busy time less the job's, from the kernel's counters), so that the verdict holds
    on a busy host as on a quiet one."""
    host_before, ours_before, started = _busy_s(), _children_cpu_s(), time.monotonic()
    _job(gd, "run", script("ddp_train.py"), "--steps", "40")
    wall = time.monotonic() - started
    really_other = max(0.0, (_busy_s() - host_before) - (_children_cpu_s() - ours_before)) / wall
    host = Run.from_bundle(gd.cwd / "run" / "rank-0").host.samples.host
    job = statistics.fmean(p.values["job_cores"] or 0.0 for p in host)
    other = statistics.fmean(p.values["other_cores"] or 0.0 for p in host)
    assert job > 0.3, (job, other)  # both ranks' compute
    assert other < really_other + 0.3, (job, other, really_other)  # rank 1 is not counted as another program
    result = gd.run("analyze", "run")
    if really_other < 0.3:  # a quiet host: nothing else to blame
        assert "GD504" not in [f["code"] for f in checked_findings(gd.cwd / "run" / "findings.json")["findings"]], \
            result


def _busy_s() -> float:
    """The host's CPU seconds spent on anything but idling, all cores together."""
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def _children_cpu_s() -> float:
    """The CPU seconds of this process's ended children, and theirs (the job, once its launcher has ended)."""
    times = psutil.Process().cpu_times()
    return times.children_user + times.children_system


def test_node_directories_merge_by_global_rank(straggler_job: tuple[Gpudoctor, dict], gd: Gpudoctor) -> None:
    source, _ = straggler_job
    for node, rank in (("A", 0), ("B", 1)):  # as two nodes of one rank each would have written them
        shutil.copytree(source.cwd / "run" / f"rank-{rank}", gd.cwd / node / f"rank-{rank}")
    result = gd.run("analyze", "A", "B", "--out", "merged")
    assert result.returncode == 0, result
    merged = checked_findings(gd.cwd / "merged" / "findings.json")
    assert [r["rank"] for r in merged["run"]["ranks"]] == [0, 1]
    assert merged["findings"][0]["code"] == "GD601"


def test_the_same_rank_twice_is_refused(straggler_job: tuple[Gpudoctor, dict], gd: Gpudoctor) -> None:
    source, _ = straggler_job
    for node in ("A", "B"):
        shutil.copytree(source.cwd / "run" / "rank-0", gd.cwd / node / "rank-0")
    result = gd.run("analyze", "A", "B")
    assert result.returncode == 65
    assert result.first_message == ("gpudoctor: rank 0 is in both A/rank-0 and B/rank-0: give each node's run "
                                    "directory once, from one job.")


def test_oversubscription_counts_every_rank_on_the_host(gd: Gpudoctor) -> None:
    # Each rank alone runs 1 + 2 x 2 compute threads, within 3 per core of this host's 2 cores; the two ranks
    # together run twice that.
    _job(gd, "run", script("rules/oversubscribed_workers.py"), "--worker-threads", "2")
    result = gd.run("analyze", "run")
    assert result.returncode == 0, result
    merged = checked_findings(gd.cwd / "run" / "findings.json")
    finding = next(f for f in merged["findings"] if f["code"] == "GD503")
    facts = {e["name"]: e["value"] for e in finding["evidence"]}
    assert facts["ranks on this host"] == 2 and finding["ranks"] == [0, 1]
    assert facts["compute threads"] // 2 <= 3 * facts["cores available"] < facts["compute threads"]
    assert finding["title"].endswith(f"({2} ranks of {facts['compute threads'] // 2} each)")
    assert "of each of the 2 ranks" in finding["fix"]


def test_allreduces_of_accumulated_gradients_are_found(gd: Gpudoctor) -> None:
    _job(gd, "run", script("ddp_accumulate.py"), "--batch-size", "4")
    result = gd.run("analyze", "run")
    assert result.returncode == 0, result
    merged = checked_findings(gd.cwd / "run" / "findings.json")
    finding = next(f for f in merged["findings"] if f["code"] == "GD602")
    assert finding["category"] == "communication" and "ranks" not in finding
    assert finding["title"].startswith("Gradients are all-reduced at each of the 4 backward() calls of a step")
    lines = Path(script("ddp_accumulate.py")).read_text().splitlines()
    assert "loss.backward()" in lines[finding["location"]["line"] - 1]
    assert "model.no_sync()" in finding["fix"] and 0.1 < finding["impact"] < 0.9


def test_accumulation_under_no_sync_is_not_called_wasted(gd: Gpudoctor) -> None:
    _job(gd, "run", script("ddp_accumulate.py"), "--batch-size", "4", "--no-sync")
    result = gd.run("analyze", "run")
    assert result.returncode == 0, result
    merged = checked_findings(gd.cwd / "run" / "findings.json")
    # The one all-reduce left per step may still be exposed (12 MB of gradients, little compute beside it on two
    # busy cores): GD602 may say so, but never that the micro-batches' all-reduces are wasted.
    communication = [f for f in merged["findings"] if f["category"] == "communication"]
    assert not [f for f in communication if "backward() calls" in f["title"]], communication
    ranks = merged["run"]["ranks"]
    assert all(r["exposed_collective_s"] is not None and r["exposed_collective_s"] > 0 for r in ranks)


def test_diff_compares_two_jobs(straggler_job: tuple[Gpudoctor, dict], gd: Gpudoctor) -> None:
    source, _ = straggler_job
    for name in ("before", "after"):  # rank bundles only: diff analyses each job first
        for rank in (0, 1):
            shutil.copytree(source.cwd / "run" / f"rank-{rank}", gd.cwd / name / f"rank-{rank}",
                            ignore=shutil.ignore_patterns("findings.json", "report.html"))
    result = gd.run("diff", "before", "after")
    assert result.returncode == 0, result
    assert "resolved: none" in result.stdout and "new: none" in result.stdout
    assert "GD601 Rank 1 holds back the others" in result.stdout.split("remaining")[1]


@pytest.mark.e2e
def test_the_jobs_page_and_its_ranks_pages_agree_on_the_cpu(straggler_job: tuple[Gpudoctor, dict]) -> None:
    """gloo on the CPU: each rank's step at its pace split as its own page's (its wait for data that of every step,
    the rest the host's work, computing included), no GPU idle spoken of, torchrun named as the launcher, and the
    waiting rank's page in words of its own."""
    gd, merged = straggler_job
    assert merged["run"]["launcher"] == "torchrun"
    for row in merged["run"]["ranks"]:
        own = checked_findings(gd.cwd / row["bundle"] / "findings.json")
        assert row["gpu_idle_share"] == own["summary"]["gpu_idle_share"] is None
        time = row["time"]
        assert time["computing_s"] == 0.0 and time["step_s"] == pytest.approx(own["run"]["step_s"], rel=1e-6)
        assert sum(v for k, v in time.items() if k != "step_s") == pytest.approx(time["step_s"], rel=1e-6)
    times = {row["rank"]: row["time"] for row in merged["run"]["ranks"]}
    assert times[1]["data_wait_s"] > times[0]["data_wait_s"] and times[0]["waiting_for_ranks_s"] > 0
    waiting = checked_findings(gd.cwd / "run" / "rank-0" / "findings.json")["summary"]
    assert waiting.get("waits_for") == 1 and "no problems found" not in waiting["verdict"], waiting
    page = (gd.cwd / "run" / "report.html").read_text()
    assert "ranks of one job launched by torchrun." in page and "host work (computing included)" in page
