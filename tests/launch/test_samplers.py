"""The parent's host and process-tree samplers: /proc read directly gives what psutil gives, new processes
are found, exited ones are skipped."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpudoctor.launch import procfs, readers
from gpudoctor.launch.procfiles import PROCFS, ProcFiles
from gpudoctor.launch.procfs import ProcfsHost, ProcfsTree
from gpudoctor.launch.psutil_readers import PsutilHost, PsutilTree
from gpudoctor.launch.samplers import HostSampler

pytestmark = pytest.mark.skipif(not PROCFS, reason="reads /proc (Linux)")

# A worker: one extra thread, then waits until its parent closes its stdin (or dies).
WORKER = (
    "import sys, threading, time\n"
    "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "print('up', flush=True)\n"
    "sys.stdin.read()\n"
)
# The script's process: some CPU time, three idle threads, one worker; then it follows commands on stdin.
ROOT = (
    "import subprocess, sys, threading, time\n"
    "sum(range(3_000_000))\n"
    "for _ in range(3):\n"
    "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "workers = []\n"
    "def spawn():\n"
    "    w = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
    "    w.stdout.readline()\n"
    "    workers.append(w)\n"
    "    print(w.pid, flush=True)\n"
    "spawn()\n"
    "for line in sys.stdin:\n"
    "    if line.strip() == 'spawn':\n"
    "        spawn()\n"
    "    elif line.strip() == 'end-first-worker':\n"
    "        workers[0].kill(); workers[0].wait(); print('ended', flush=True)\n"
)


class Tree:
    """A running ROOT process; `command()` sends it one line and returns its answer."""

    def __init__(self) -> None:
        self.root = subprocess.Popen([sys.executable, "-c", ROOT, WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.workers = [int(self.root.stdout.readline())]

    @property
    def pid(self) -> int:
        return self.root.pid

    def command(self, line: str) -> str:
        self.root.stdin.write(line + "\n")
        self.root.stdin.flush()
        return self.root.stdout.readline().strip()

    def spawn(self) -> int:
        self.workers.append(int(self.command("spawn")))
        return self.workers[-1]

    def close(self) -> None:
        for pid in self.workers:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        self.root.kill()
        self.root.wait()


@pytest.fixture
def tree():
    running = Tree()
    yield running
    running.close()


def _rows(reader: ProcfsTree | PsutilTree) -> dict[int, dict]:
    return {row.pid: row.to_json() for row in reader.sample()}


@pytest.mark.e2e
def test_process_values_match_psutil(tree: Tree) -> None:
    ours = _rows(ProcfsTree(ProcFiles(64), tree.pid))
    theirs = _rows(PsutilTree(tree.pid))
    assert set(ours) == set(theirs) == {tree.pid, tree.workers[0]}
    for pid, row in ours.items():
        other = theirs[pid]
        # the same keys, in the same order; psutil has no reader of each thread's run delay
        assert [key for key in row if key != "thread_run_delay"] == list(other)
        assert set(row["thread_run_delay"]) == set(row["thread_cpu"])  # schedstat: CPU and run delay in one read
        for key in ("pid", "ppid", "name", "rss", "threads"):
            assert row[key] == other[key], key
        assert row["cpu_s"] == pytest.approx(other["cpu_s"], abs=0.02)
        assert set(row["thread_cpu"]) == set(other["thread_cpu"])
        for tid, seconds in row["thread_cpu"].items():
            assert seconds == pytest.approx(other["thread_cpu"][tid], abs=0.02)
        assert 0 <= other["ctx_vol"] - row["ctx_vol"] <= 5 and 0 <= other["ctx_invol"] - row["ctx_invol"] <= 5
        assert 0 <= other["run_delay_s"] - row["run_delay_s"] <= 0.05
    root = ours[tree.pid]
    assert root["threads"] == 4 and root["cpu_s"] > 0.01  # its main thread and three idle ones; the sum it made
    assert ours[tree.workers[0]]["ppid"] == tree.pid


@pytest.mark.e2e
def test_the_root_comes_first(tree: Tree) -> None:
    assert ProcfsTree(ProcFiles(64), tree.pid).sample()[0].pid == tree.pid


@pytest.mark.e2e
def test_without_held_files_the_values_are_the_same(tree: Tree) -> None:
    held = _rows(ProcfsTree(ProcFiles(64), tree.pid))
    opened_each_time = _rows(ProcfsTree(ProcFiles(0), tree.pid))
    assert held.keys() == opened_each_time.keys()
    for pid, row in held.items():
        assert set(row["thread_cpu"]) == set(opened_each_time[pid]["thread_cpu"])
        assert row["rss"] == opened_each_time[pid]["rss"]


def test_host_values_match_psutil() -> None:
    files = ProcFiles(8)
    ours, theirs = ProcfsHost(files).sample(0.0).to_json(), PsutilHost().sample(0.0).to_json()
    assert list(ours) == list(theirs)
    assert len(ours["cpu_pct"]) == psutil.cpu_count() and all(0 <= p <= 100 for p in ours["cpu_pct"])
    for key in ("mem_total", "swap_in", "swap_out"):
        assert ours[key] == theirs[key], key
    assert ours["mem_available"] == pytest.approx(theirs["mem_available"], rel=0.05)
    assert ours["swap_used"] == pytest.approx(theirs["swap_used"], abs=64 << 20)
    assert ours["load"] == pytest.approx(theirs["load"], abs=0.5)


def test_busy_percent_is_psutils_formula() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice; iowait went back by 5 ticks
    before = [100, 0, 50, 1000, 20, 0, 0, 0, 10, 0]
    after = [160, 0, 70, 1100, 15, 0, 0, 0, 30, 0]
    # deltas 60 user, 20 system, 100 idle, iowait counted as 0, 20 guest (already in user): 80 busy of 180
    assert procfs._busy_percent(before, after) == round(80 / 180 * 100, 1)


@pytest.mark.e2e
def test_a_worker_started_later_is_found_within_the_walk_interval(tree: Tree, monkeypatch) -> None:
    monkeypatch.setattr(procfs, "NEW_PIDS_MAX", 0)  # only the walk of the whole tree can find it
    reader = ProcfsTree(ProcFiles(64), tree.pid)
    reader.sample()
    worker = tree.spawn()
    assert _found_within(reader, worker, procfs.REDISCOVER_S + 0.5)


@pytest.mark.e2e
def test_a_worker_started_later_is_found_by_its_new_pid(tree: Tree, monkeypatch) -> None:
    monkeypatch.setattr(procfs, "REDISCOVER_S", 3600.0)  # no walk of the whole tree after the first
    # However many pids other programs on this host take meanwhile, every new one is looked at.
    monkeypatch.setattr(procfs, "NEW_PIDS_MAX", 1_000_000)
    reader = ProcfsTree(ProcFiles(64), tree.pid)
    reader.sample()
    worker = tree.spawn()
    assert _found_within(reader, worker, 0.3)


def _found_within(reader: ProcfsTree, pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = _rows(reader)
        if pid in rows:
            assert rows[pid]["threads"] == 2 and len(rows[pid]["thread_cpu"]) == 2
            return True
        time.sleep(0.1)
    return False


@pytest.mark.e2e
def test_an_exited_worker_is_skipped(tree: Tree) -> None:
    reader = ProcfsTree(ProcFiles(64), tree.pid)
    assert set(_rows(reader)) == {tree.pid, tree.workers[0]}
    assert tree.command("end-first-worker") == "ended"
    assert set(_rows(reader)) == {tree.pid}  # known, then gone before this sample read it


@pytest.mark.e2e
def test_after_the_root_exits_samples_are_empty(tree: Tree) -> None:
    files = ProcFiles(64)
    reader = ProcfsTree(files, tree.pid)
    assert reader.sample()
    tree.root.kill()
    tree.root.wait()
    assert reader.sample() == [] and reader.sample() == []
    assert files.held == 0


@pytest.mark.e2e
def test_a_thread_that_exits_is_dropped() -> None:
    script = ("import threading, time\n"
              "t = threading.Thread(target=time.sleep, args=(0.5,)); t.start()\n"
              "print('up', flush=True); time.sleep(3600)\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        process.stdout.readline()
        reader = ProcfsTree(ProcFiles(64), process.pid)
        assert len(reader.sample()[0].thread_cpu) == 2
        time.sleep(0.7)
        row = reader.sample()[0].to_json()
        assert row["threads"] == 1 and list(row["thread_cpu"]) == [str(process.pid)]
    finally:
        process.kill()
        process.wait()


# The script's process: a middle process that starts a sleeping grandchild, then exits when told to, which
# re-parents the grandchild away from the script (to init or the host's subreaper).
ORPHANING_ROOT = (
    "import subprocess, sys\n"
    "middle_code = ('import subprocess, sys\\n'\n"
    "    'g = subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(60)\"])\\n'\n"
    "    'print(g.pid, flush=True); sys.stdin.readline()\\n')\n"
    "middle = subprocess.Popen([sys.executable, '-c', middle_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,\n"
    "                          text=True)\n"
    "print(middle.pid, middle.stdout.readline().strip(), flush=True)\n"
    "sys.stdin.readline()\n"
    "middle.stdin.write('\\n'); middle.stdin.flush(); middle.wait()\n"
    "print('middle gone', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.e2e
def test_a_process_re_parented_away_leaves_the_tree_at_the_next_sample(monkeypatch) -> None:
    monkeypatch.setattr(procfs, "REDISCOVER_S", 3600.0)  # no walk of the whole tree after the first
    root = subprocess.Popen([sys.executable, "-c", ORPHANING_ROOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    middle, grandchild = map(int, root.stdout.readline().split())
    try:
        reader = ProcfsTree(ProcFiles(64), root.pid)
        assert set(_rows(reader)) == {root.pid, middle, grandchild}
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline().strip() == "middle gone"
        assert psutil.Process(grandchild).ppid() != middle  # still running, somebody else's now
        assert set(_rows(reader)) == {root.pid}
        assert set(_rows(reader)) == {root.pid}  # and not found again
    finally:
        psutil.Process(grandchild).kill()
        root.kill()
        root.wait()


@pytest.mark.e2e
def test_host_sampler_writes_the_same_lines_and_closes_its_files(tree: Tree, tmp_path: Path) -> None:
    sampler = HostSampler(tmp_path, 0.05)
    sampler.watch(tree.pid)
    sampler.start()
    time.sleep(0.5)
    sampler.stop()
    assert sampler.samples >= 5 and sampler.cpu_s > 0
    assert sampler._files.held == 0
    host = [json.loads(line) for line in (tmp_path / "samples" / "host.jsonl").read_text().splitlines()]
    procs = [json.loads(line) for line in (tmp_path / "samples" / "procs.jsonl").read_text().splitlines()]
    assert len(host) == len(procs) == sampler.samples
    base = ["t", "cpu_pct", "load", "mem_total", "mem_available", "swap_used", "swap_in", "swap_out"]
    assert list(host[-1])[:len(base)] == base
    # where this machine keeps them: the host's CPU pressure and the cgroup's throttling
    assert set(list(host[-1])[len(base):]) <= {"cpu_pressure_s", "throttled_s"}
    assert ("cpu_pressure_s" in host[-1]) == Path("/proc/pressure/cpu").exists()
    assert [p["pid"] for p in procs[-1]["procs"]] == [tree.pid, tree.workers[0]]
    assert list(procs[-1]["procs"][0]) == ["pid", "ppid", "name", "cpu_s", "rss", "threads", "ctx_vol",
                                           "ctx_invol", "thread_cpu", "run_delay_s", "thread_run_delay", "gpu"]


@pytest.mark.e2e
def test_a_long_name_is_completed_from_the_command_line(tmp_path: Path) -> None:
    python = tmp_path / "python-with-a-long-name"
    python.symlink_to(sys.executable)
    process = subprocess.Popen([str(python), "-c", "print('up', flush=True); import time; time.sleep(3600)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        process.stdout.readline()
        row = ProcfsTree(ProcFiles(64), process.pid).sample()[0].to_json()
        assert row["name"] == psutil.Process(process.pid).name() == "python-with-a-long-name"
    finally:
        process.kill()
        process.wait()


@pytest.mark.e2e
def test_psutil_reads_the_tree_where_proc_cannot(tree: Tree) -> None:
    assert isinstance(readers.tree_reader(None, tree.pid), PsutilTree)
    assert isinstance(readers.host_reader(None), PsutilHost)
    assert isinstance(readers.tree_reader(ProcFiles(64), tree.pid), ProcfsTree)
    tree.root.kill()
    tree.root.wait()
    assert readers.tree_reader(ProcFiles(64), tree.pid) is None


# -- long runs: compaction and the profiling windows ------------------------------------------------


def test_window_spans_follow_the_events_file_as_it_grows(tmp_path) -> None:
    from gpudoctor.launch.samplers import WINDOW_MARGIN_S, WindowSpans

    events = tmp_path / "events.jsonl"
    spans = WindowSpans(events)
    assert spans.spans() == []  # no file yet
    with open(events, "w") as f:
        f.write(json.dumps({"kind": "step", "step": 0, "t": 99.0}, separators=(",", ":")) + "\n")
        f.write(json.dumps({"kind": "window", "state": "opened", "index": 0, "t": 100.0}, separators=(",", ":")) + "\n")
    assert spans.spans() == [(100.0 - WINDOW_MARGIN_S, float("inf"))]  # open: nothing after it is merged
    with open(events, "a") as f:
        f.write(json.dumps({"kind": "window", "state": "closed", "index": 0, "t": 103.0}, separators=(",", ":")) + "\n")
        f.write('{"kind":"window","state":"opened"')  # a line being written
    assert spans.spans() == [(100.0 - WINDOW_MARGIN_S, 103.0 + WINDOW_MARGIN_S)]


def test_a_sample_file_compacts_old_rows_and_keeps_appending(tmp_path) -> None:
    from gpudoctor.bundle import read_jsonl
    from gpudoctor.launch.samplers import SampleFile

    file = SampleFile(tmp_path, "host")
    start = time.time() - 3600
    for i in range(36_000):  # an hour at 10 Hz, the first 30 minutes of it long past
        file.write({"t": start + i / 10, "cpu_pct": [float(i % 100)], "mem_available": 10**9 - i, "swap_in": i})
    window = (start + 600.0, start + 603.0)
    file.compact(start + 3600, keep=[window])
    file.write({"t": start + 3600.1, "cpu_pct": [1.0], "mem_available": 1, "swap_in": 36_000})
    file.close()
    rows = list(read_jsonl(file.path))
    assert len(rows) < 36_000 / 2
    assert rows[-1]["t"] == start + 3600.1  # written after the compaction, into the new file
    assert min(r.get("lo", r)["mem_available"] for r in rows[:-1]) == 10**9 - 35_999
    assert all("n" not in r for r in rows if window[0] <= r["t"] <= window[1])


def test_only_the_latest_windows_stay_raw(tmp_path) -> None:
    from gpudoctor.launch.samplers import KEEP_RAW_S, WINDOW_MARGIN_S, WindowSpans

    events = tmp_path / "events.jsonl"
    with open(events, "w") as f:
        for i in range(1000):  # --every 10m for a week: a 2 s window every 600 s
            for state, t in (("opened", i * 600.0), ("closed", i * 600.0 + 2.0)):
                f.write(json.dumps({"kind": "window", "state": state, "t": t}, separators=(",", ":")) + "\n")
    spans = WindowSpans(events).spans()
    assert sum(end - start for start, end in spans) <= KEEP_RAW_S
    assert spans[-1] == (999 * 600.0 - WINDOW_MARGIN_S, 999 * 600.0 + 2.0 + WINDOW_MARGIN_S)  # the latest
    assert len(spans) == int(KEEP_RAW_S // (2.0 + 2 * WINDOW_MARGIN_S))


def test_the_run_delay_is_read_from_a_schedstat_line() -> None:
    from gpudoctor.launch.procfiles import run_delay_seconds

    assert run_delay_seconds(b"44806423 2500000000 134\n") == 2.5  # nanoseconds waiting for a CPU
    assert run_delay_seconds(b"") is None and run_delay_seconds(b"12 x 3") is None
    schedstat = Path("/proc/self/schedstat")
    if schedstat.exists():  # a kernel built with scheduler statistics: the line parses
        assert isinstance(run_delay_seconds(schedstat.read_bytes()), float)


def test_the_hosts_cpu_pressure_and_the_cgroups_throttling_are_read_from_their_files() -> None:
    from gpudoctor.launch.cpu_limits import pressure_seconds, throttled_seconds

    psi = b"some avg10=0.60 avg60=1.13 avg300=0.97 total=10745545\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    assert pressure_seconds(psi) == pytest.approx(10.745545)  # microseconds some task waited for a core
    assert pressure_seconds(b"") is None
    v2 = b"usage_usec 9000\nuser_usec 6000\nsystem_usec 3000\nnr_periods 40\nnr_throttled 7\nthrottled_usec 2500000\n"
    v1 = b"nr_periods 40\nnr_throttled 7\nthrottled_time 1500000000\n"
    assert throttled_seconds(v2) == 2.5 and throttled_seconds(v1) == 1.5
    assert throttled_seconds(b"usage_usec 9000\n") is None  # a cgroup without a CPU limit's statistics


def test_the_cgroups_cpu_stat_is_found_under_its_hierarchy(tmp_path: Path, monkeypatch) -> None:
    from gpudoctor.launch import cpu_limits

    (tmp_path / "job.slice").mkdir()
    (tmp_path / "job.slice" / "cpu.stat").write_bytes(b"nr_throttled 0\nthrottled_usec 0\n")
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/job.slice\n")
    monkeypatch.setattr(cpu_limits, "CGROUP_ROOT", str(tmp_path))
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(cgroup if path == "/proc/1/cgroup" else path,
                                                                          *a, **k))
    assert cpu_limits.cgroup_cpu_stat(1) == str(tmp_path / "job.slice" / "cpu.stat")
    cgroup.write_text("0::/not-mounted-here\n")  # a container's namespace: the mounted root's
    (tmp_path / "cpu.stat").write_bytes(b"throttled_usec 5\n")
    assert cpu_limits.cgroup_cpu_stat(1) == str(tmp_path / "cpu.stat")
    cgroup.write_text("4:memory:/x\n")
    assert cpu_limits.cgroup_cpu_stat(1) is None  # no CPU controller


@pytest.mark.e2e
def test_each_threads_run_delay_is_sampled_beside_its_cpu(tree: Tree) -> None:
    """/proc/PID/task/TID/schedstat: a thread's time on a CPU and its wait for one, both running totals."""
    [root] = [row for row in ProcfsTree(ProcFiles(64), tree.pid).sample() if row.pid == tree.pid]
    assert set(root.thread_run_delay) == set(root.thread_cpu) and len(root.thread_cpu) == 4
    assert all(delay >= 0 for delay in root.thread_run_delay.values())
    assert root.thread_cpu[str(tree.pid)] > 0.01  # the main thread's sum
