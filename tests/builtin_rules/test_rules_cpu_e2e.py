"""The CPU-visible rules, end to end: `gpudoctor profile` run for real on small scripts that show a pathology,
and on their healthy twins.

Each pathological script must produce its rule's finding in findings.json (the right category, evidence, a fix,
and the line of the script that causes it); each twin must not (or only as `info`). The scripts live in
tests/scripts/rules/ and mark the lines a finding should name with a comment (`# LOADER`, ...).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, Gpudoctor, Result
from gpudoctor.analysis import Run
from gpudoctor.bundle.events import ForkEvent, StepLessGilEvent

RULE_SCRIPTS = SCRIPTS / "rules"
# Small windows: 2 steps of start-up, 1 of warm-up, 4 analysed.
WINDOW = ("--wait-steps", "2", "--warmup-steps", "1", "--active-steps", "4")
SCRIPT_TIMEOUT_S = 60


def rule_script(name: str) -> Path:
    return RULE_SCRIPTS / name


def line_of(path: Path, marker: str) -> int:
    """The line of `path` that carries the comment `# marker`."""
    lines = [n for n, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(lines) == 1, (path, marker, lines)
    return lines[0]


def profile(gd: Gpudoctor, name: str, *args: str) -> Result:
    result = gd.profile(str(rule_script(name)), *args, options=WINDOW, timeout=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result
    return result


def findings_of(result: Result, code: str) -> list[dict]:
    report = result.findings()
    assert code not in {e.get("code") for e in report["errors"]}, report["errors"]
    return [f for f in report["findings"] if f["code"] == code]


def evidence(finding: dict) -> dict:
    return {row["name"]: row["value"] for row in finding["evidence"]}


def assert_fires(result: Result, code: str, category: str, script: Path | None, line: int | None) -> dict:
    """The rule's one finding, with its category, evidence, fix and location (None: the rule names no line)."""
    found = findings_of(result, code)
    assert len(found) == 1, (code, result.findings())
    finding = found[0]
    assert finding["category"] == category
    assert finding["severity"] in ("warning", "critical"), finding
    assert finding["evidence"] and all(row.get("name") for row in finding["evidence"]), finding
    assert isinstance(finding["fix"], str) and finding["fix"].strip(), finding
    if script is None:
        assert finding["location"] is None, finding
    else:
        location = finding["location"]
        assert location is not None, finding
        assert Path(location["file"]).resolve() == script.resolve(), location
        assert location["line"] == line, (location, line)
    return finding


def assert_silent(result: Result, code: str) -> None:
    loud = [f for f in findings_of(result, code) if f["severity"] != "info"]
    assert not loud, loud
    assert code not in {n["code"] for n in result.findings()["not_evaluated"]}  # evaluated, and found nothing


def main_process(run: Run):
    return next(p for p in run.host.processes if p.role == "main")


# -- GD101 loader-in-main-process ---------------------------------------------------------------------


def test_gd101_fires_when_the_loader_runs_in_the_main_process(gd: Gpudoctor) -> None:
    script = rule_script("loader_main_process.py")
    result = profile(gd, "loader_main_process.py", "--workers", "0")
    finding = assert_fires(result, "GD101", "data_starvation", script, line_of(script, "LOADER"))
    facts = evidence(finding)
    assert facts["num_workers"] == 0 and facts["batch size"] == 8
    assert 35 <= facts["data wait per step"] <= 80, facts  # 8 samples of 5 ms
    # The script reads num_workers from its --workers flag: the fix is in its terms.
    flag_line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if '"--workers"' in text)
    assert finding["fix"].startswith("run with --workers ") and "num_workers=args.workers" in finding["fix"]
    assert f"the flag is declared at line {flag_line}" in finding["fix"]
    assert finding["impact"] is not None and finding["impact"] > 0.15


# What a sentence may say of a GPU on a machine without one: that it was not measured, or not seen (and the
# facts table's "GPU" row label).
GPU_CLAIM = re.compile(r"(?<!no )GPU(?! activity| samples| none seen)")


def test_a_cpu_run_says_nothing_of_what_a_gpu_did(gd: Gpudoctor) -> None:
    """On a machine without a GPU the wait is the step's own: no title, fix, verdict, summary line or report row
    says what a GPU did (the rules' documentation, quoted in the report, speaks of GPUs in general)."""
    result = profile(gd, "loader_main_process.py", "--workers", "0")
    findings = result.findings()
    assert findings["run"]["gpus"] == [] and findings["findings"]
    said = [findings["summary"]["verdict"], *result.stderr.splitlines()]
    said += [text for f in findings["findings"] for text in (f["title"], f["fix"], *(e["name"] for e in f["evidence"]))]
    page = re.sub(r"<details class=\"doc\".*?</details>", "", (result.run_dir / "report.html").read_text(), flags=re.S)
    said += [text for text in re.split(r"<[^>]+>", page) if text.strip()]
    claims = [text for text in said if text.strip() != "GPU" and GPU_CLAIM.search(text)]
    assert claims == [], claims
    assert next(f for f in findings["findings"] if f["code"] == "GD101")["title"].startswith("Each step waits ")


def test_gd101_silent_when_two_workers_keep_up(gd: Gpudoctor) -> None:
    result = profile(gd, "loader_main_process.py", "--workers", "2")
    assert_silent(result, "GD101")
    assert_silent(result, "GD102")
    run = Run.from_bundle(result.run_dir)
    assert run.sites.loader.main.num_workers == 2
    wait = statistics.fmean(s.data_wait_s for s in run.step_view.steady_steps)
    # The twin is faster, not just outside the rule's scope: in the main process a batch costs the step at least
    # the 40 ms its 8 samples sleep, on any host; two workers hide part of it however loaded the host is (on a
    # quiet one nearly all: 1.6 ms of a 45 ms step; 19 ms was seen with the CI host's two cores busy).
    assert wait < 0.040, wait


# -- GD501 gil-contention -------------------------------------------------------------------------------


def test_gd501_fires_when_python_threads_feed_the_step(gd: Gpudoctor) -> None:
    script = rule_script("gil_threads.py")
    result = profile(gd, "gil_threads.py", "--threads", "2")
    finding = assert_fires(result, "GD501", "gil_contention", script, line_of(script, "FEEDER START"))
    facts = evidence(finding)
    assert facts["busy Python threads"] >= 2 and facts["threads started by the script"] == 2
    assert facts["process CPU"] <= 1.3
    assert facts["GIL probe wake-up delay"] >= 2.5  # ms: half the 5 ms switch interval
    run = Run.from_bundle(result.run_dir)
    assert [t.name for t in run.host.user_threads] == ["feeder-0", "feeder-1"]


def test_gd501_silent_with_one_thread(gd: Gpudoctor) -> None:
    result = profile(gd, "gil_threads.py", "--threads", "0")
    assert_silent(result, "GD501")
    run = Run.from_bundle(result.run_dir)
    assert run.host.user_threads == []
    assert run.host.python_thread_ids is not None and main_process(run).busy_among(run.host.python_thread_ids) == 1


def test_gd501_fires_on_a_program_with_no_step(gd: Gpudoctor) -> None:
    script = rule_script("gil_threads_stepless.py")
    result = profile(gd, "gil_threads_stepless.py", "--threads", "3")
    finding = assert_fires(result, "GD501", "gil_contention", script, line_of(script, "WORKER START"))
    facts = evidence(finding)
    assert facts["busy Python threads"] >= 2 and facts["process CPU"] <= 1.3
    assert finding["impact"] is None and "no GPU timeline" in finding["impact_reason"]
    assert result.findings()["run"]["step_source"] is None
    run = Run.from_bundle(result.run_dir)
    assert not run.step_view.all_steps and run.events(StepLessGilEvent)


def test_gd501_silent_on_a_program_with_no_step_and_one_thread(gd: Gpudoctor) -> None:
    result = profile(gd, "gil_threads_stepless.py", "--threads", "1")
    assert_silent(result, "GD501")
    assert Run.from_bundle(result.run_dir).events(StepLessGilEvent)  # watched, and found nothing to say


# -- GD502 fork-after-cuda-init: on a CPU, forks are recorded, and CUDA never was initialized -------------


def test_gd502_forks_recorded_but_silent_without_cuda(gd: Gpudoctor) -> None:
    script = rule_script("fork_workers.py")
    result = profile(gd, "fork_workers.py")
    assert_silent(result, "GD502")
    assert not findings_of(result, "GD502")
    run = Run.from_bundle(result.run_dir)
    assert run.host.forks and not any(f.cuda_initialized for f in run.host.forks)
    pool = [f for f in run.host.forks if not f.dataloader_worker]
    workers = [f for f in run.host.forks if f.dataloader_worker]
    assert len(pool) == 2 and len(workers) == 2, run.host.forks
    assert {f.location.line for f in pool} == {line_of(script, "POOL")}
    assert all(Path(f.location.file).resolve() == script.resolve() for f in run.host.forks)
    assert [e.cuda_initialized for e in result.events(ForkEvent)] == [False] * 4


# -- GD503 cpu-oversubscription -----------------------------------------------------------------------


def test_gd503_fires_when_workers_run_eight_threads_each(gd: Gpudoctor) -> None:
    script = rule_script("oversubscribed_workers.py")
    result = profile(gd, "oversubscribed_workers.py", "--worker-threads", "8")
    finding = assert_fires(result, "GD503", "cpu_oversubscription", script, line_of(script, "LOADER"))
    facts = evidence(finding)
    cores = facts["cores available"]
    assert facts["compute threads"] > 3 * cores and facts["child processes"] == 2
    assert facts["threads per child (max)"] >= 8
    assert "set_num_threads(1)" in finding["fix"]


def test_gd503_silent_with_one_thread_per_worker(gd: Gpudoctor) -> None:
    result = profile(gd, "oversubscribed_workers.py", "--worker-threads", "1")
    assert_silent(result, "GD503")
    run = Run.from_bundle(result.run_dir)
    children = [p for p in run.host.processes if p.role == "child"]
    assert len(children) == 2 and all(p.threads_max <= 3 for p in children), children


# -- GD504 cpu-contention -------------------------------------------------------------------------------


NEIGHBOURS = RULE_SCRIPTS / "neighbours.py"


def _spinner_alive(pid: int) -> bool:
    """A neighbour from neighbours.py still running (not exited, not a zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return "neighbours.py" in cmdline and state != "Z"


@pytest.fixture
def two_neighbours():
    """Two processes spinning on the host, started here so that they are never in the profiled script's tree;
    they stop when the test ends (or by themselves, after SCRIPT_TIMEOUT_S + 30 s or once pytest is gone)."""
    launched = subprocess.run([sys.executable, str(NEIGHBOURS), "launch", str(os.getpid()), "2",
                               str(SCRIPT_TIMEOUT_S + 30)], capture_output=True, text=True, check=True, timeout=30)
    pids = [int(line) for line in launched.stdout.split()]
    yield pids
    for pid in pids:
        if _spinner_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_gd504_fires_when_other_processes_take_the_cores(gd: Gpudoctor, two_neighbours: list[int]) -> None:
    result = profile(gd, "noisy_neighbours.py")
    assert all(_spinner_alive(pid) for pid in two_neighbours)  # they spun all through the run
    # The rule is about the host, not a line of the script: it names no location.
    finding = assert_fires(result, "GD504", "cpu_contention", None, None)
    facts = evidence(finding)
    assert facts["other processes' CPU"] >= 0.5 and facts["host CPU busy"] >= 85, facts
    # The main thread waits for a core while the neighbours spin (37-45% over three runs on a 2-core host,
    # where the neighbours made the median step 64-84 ms against 46 ms without them); that wait is the saving.
    assert facts["main thread waiting for a core"] >= 10 and finding["impact"] >= 0.1, finding
    run = Run.from_bundle(result.run_dir)
    assert not {p.pid for p in run.host.processes} & set(two_neighbours)


def test_gd504_silent_without_neighbours(gd: Gpudoctor) -> None:
    result = profile(gd, "noisy_neighbours.py")
    run = Run.from_bundle(result.run_dir)
    other = statistics.fmean(p.values["other_cores"] or 0.0 for p in run.host.step_samples.host)
    busy = statistics.fmean(p.values["busy_cores"] for p in run.host.step_samples.host) / (run.host.env.cpu_count or 1)
    fired = any(f["code"] == "GD504" for f in result.findings()["findings"])
    # No neighbour is started; on a quiet host (CI) GD504 stays silent. When something else on the
    # machine did take the CPU while the twin ran, GD504 is right to fire: it must agree with what was measured.
    assert fired == (other >= 0.5 and busy >= 0.85), (other, busy, fired)


# -- GD505 intra-op-threads-exceed-free-cores ------------------------------------------------------------


@pytest.fixture
def two_cores(two_neighbours: list[int]):
    """The test, so the profiled script, and the two neighbours all on the same two cores, whatever the host has."""
    before = os.sched_getaffinity(0)
    cores = set(sorted(before)[:2])
    for pid in [0, *two_neighbours]:
        os.sched_setaffinity(pid, cores)
    yield two_neighbours
    os.sched_setaffinity(0, before)


def test_gd505_fires_when_intra_op_threads_outnumber_the_free_cores(gd: Gpudoctor, two_cores: list[int]) -> None:
    result = profile(gd, "intra_op_threads.py", "--threads", "2")
    finding = assert_fires(result, "GD505", "cpu_oversubscription", None, None)
    facts = evidence(finding)
    print(facts)  # shown when the test fails: how far from the thresholds the run was
    assert facts["intra-op threads"] == 2 and facts["cores free"] < 1.5, facts
    assert "torch.set_num_threads(1)" in finding["fix"] and "OMP_NUM_THREADS=1" in finding["fix"]


def test_gd505_silent_with_one_intra_op_thread(gd: Gpudoctor, two_cores: list[int]) -> None:
    result = profile(gd, "intra_op_threads.py", "--threads", "1")
    assert_silent(result, "GD505")
