"""The job rules on rank bundles built in code, as two GPUs with NCCL would record them: each rank's all-reduce is
an NCCL kernel that lasts until the last rank joins it, so the ranks that wait show long ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.pipeline import RuleSelection, diagnose, prepare_rules, write
from gpudoctor.testing import BundleBuilder
from gpudoctor.testing.builder import DEFAULT_START

STEP_S, STEPS = 0.020, 8
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _rank(run: Path, rank: int, *, data_wait_s: float, compute: tuple[float, float],
          allreduce: tuple[float, float], workers: int, outside_s: float | None = None) -> None:
    """One rank's bundle: each step waits `data_wait_s` for its batch, computes over `compute` (start, end within
    the step) and all-reduces over `allreduce`. With `outside_s`, as many steps of that length follow the
    profiled ones, outside the window."""
    b = BundleBuilder(run / f"rank-{rank}", pid=4000 + 100 * rank,
                      window=(0, 0, STEPS if outside_s is not None else None))
    b.loader(num_workers=workers)
    for step in b.steps(STEPS, wall_s=STEP_S, data_wait_s=data_wait_s):
        b.kernels([(step, compute[0], compute[1] - compute[0], "sm90_xmma_gemm_f32f32_tf32f32_f32_nn"),
                   (step, allreduce[0], allreduce[1] - allreduce[0], ALLREDUCE)])
    if outside_s is not None:
        b.steps(STEPS, wall_s=outside_s)
    b.write()


def _merged(run: Path) -> list[dict]:
    """The job's merged findings; each rank's own report is written into its bundle."""
    return write(diagnose([run], prepare_rules(RuleSelection())), run, ()).report["findings"]


def test_the_rank_that_loads_slowly_is_the_straggler(tmp_path: Path) -> None:
    _rank(tmp_path, 0, data_wait_s=0.0, compute=(0.0, 0.005), allreduce=(0.005, 0.019), workers=8)
    _rank(tmp_path, 1, data_wait_s=0.012, compute=(0.012, 0.017), allreduce=(0.017, 0.019), workers=0)
    findings = _merged(tmp_path)
    straggler = findings[0]
    assert straggler["code"] == "GD601" and straggler["title"].startswith("Rank 1 holds back the others")
    evidence = {e["name"]: e["value"] for e in straggler["evidence"]}
    assert evidence["the others' wait per profiled step"] == 12.0 and evidence["cause"].startswith("its input pipeline")
    assert straggler["title"] == "Rank 1 holds back the others: rank 0 waits for it in every collective"
    assert evidence["the job's step"] == 20.0 and evidence["the job's step after the fix"] == 8.0
    assert straggler["impact"] == 0.6 and straggler["severity"] == "critical"
    loader = next(f for f in findings if f["code"] == "GD101")
    assert loader["ranks"] == [1] and loader["impact"] is None


def test_the_saving_is_a_share_of_the_step_at_the_runs_pace(tmp_path: Path) -> None:
    """The window slowed the profiled steps to 20 ms; outside it the job steps in 16 ms, rank 1 still waiting 12 ms
    for each batch. Without its wait rank 1 would step in 4 ms, but rank 0 took 8 ms of each profiled step on its
    own: the job's step after the fix is those 8 ms, half the 16 ms step."""
    _rank(tmp_path, 0, data_wait_s=0.0, compute=(0.0, 0.005), allreduce=(0.005, 0.019), workers=8, outside_s=0.016)
    _rank(tmp_path, 1, data_wait_s=0.012, compute=(0.012, 0.017), allreduce=(0.017, 0.019), workers=0,
          outside_s=0.016)
    straggler = _merged(tmp_path)[0]
    evidence = {e["name"]: e["value"] for e in straggler["evidence"]}
    assert (evidence["the job's step"], evidence["the job's step after the fix"]) == (16.0, 8.0)
    assert straggler["impact"] == 0.5


def test_a_slower_gpu_is_named_as_the_cause(tmp_path: Path) -> None:
    _rank(tmp_path, 0, data_wait_s=0.0, compute=(0.0, 0.005), allreduce=(0.005, 0.019), workers=8)
    _rank(tmp_path, 1, data_wait_s=0.0, compute=(0.0, 0.017), allreduce=(0.017, 0.019), workers=8)
    straggler = _merged(tmp_path)[0]
    evidence = {e["name"]: e["value"] for e in straggler["evidence"]}
    assert straggler["code"] == "GD601" and evidence["slow rank"] == 1
    assert evidence["cause"] == "its GPU: it computes 17.0 ms a step, the others 5.0 ms"


def test_balanced_ranks_that_their_loaders_hold_back_are_no_stragglers(tmp_path: Path) -> None:
    """Both ranks' loaders can feed a step no faster than 18 ms (two workers, 0.9 of a core each over 20 ms steps):
    rank 1 arrives last in every profiled step, but the job's step would hardly shrink without the wait."""
    _rank_with_workers(tmp_path, 0, worker_cores=0.9, data_wait_s=0.0, compute=(0.0, 0.005),
                       allreduce=(0.005, 0.019), workers=2)
    _rank_with_workers(tmp_path, 1, worker_cores=0.9, data_wait_s=0.012, compute=(0.012, 0.017),
                       allreduce=(0.017, 0.019), workers=2)
    assert [f["code"] for f in _merged(tmp_path) if f["category"] == "straggler"] == []


def test_balanced_ranks_with_exposed_communication(tmp_path: Path) -> None:
    for rank in (0, 1):  # both compute 10 ms, then all-reduce 8 ms with nothing beside it
        _rank(tmp_path, rank, data_wait_s=0.0, compute=(0.0, 0.010), allreduce=(0.010, 0.018), workers=8)
    findings = _merged(tmp_path)
    assert [f["code"] for f in findings if f["category"] == "straggler"] == []
    exposed = next(f for f in findings if f["code"] == "GD602")
    assert exposed["title"].startswith("Communication is exposed for 8.0 ms of each 20.0 ms step")
    assert exposed["impact"] == 0.2  # half the exposed time: what fp16 compression of the gradients saves


def _rank_with_workers(run: Path, rank: int, *, worker_cores: float, data_wait_s: float, compute: tuple[float, float],
                       allreduce: tuple[float, float], workers: int) -> None:
    """As _rank, on a host of 32 cores shared by two ranks, with `workers` loader workers each using
    `worker_cores` of a core (one batch a step)."""
    b = BundleBuilder(run / f"rank-{rank}", pid=4000 + 100 * rank)
    b.env(cores=32, ranks_on_host=2)
    b.loader(num_workers=workers)
    b.process(1.0)
    for _ in range(workers):
        b.process(worker_cores, name="pt_data_worker")
    for step in b.steps(STEPS, wall_s=STEP_S, data_wait_s=data_wait_s):
        b.kernels([(step, compute[0], compute[1] - compute[0], "sm90_xmma_gemm_f32f32_tf32f32_f32_nn"),
                   (step, allreduce[0], allreduce[1] - allreduce[0], ALLREDUCE)])
    b.write()


def test_the_waiting_ranks_loader_limits_the_jobs_step_after_the_fix(tmp_path: Path) -> None:
    """Rank 0 waits 12 ms of its 20 ms step for rank 1; without the wait it would step in 8 ms, but its two workers
    spend 0.6 of a core each over a 20 ms step on one batch: 24 ms of CPU a batch, a batch every 12 ms at best.
    The job's step after rank 1's fix is those 12 ms, not 8: 40% saved, not 60%."""
    _rank_with_workers(tmp_path, 0, worker_cores=0.6, data_wait_s=0.0, compute=(0.0, 0.005),
                       allreduce=(0.005, 0.019), workers=2)
    _rank_with_workers(tmp_path, 1, worker_cores=0.0, data_wait_s=0.012, compute=(0.012, 0.017),
                       allreduce=(0.017, 0.019), workers=0)
    straggler = _merged(tmp_path)[0]
    evidence = {e["name"]: e["value"] for e in straggler["evidence"]}
    assert straggler["code"] == "GD601" and evidence["the others' wait per profiled step"] == 12.0
    assert evidence["the job's step after the fix"] == 12.0
    assert evidence["then limited by"] == "rank 0's loader: 2 workers, 24 ms of CPU per batch"
    assert straggler["impact"] == 0.4


def test_a_waiting_rank_says_whom_it_waits_for(tmp_path: Path) -> None:
    _rank(tmp_path, 0, data_wait_s=0.0, compute=(0.0, 0.005), allreduce=(0.005, 0.019), workers=8)
    _rank(tmp_path, 1, data_wait_s=0.012, compute=(0.012, 0.017), allreduce=(0.017, 0.019), workers=0)
    _merged(tmp_path)
    waiting = json.loads((tmp_path / "rank-0" / "findings.json").read_text())["summary"]
    slow = json.loads((tmp_path / "rank-1" / "findings.json").read_text())["summary"]
    assert waiting["verdict"].startswith("This rank waits for rank 1 in every collective: the job's 20.0 ms step "
                                         "would take ~8.0 ms without the wait (GD601 in the job's report).")
    assert waiting["healthy"] is False and waiting["status"] == "problems"
    assert not slow["verdict"].startswith("This rank waits")


def test_a_rank_shares_its_hosts_cores_with_the_others_in_its_worker_count(tmp_path: Path) -> None:
    """32 cores and two ranks: rank 1's loader fix suggests at most 15 workers (its 16 cores, one kept for itself)."""
    _rank_with_workers(tmp_path, 0, worker_cores=0.1, data_wait_s=0.0, compute=(0.0, 0.005),
                       allreduce=(0.005, 0.019), workers=2)
    b = BundleBuilder(tmp_path / "rank-1", pid=4100)
    b.env(cores=32, ranks_on_host=2)
    b.loader(num_workers=0)
    for step in b.steps(STEPS, wall_s=0.2, data_wait_s=0.19):
        b.kernels([(step, 0.19, 0.005, "sm90_xmma_gemm_f32f32_tf32f32_f32_nn")])
    b.write()
    loader = next(f for f in _merged(tmp_path) if f["code"] == "GD101")
    evidence = {e["name"]: e["value"] for e in loader["evidence"]}
    assert "num_workers=15" in loader["fix"]
    assert (evidence["cores available"], evidence["ranks on this host"], evidence["cores per rank"]) == (32, 2, 16.0)


def _spawned(bundle: Path, rank: int) -> None:
    """The rank as mp.spawn's child: gpudoctor recorded it from torch.multiprocessing's process index."""
    from gpudoctor.bundle.events import RankEvent
    from gpudoctor.bundle.jsonio import encode

    with open(bundle / "events.jsonl", "ab") as events:
        events.write(encode(RankEvent(rank=rank, source="torch.multiprocessing")) + b"\n")


def _in_turns(run: Path, rank: int) -> None:
    """Two workers that deliver late in turns: in every other step this rank waits 12 ms for its batch and reaches
    the all-reduce last, in the others it waits for the other rank there."""
    b = BundleBuilder(run / f"rank-{rank}", pid=4000 + 100 * rank)
    b.loader(num_workers=2)
    for step in range(STEPS):
        late = (step + rank) % 2 == 0
        b.step(wall_s=STEP_S, data_wait_s=0.012 if late else 0.0)
        compute, allreduce = ((0.012, 0.017), (0.017, 0.019)) if late else ((0.0, 0.005), (0.005, 0.019))
        b.kernels([(step, compute[0], compute[1] - compute[0], "sm90_xmma_gemm_f32f32_tf32f32_f32_nn"),
                   (step, allreduce[0], allreduce[1] - allreduce[0], ALLREDUCE)])
    b.write()
    _spawned(run / f"rank-{rank}", rank)


def test_ranks_that_wait_for_each_other_in_turns_are_named_whatever_launched_them(tmp_path: Path) -> None:
    """No rank is last in most steps (pytorch/examples' ImageNet under mp.spawn, -j 4 on two GPUs: each rank's
    two workers deliver late in turn), yet each waits for the other: GD601 says so, and leaves the cost to the
    ranks' own loader findings; the job's page names mp.spawn, not torchrun."""
    for rank in (0, 1):
        _in_turns(tmp_path, rank)
    report = write(diagnose([tmp_path], prepare_rules(RuleSelection())), tmp_path, ("html",)).report
    [turns] = [f for f in report["findings"] if f["code"] == "GD601"]
    assert turns["title"].startswith("Ranks 0 and 1 wait for each other in turns: 12.0 ms of each 20.0 ms "
                                     "profiled step"), turns["title"]
    assert turns["impact"] is None and "input-pipeline findings" in turns["impact_reason"]
    evidence = {e["name"]: e["value"] for e in turns["evidence"]}
    assert evidence["last to arrive"] == "rank 0 in 4, rank 1 in 4 of 8 steps"
    assert report["run"]["launcher"] == "mp.spawn"
    html = (tmp_path / "report.html").read_text()
    assert "ranks of one job launched by mp.spawn" in html and "torchrun job" not in html


def test_a_job_page_and_its_rank_pages_say_the_same_of_each_rank(tmp_path: Path) -> None:
    """The same GPU idle for the same rank on every page, a bar per rank whose slices add up to its step, the
    waiting rank's page in words of its own (never "no problems found" beside its wait, nor that no step ran)."""
    _rank(tmp_path, 0, data_wait_s=0.0, compute=(0.0, 0.005), allreduce=(0.005, 0.019), workers=8)
    _rank(tmp_path, 1, data_wait_s=0.012, compute=(0.012, 0.017), allreduce=(0.017, 0.019), workers=0)
    report = write(diagnose([tmp_path], prepare_rules(RuleSelection())), tmp_path, ("html",)).report
    pages = {r: json.loads((tmp_path / f"rank-{r}" / "findings.json").read_text()) for r in (0, 1)}
    for row in report["run"]["ranks"]:
        own = pages[row["rank"]]["summary"]
        assert row["gpu_idle_share"] == own["gpu_idle_share"], (row["rank"], row["gpu_idle_share"], own)
        time = row["time"]
        parts = sum(time[k] for k in ("computing_s", "communicating_s", "waiting_for_ranks_s", "data_wait_s",
                                      "other_host_s"))
        assert parts == pytest.approx(time["step_s"]) and time["step_s"] == pytest.approx(row["step_s"])
        assert time["data_wait_s"] <= time["step_s"]
    idlest = max(report["run"]["ranks"], key=lambda r: r["gpu_idle_share"])
    assert report["summary"]["gpu_idle_share"] == idlest["gpu_idle_share"]
    assert report["run"]["gpu_idle_rank"] == idlest["rank"] == 1
    ranks = {r["rank"]: r["time"] for r in report["run"]["ranks"]}
    assert ranks[0]["waiting_for_ranks_s"] > 0.5 * ranks[0]["step_s"] and ranks[1]["waiting_for_ranks_s"] == 0.0
    waiting = pages[0]["summary"]["verdict"]
    assert "no problems found" not in waiting and "Its GPU waits in collectives" in waiting, waiting
    page = (tmp_path / "rank-0" / "report.html").read_text()
    assert "none happened" not in page and "waiting for rank 1" in page
    job_page = (tmp_path / "report.html").read_text()
    assert job_page.count('class="chart steps-chart"') == 2  # rank 0's steps, and one bar per rank
    assert "Rank 0: each analysed step" not in job_page
    assert f"GPU idle {round(idlest['gpu_idle_share'] * 100)}% of it on rank 1" in job_page
    slow = pages[1]["summary"]["verdict"]
    assert slow.startswith("The other ranks wait for this one in every collective: fixing it brings the job's"), slow


def test_the_jobs_step_is_said_with_the_profilers_effect_on_the_rank_it_is_of(tmp_path: Path) -> None:
    """The torchrun straggler on two H200s: rank 0's host ran ahead of its GPU in the window (its profiled steps
    7 ms, its others 92 ms), rank 1 stepped at 93 ms throughout. The job's step is rank 1's, and so is what is said
    of the profiler beside it: not rank 0's "ran 0.09× as long as the others"."""
    _rank(tmp_path, 0, data_wait_s=0.0, compute=(0.0, 0.005), allreduce=(0.005, 0.019), workers=8, outside_s=0.016)
    _rank(tmp_path, 1, data_wait_s=0.012, compute=(0.012, 0.017), allreduce=(0.017, 0.019), workers=0,
          outside_s=0.019)
    report = write(diagnose([tmp_path], prepare_rules(RuleSelection())), tmp_path, ("html",)).report
    rank_0, rank_1 = (json.loads((tmp_path / f"rank-{r}" / "findings.json").read_text())["run"] for r in (0, 1))
    assert rank_0["window_distortion"] == 1.25 and rank_1["window_distortion"] == 1.053
    assert report["run"]["step_s"] == rank_1["step_s"]
    assert report["run"]["window_distortion"] == 1.053
    assert "the profiler slowed the steps it recorded" not in (tmp_path / "report.html").read_text()


def test_a_ranks_clock_is_aligned_by_the_ends_of_its_collectives(tmp_path: Path) -> None:
    """Rank 1's host clock runs 3 ms ahead: its steps and kernels all carry it. The ends of the steps' all-reduces,
    one moment on both ranks, show it, and findings.json says it with the residual."""
    _rank(tmp_path, 0, data_wait_s=0.0, compute=(0.0, 0.005), allreduce=(0.005, 0.019), workers=8)
    b = BundleBuilder(tmp_path / "rank-1", pid=4100, start=DEFAULT_START + 0.003)
    b.loader(num_workers=8)
    for step in b.steps(STEPS, wall_s=STEP_S):
        b.kernels([(step, 0.0, 0.017, "sm90_xmma_gemm_f32f32_tf32f32_f32_nn"), (step, 0.017, 0.002, ALLREDUCE)])
    b.write()
    report = write(diagnose([tmp_path], prepare_rules(RuleSelection())), tmp_path, ()).report
    ranks = {r["rank"]: r for r in report["run"]["ranks"]}
    assert ranks[0]["clock_offset_s"] == 0.0
    assert ranks[1]["clock_offset_s"] == pytest.approx(0.003, abs=1e-6)
    assert ranks[1]["clock_residual_s"] == pytest.approx(0.0, abs=1e-6)
