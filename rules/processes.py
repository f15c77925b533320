"""GD5xx: processes and threads: the GIL, forks after CUDA init, and the CPU the job gets."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

from gpudoctor import Finding, LoaderRemedy, Remedy, Run, rule
from gpudoctor.analysis import ProcessInfo, cpu_wait_evidence, worker_cpu_per_batch_s

DEFAULT_SWITCH_INTERVAL_S = 0.005  # CPython's default, for a bundle that did not record the script's own


@rule("GD501", "gil-contention", category="gil_contention")
def gil_contention(run: Run, min_threads: int = 2, max_process_cores: float = 1.3,
                   min_probe_delay_share: float = 0.5) -> Iterator[Finding]:
    """Several Python threads feed the GPU, and they take turns on the GIL.

    What it detects: at least `min_threads` Python threads in the training process taking turns on its
    work (each using at least 0.05 core and a quarter of the busiest one's), the process using no more
    than `max_process_cores` cores in total, and gpudoctor's GIL probe waking late — on
    average at least `min_probe_delay_share` of the interpreter's switch interval — because another
    thread holds the GIL. Silent on free-threaded Python (no GIL). A program that marks no step at all
    (worker threads and no training loop) is watched by the probe from its first second to its end.

    Why it matters: only one thread runs Python at a time; threads that prepare tensors and launch
    kernels serialize, and the GPU idles while they wait for each other.

    Fix: one process per worker stream (`torch.multiprocessing` with spawn), or a single thread that
    launches batched work; keep Python-heavy preprocessing in DataLoader worker processes.

    Impact: the time the threads wait for each other, measured from their own CPU: the busiest thread runs a
    share of the wall time (its cores) and waits for the GIL the rest; in processes of their own the step is as
    long as its work, at most the GPU's idle saved. gil_contention_bad: its busiest thread ran 26% of the time,
    74% predicted against its twin's 96% (71.3 → 3.1 ms); threadpool_inference_bad: 81% against 93%. The GPU's
    idle, which this replaced, promised 99% there (126 → 1.0 ms, a 122× step).
    """
    if run.host.env.gil_enabled is False:
        return
    processes = run.require_processes()
    gil = run.require_gil()
    main = next((p for p in processes if p.role == "main"), None)
    if main is None:
        return
    threads = run.host.user_threads
    switch = run.host.env.switch_interval_s or DEFAULT_SWITCH_INTERVAL_S
    delay = statistics.fmean(g.mean_s for g in gil)
    # intra-op and CUDA threads run without the GIL, and torch's own (a pin-memory thread) beside the work: only the
    # script's Python threads count
    python_ids = run.host.work_thread_ids
    busy = main.sharing_among(python_ids) if python_ids is not None else main.busy_threads
    if busy < min_threads or main.cpu_mean > max_process_cores or delay < min_probe_delay_share * switch:
        return
    # the step's idle as the report's summary gives it: at the run's pace, without the profiler's own cost
    idle = run.budget.idle_share if run.budget is not None else run.gpu_work.idle_share
    own = _busiest_thread_cores(main, python_ids)
    impact = min(idle, max(0.0, 1.0 - own)) if idle is not None else None
    site = threads[0].location if threads else None
    yield Finding(
        f"{busy} busy Python threads share one GIL: the process runs on {main.cpu_mean:.1f} cores",
        impact=impact, impact_reason=None if impact is not None else
        "no GPU timeline in this run to measure the idle time",
        location=site, count=len(threads),
        evidence={"busy Python threads": busy, "threads started by the script": len(threads),
                  "process CPU": (round(main.cpu_mean, 2), "cores"),
                  "busiest thread's CPU": (round(own * 100), "% of a core"),
                  "GIL probe wake-up delay": (round(delay * 1e3, 2), "ms"),
                  "GPU idle": (round(idle * 100), "%") if idle is not None else None},
        fix="use processes instead of threads (torch.multiprocessing with the spawn start method), or one "
            "thread launching batched work",
    )


def _busiest_thread_cores(main: ProcessInfo, python_ids: set[int] | None) -> float:
    """The cores the busiest of the threads taking turns on the GIL uses: the share of the wall time it runs. Each
    waits for the GIL the rest of the time; in processes of their own none waits, and the step is as long as
    the busiest one's own work."""
    cores = [c for tid, c in main.thread_cores.items() if python_ids is None or int(tid) in python_ids]
    return max(cores, default=main.cpu_mean)


CUDA_FORK_ERROR = "Cannot re-initialize CUDA in forked subprocess"
# A DataLoader worker runs two threads of its own (its loop and the one reading its queue), measured
# in every recorded fixture whose workers keep one intra-op thread (threads_max == 3 with the pool's).
WORKER_BASE_THREADS = 2


@rule("GD502", "fork-after-cuda-init", category="fork_after_cuda")
def fork_after_cuda_init(run: Run) -> Iterator[Finding]:
    """A process was forked after CUDA was initialized, outside the DataLoader, or a forked process crashed on CUDA.

    What it detects: `fork()` — multiprocessing's fork start method, a fork-context Pool, `os.fork` — after the
    training process initialized CUDA, and runs that crashed with "Cannot re-initialize CUDA in forked
    subprocess". DataLoader workers forked after CUDA init are left alone: PyTorch supports them, and they
    fail loudly (that crash) if their dataset touches CUDA.

    Why it matters: CUDA does not survive fork. A child that touches CUDA crashes; one that does not
    works only while no library call in it initializes CUDA.

    Fix: `multiprocessing.set_start_method("spawn")` (or "forkserver") before creating processes, or
    `DataLoader(..., multiprocessing_context="spawn", persistent_workers=True)`.

    Severity: critical when the run crashed on it, else warning.
    """
    crashed = run.host.exit.message is not None and CUDA_FORK_ERROR in run.host.exit.message
    forks = [f for f in run.host.forks if f.cuda_initialized]
    own = [f for f in forks if not f.dataloader_worker]
    if not own and not crashed:
        return
    first = (own or forks or [None])[0]
    title = ("The script crashed: a forked process tried to use CUDA" if crashed else
             f"{len(own)} processes forked after CUDA was initialized")
    yield Finding(
        title, impact=None, impact_reason="a correctness risk, not a cost in step time",
        severity="critical" if crashed else "warning",
        location=(first.location if first else None) or run.host.exit.location, count=max(1, len(own or forks)),
        evidence={"forks after CUDA init": len(forks), "of them DataLoader workers": len(forks) - len(own),
                  "start method": first.start_method if first else None, "crashed": crashed},
        fix='DataLoader(..., multiprocessing_context="spawn", persistent_workers=True), or '
            'multiprocessing.set_start_method("spawn") before starting processes',
        remedy=Remedy(start_method="spawn", loader=LoaderRemedy(multiprocessing_context="spawn",
                                                                persistent_workers=True)),
    )


@rule("GD503", "cpu-oversubscription", category="cpu_oversubscription", claims="data_wait")
def cpu_oversubscription(run: Run, max_demand_per_core: float = 3.0, min_busy_share: float = 0.5) -> Iterator[Finding]:
    """More runnable threads than cores: loader workers × intra-op threads (× ranks) exceed the CPU.

    What it detects: the script's compute threads — the training process's intra-op threads plus, for
    each child process, the threads beyond the two every DataLoader worker has — outnumber the cores
    available by more than `max_demand_per_core`, while the CPU is in use (the tree uses at least
    `min_busy_share` of the cores, or the load average exceeds the cores).

    Why it matters: threads that outnumber cores time-slice; OpenMP pools spin and wait for each other,
    and every worker runs slower than it would with fewer threads.

    Fix: one intra-op thread per loader worker (`worker_init_fn=lambda _: torch.set_num_threads(1)`),
    and `torch.set_num_threads(cores // ranks)` in the training process.

    Impact: the share of the steps after start-up the GPU idles waiting for data, the most that fewer threads
    can give back (the recorded twin with one thread per worker ran as fast when the loader kept up).
    """
    processes = run.require_processes()
    samples = run.require_host_samples().host
    cores, ranks = run.host.env.cores or 1, run.host.env.ranks_on_host
    children = [p for p in processes if p.role == "child"]
    per_rank = (run.host.env.intra_op_threads or 1) + sum(max(1, p.threads_max - WORKER_BASE_THREADS) for p in children)
    demand = per_rank * ranks  # every rank on this host runs the same threads
    tree = statistics.fmean((p.values["tree_cores"] or 0.0) + (p.values.get("job_cores") or 0.0) for p in samples)
    load = max((p.values.get("load1") or 0.0) for p in samples)
    if demand <= max_demand_per_core * cores or (tree < min_busy_share * cores and load <= cores):
        return
    loader = run.sites.loader.main
    yield Finding(
        f"{demand} compute threads compete for {cores} cores"
        + (f" ({ranks} ranks of {per_rank} each)" if ranks > 1 else ""),
        impact=run.steady_wait_share, impact_reason="no step data to estimate from",
        location=loader.location if loader else None,
        evidence={"compute threads": demand, "cores available": cores, "child processes": len(children),
                  "threads per child (max)": max((p.threads_max for p in children), default=0),
                  "intra-op threads (main)": run.host.env.intra_op_threads, "load average": round(load, 1),
                  "CPU used by the job": (round(tree, 1), "cores"), "ranks on this host": ranks}
        | cpu_wait_evidence(run.host.cpu_wait),
        fix="DataLoader(..., worker_init_fn=lambda _: torch.set_num_threads(1)) and "
            f"torch.set_num_threads({max(1, cores // (2 * ranks))}) in the training process"
            + (f" (of each of the {ranks} ranks)" if ranks > 1 else ""),
        remedy=Remedy(loader=LoaderRemedy(worker_threads=1) if children else None,
                      intra_op_threads=max(1, cores // (2 * ranks))),
    )


def _host_bound_share(run: Run) -> float | None:
    """The share of the step the GPU idles (or, with no GPU timeline, the host waits for data)."""
    idle = run.gpu_work.idle_share
    if idle is not None:
        return idle
    if not run.steps:
        return None
    return sum(s.data_wait_s for s in run.steps) / run.step_view.wall_s


@rule("GD504", "cpu-contention", category="cpu_contention")
def cpu_contention(run: Run, min_other_cores: float = 0.5, busy_host_share: float = 0.85) -> Iterator[Finding]:
    """Other programs on the host take CPU the job needs.

    What it detects: processes outside the script's tree use at least `min_other_cores` cores on
    average while the host's CPUs are at least `busy_host_share` busy.

    Why it matters: the loader workers and the launching thread get less CPU than they ask for; the
    GPU waits for them. The saving counted is the time the main thread waits for a core (Linux's
    scheduler statistics) in proportion to the busy CPU other programs take, plus, where workers load the
    batches, the wait for data in proportion to the cores they take; with a GPU timeline, at most the GPU's idle
    time; and never more than leaves the step the job's own work with the cores to itself (the main thread's
    CPU in a step, the loader's CPU for a batch over its workers: cpu_contention_bad, H100, 66.7 ms steps with
    at least 20.5 ms of the workers' CPU in each; its twin alone ran 31.7 ms).

    Fix: stop or move the other programs, or pin the job to its own cores (`taskset`, cgroups, a
    container CPU limit for the neighbours).
    """
    samples = run.require_host_samples().host
    cores = run.host.env.cpu_count or run.host.env.cores or 1
    points = [p for p in samples if p.values.get("other_cores") is not None]
    if not points:
        return
    other = statistics.fmean(p.values["other_cores"] for p in points)
    busy_cores = statistics.fmean(p.values["busy_cores"] for p in points)
    busy = busy_cores / cores
    if other < min_other_cores or busy < busy_host_share:
        return
    delay = _main_run_delay_share(run)
    evidence = {"other processes' CPU": (round(other, 2), "cores"), "host CPU busy": (round(busy * 100), "%"),
                "cores": cores}
    if delay is not None:
        evidence["main thread waiting for a core"] = (round(delay * 100, 1), "%")
    evidence |= cpu_wait_evidence(run.host.cpu_wait)
    yield Finding(
        f"Other processes use {other:.1f} of {cores} cores while the host is {busy:.0%} busy",
        impact=_contention_share(run, other / cores, delay, min(1.0, other / busy_cores)) if run.steps else None,
        impact_reason="no step to estimate from: the run ended before its first step" if not run.steps
        else "no step data to estimate from",
        evidence=evidence,
        fix="stop or move the other programs, or give the job its own cores (taskset, cgroups)",
    )


def _main_run_delay_share(run: Run) -> float | None:
    """The share of the time the script's main thread was ready to run but waited for a core."""
    main = next((p for p in run.host.processes if p.role == "main"), None)
    return main.run_delay_share if main is not None else None


def _contention_share(run: Run, other_share: float, delay: float | None, other_of_busy: float) -> float | None:
    """The share of the step other programs cost: the loader's wait for data (or, with a GPU timeline, the GPU's
    idle time) in proportion to the cores they take, plus the time the main thread waited for a core, in
    proportion to the busy CPU they take (the job's own processes delay it too). A loader in the main process
    loads on the main thread, whose wait for a core already holds the wait for data's: then that wait alone.
    With a GPU timeline, at most the step's budget slices that a host short of CPU can cost (waiting for data,
    host-side work, unexplained): a delayed host costs the step nothing while the GPU has queued work. Without
    one, at most the step less what the main thread computes in it (`run.host.main_thread_cpu_s`): the other programs
    gone, the step still takes its own work (a starved loop on a 2-core host with two busy neighbours: 405 ms
    steps, 57 ms of the main thread's CPU in each)."""
    host_bound = _host_bound_share(run)
    waiting = None if host_bound is None else host_bound * min(1.0, other_share)
    if delay is None:
        return waiting
    loader = run.sites.loader.main
    if loader is None or loader.num_workers == 0:
        waiting = None
    budget = run.budget
    if budget is not None:
        cap = budget.share_of("cpu_contention")
    elif run.gpu_work.idle_share is not None:
        cap = run.gpu_work.idle_share
    else:
        cap = 1.0
    alone, step = _step_alone_s(run), run.pace.seconds
    if alone is not None and step:
        cap = min(cap, max(0.0, 1.0 - alone / step))
    return min(cap, (waiting or 0.0) + delay * other_of_busy)


def _step_alone_s(run: Run) -> float | None:
    """The least a step takes with the host's cores to itself: the main thread's own CPU in it, and the loader's
    CPU for a batch shared among its workers, whichever is longer; None where neither was measured."""
    own = run.host.main_thread_cpu_s
    loader = run.sites.loader.main
    per_batch = worker_cpu_per_batch_s(run) if loader is not None and loader.num_workers > 0 else None
    loading = per_batch / loader.num_workers if per_batch is not None and loader is not None else None
    known = [s for s in (own, loading) if s is not None]
    return max(known) if known else None


@rule("GD505", "intra-op-threads-exceed-free-cores", category="cpu_oversubscription")
def intra_op_threads_exceed_free_cores(run: Run, min_main_cores: float = 0.1,
                                       min_threads_per_free_core: float = 2.0) -> Iterator[Finding]:
    """torch runs more intra-op threads than the host has cores free for them.

    What it detects: the training process's intra-op thread pool (`torch.get_num_threads()`, by default one
    thread per core) has at least `min_threads_per_free_core` threads for each core left once other programs
    and the script's own child processes (DataLoader workers) have taken theirs, while the training process
    itself uses at least `min_main_cores` cores. A pool a few threads larger than the free cores is left alone:
    the recorded cpu_oversubscription_bad (16 threads, 11 cores free) is GD503's, and its fix measured no gain.

    Why it matters: an intra-op pool waits for all its threads at the end of every parallel operator. On a
    shared host, a thread that has no core stalls the whole operator until the OS schedules it: a tiny model's
    step measured 242 ms with two threads on two cores that other programs kept busy, and 13 ms with one.

    Fix: `torch.set_num_threads(N)` at the start of the script (or `OMP_NUM_THREADS=N` in its environment), with
    N the cores free for it; the finding says which N.
    """
    processes = run.require_processes()
    samples = run.require_host_samples().host
    threads, cores = run.host.env.intra_op_threads, run.host.env.cores
    main = next((p for p in processes if p.role == "main"), None)
    others = [p.values["other_cores"] for p in samples if p.values.get("other_cores") is not None]
    if threads is None or cores is None or main is None or not others:
        return
    other_cores = statistics.fmean(others)
    workers = sum(p.cpu_mean for p in processes if p.role == "child")
    free = max(0.0, cores - other_cores - workers)
    if threads <= 1 or threads < min_threads_per_free_core * max(1.0, free) or main.cpu_mean < min_main_cores:
        return
    suggested = max(1, int(free))
    yield Finding(
        f"torch runs {threads} intra-op threads with {free:.1f} of {cores} cores free for them",
        impact=None, impact_reason="a thread pool on too few cores slows down far more than the cores missing: "
                                   "measure the step again with the fix",
        evidence={"intra-op threads": threads, "cores available": cores,
                  "cores taken by other programs": (round(other_cores, 2), "cores"),
                  "cores taken by the script's child processes": (round(workers, 2), "cores"),
                  "cores free": (round(free, 2), "cores"),
                  "training process CPU": (round(main.cpu_mean, 2), "cores")},
        fix=f"torch.set_num_threads({suggested}) at the start of the script, or OMP_NUM_THREADS={suggested} "
            "in its environment",
        remedy=Remedy(intra_op_threads=suggested),
    )
