"""A job's ranks analysed side by side in forked processes (gpudoctor.job.parallel): the same diagnosis and reports
as rank after rank, a process that dies leaves its ranks to this one, how many processes, and an analysed run that
pickles without its trace being read again."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpudoctor.analysis import Run
from gpudoctor.engine.isolation import RULE_THREAD_PREFIX
from gpudoctor.job import parallel
from gpudoctor.job.parallel import PROCESSES_VARIABLE, analysis_processes, each_rank, rank_peak_bytes
from gpudoctor.pipeline import RuleSelection, diagnose, prepare_rules, write

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "fixtures" / "job_bundles" / "job_loader_straggler_bad"  # two ranks on two H200s


def _job_of(tmp_path: Path, ranks: int) -> Path:
    """`ranks` rank bundles replicated from the recorded two-rank job, its straggler every other rank."""
    job = tmp_path / "job"
    for rank in range(ranks):
        source = RECORDED / f"rank-{rank % 2}"
        target = job / f"rank-{rank}"
        target.mkdir(parents=True)
        for name in ("events.jsonl", "manifest.json", "trace.json.gz"):
            shutil.copy2(source / name, target / name)
        shutil.copytree(source / "samples", target / "samples")
    return job


def _written(job: Path, processes: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict[str, str]]:
    """The job's findings.json without its time of writing, and each rank's own report.html, analysed in
    `processes` processes."""
    monkeypatch.setenv(PROCESSES_VARIABLE, processes)
    write(diagnose([job], prepare_rules(RuleSelection())), job, ("json", "html"))
    findings = json.loads((job / "findings.json").read_text())
    findings.pop("created", None)
    pages = {p.parent.name: p.read_text() for p in sorted(job.glob("rank-*/report.html"))}
    return findings, pages


def test_side_by_side_the_job_is_diagnosed_and_reported_as_rank_after_rank(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job_of(tmp_path, 4)
    alone, alone_pages = _written(job, "1", monkeypatch)
    side_by_side, pages = _written(job, "3", monkeypatch)
    assert [f["code"] for f in side_by_side["findings"]] == [f["code"] for f in alone["findings"]]
    assert side_by_side == alone
    assert pages == alone_pages and len(pages) == 4
    assert side_by_side["run"]["world_size"] == 4


def _pid(number: int, bundle: Path) -> tuple[int, str]:
    return os.getpid(), bundle.name


def test_each_rank_runs_in_other_processes_and_comes_back_by_rank(tmp_path: Path) -> None:
    bundles = {n: tmp_path / f"rank-{n}" for n in range(5)}
    done = each_rank(bundles, _pid, 2)
    assert [name for _, name in done.values()] == [f"rank-{n}" for n in range(5)]
    assert os.getpid() not in {pid for pid, _ in done.values()}
    assert each_rank(bundles, _pid, 1)[3] == (os.getpid(), "rank-3")


def test_a_process_that_dies_leaves_its_ranks_to_this_one(tmp_path: Path) -> None:
    here = os.getpid()

    def dies_once(number: int, bundle: Path) -> tuple[int, str]:
        if number == 2 and os.getpid() != here:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
        return _pid(number, bundle)

    done = each_rank({n: tmp_path / f"rank-{n}" for n in range(4)}, dies_once, 2)
    assert sorted(done) == [0, 1, 2, 3]
    assert done[2] == (here, "rank-2")  # analysed here, after its process died


def test_an_error_of_the_work_is_raised_here(tmp_path: Path) -> None:
    def fails(number: int, bundle: Path) -> None:
        raise ValueError(f"rank {number}")

    with pytest.raises(ValueError, match=r"rank [01]"):
        each_rank({0: tmp_path, 1: tmp_path}, fails, 2)


def test_an_error_ends_the_other_ranks_analyses_at_once(tmp_path: Path) -> None:
    """The first error is raised as it comes: the ranks not begun are not, and those being analysed are ended, not
    waited for (each of them would take a minute)."""
    def rank_1_fails(number: int, bundle: Path) -> None:
        if number == 1:
            raise ValueError("rank 1")
        time.sleep(60)

    started = time.monotonic()
    with pytest.raises(ValueError, match="rank 1"):
        each_rank(dict.fromkeys(range(6), tmp_path), rank_1_fails, 2)
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 10
    while _live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_children() == []


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive


def test_how_many_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job_of(tmp_path, 3)
    bundles = {n: job / f"rank-{n}" for n in range(3)}
    monkeypatch.setenv(PROCESSES_VARIABLE, "8")
    assert analysis_processes(bundles) == 3  # no more than the ranks
    monkeypatch.setenv(PROCESSES_VARIABLE, "1")
    assert analysis_processes(bundles) == 1
    monkeypatch.delenv(PROCESSES_VARIABLE)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    assert analysis_processes(bundles) == 2  # one per core
    peak = rank_peak_bytes(bundles[0])
    assert peak > parallel.BASE_PEAK_BYTES  # its trace counts
    available = type("Memory", (), {"available": int(peak / parallel.MEMORY_SHARE * 1.5)})
    monkeypatch.setattr(parallel.psutil, "virtual_memory", lambda: available)
    assert analysis_processes(bundles) == 1  # the memory holds one at its peak


def test_an_analysed_run_pickles_with_its_trace_as_read(tmp_path: Path) -> None:
    bundle = tmp_path / "rank-0"
    shutil.copytree(RECORDED / "rank-0", bundle)
    run = Run.from_bundle(bundle)
    steps, budget, host_lines = run.steps, run.budget, run.sites.host_lines
    blob = pickle.dumps(run)
    (bundle / "trace.json.gz").unlink()  # read again, it would be missing
    back = pickle.loads(blob)
    assert back.steps == steps and back.budget == budget and back.sites.host_lines == host_lines
    assert back.host.samples.host == run.host.samples.host
    assert back.trace_error is None and back.trace is not None and len(back.trace.gpu_ops) == len(run.trace.gpu_ops)


def test_no_fork_while_a_rule_that_timed_out_still_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule left behind on its thread may hold a lock a forked child would wait on for ever: the ranks are then
    analysed here, whatever GPUDOCTOR_ANALYSIS_PROCESSES asks."""
    job = _job_of(tmp_path, 2)
    bundles = {n: job / f"rank-{n}" for n in range(2)}
    monkeypatch.setenv(PROCESSES_VARIABLE, "2")
    assert analysis_processes(bundles) == 2
    release = threading.Event()
    left_behind = threading.Thread(target=release.wait, name=f"{RULE_THREAD_PREFIX}GD999", daemon=True)
    left_behind.start()
    try:
        assert analysis_processes(bundles) == 1
        assert each_rank(bundles, _pid, 2) == {n: (os.getpid(), f"rank-{n}") for n in range(2)}
    finally:
        release.set()
        left_behind.join()
    assert analysis_processes(bundles) == 2


def test_each_window_of_a_ranks_trace_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank profiled in four windows: its rules and the job's pages read the same runs, each window's trace once
    (the pages read each window but the charted one a second time)."""
    from gpudoctor.analysis import run as run_module

    repeated = REPO / "fixtures" / "bundles" / "data_starvation_late"
    job = tmp_path / "job"
    for rank in range(2):
        shutil.copytree(repeated, job / f"rank-{rank}")
    read: list[str] = []
    parse = run_module.parse_trace

    def counted(path, *args, **kwargs):
        read.append(os.fspath(path))
        return parse(path, *args, **kwargs)

    monkeypatch.setattr(run_module, "parse_trace", counted)
    monkeypatch.setenv(PROCESSES_VARIABLE, "1")
    found = diagnose([job], prepare_rules(RuleSelection()))
    assert found.result.findings
    assert len(read) == 8 and len(set(read)) == 8, sorted(read)


def test_the_runs_of_a_ranks_windows_pickle_its_samples_once() -> None:
    """A rank's diagnosis comes back from its process with a run for each window: the samples, the same for every
    window, are in the pickle once, and each window's run reads them back whole."""
    repeated = Run.from_bundle(REPO / "fixtures" / "bundles" / "data_starvation_late")
    windows = [repeated.for_window(w.index) for w in repeated.windows]
    assert len(windows) == 4
    rows = windows[0]._samples()
    assert all(any(kind) for kind in rows[:2])  # host and process samples to carry
    one, all_four = len(pickle.dumps(windows[:1])), len(pickle.dumps(windows))
    assert all_four < one * 1.5, (one, all_four)  # each window's events are its own; its samples are not
    for back in pickle.loads(pickle.dumps(windows)):
        assert back._samples() == rows
