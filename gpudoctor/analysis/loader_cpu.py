"""What the DataLoader's workers cost: their CPU per batch, and so how fast they can deliver; and what loading a
batch waits on, the CPU or something else (a file, the network), which sizes how many workers to suggest.

A loader whose rank waits for another rank in every collective is never seen starving: its workers fill their
queue and idle. Their CPU per batch still says how fast they could go: N workers deliver a batch at most every
(CPU per batch / N) seconds, given N cores. That is the limit a straggler's fix runs into.

Loading a batch takes its time on a core, waiting for a core, or waiting for something else. Where the figures
come from: with no workers, the training thread loads the batches itself, and its CPU time in each wait for a
batch (time.thread_time around DataLoader's __next__, StepEvent.data_wait_cpu_s) over that wait's wall time is the
share on a core; its wait for a core is the main thread's run delay (/proc/PID/schedstat, from the samples), taken
as spread evenly over the step. With workers, each worker is a process of its own: its mean CPU (cores, from the
samples) and its run delay, over steps where the loader starves and the workers make batches without pause. What
is left is waiting on I/O: a loader that waits so at least half of its time gains from more workers than it has
cores, each worker using only its share of a core (rules/input_pipeline.py sizes them).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudoctor.analysis.run import Run
from gpudoctor.analysis.views import ProcessInfo

# Loading that waits at least this share of its time on something other than a core (I/O) is I/O-bound: more
# workers than cores then help, as each waits most of its time. The recorded workers held back by other programs
# (cpu_contention_bad: 0.31-0.38 of a core, 0.39-0.40 waiting for one) wait on I/O 0.2-0.3 of their time; the
# CPU tests' sleeping datasets, 0.9 and more.
IO_BOUND_SHARE = 0.5


@dataclass(frozen=True)
class LoadingTime:
    """How a batch's loading time splits: `cpu_share` on a core, `delay_share` waiting for one, the rest waiting on
    something else (I/O); `source` says where the figures come from."""

    cpu_share: float
    delay_share: float
    source: str

    @property
    def io_share(self) -> float:
        return max(0.0, 1.0 - self.cpu_share - self.delay_share)

    @property
    def io_bound(self) -> bool:
        return self.io_share >= IO_BOUND_SHARE


def loading_time(run: Run) -> LoadingTime | None:
    """How the main loader's batches spend their loading time; None where it was not measured (a bundle from before
    the training thread's CPU in its waits was recorded, or without process samples for the workers)."""
    loader = run.sites.loader.main
    if loader is None:
        return None
    return _in_process(run) if loader.num_workers == 0 else _in_workers(run)


def _in_process(run: Run) -> LoadingTime | None:
    steps = [s for s in run.step_view.steady_steps if s.data_wait_cpu_s is not None]
    wait = sum(s.data_wait_s for s in steps)
    if not steps or wait <= 0:
        return None
    cpu = sum(s.data_wait_cpu_s or 0.0 for s in steps) / wait
    main = next((p for p in run.host.steady_processes if p.role == "main"), None)
    delay = main.run_delay_share if main is not None and main.run_delay_share is not None else 0.0
    return LoadingTime(min(1.0, cpu), min(1.0 - min(1.0, cpu), delay),
                       "the training thread's CPU time in its waits for batches, and its run delay")


def _in_workers(run: Run) -> LoadingTime | None:
    workers = loader_workers(run)
    delays = [w.run_delay_share for w in workers if w.run_delay_share is not None]
    if not workers or not delays:  # without the run delay, a worker held back by others reads as waiting on I/O
        return None
    cpu = min(1.0, statistics.median(w.cpu_mean for w in workers))
    return LoadingTime(cpu, min(1.0 - cpu, statistics.median(delays)), "the workers' CPU and run delay, sampled")


def loader_workers(run: Run) -> list[ProcessInfo]:
    """The loader's worker processes over the steady steps: the main process's children that torch named
    pt_data_worker, or all its children where none is (a torch that does not name them). Others are not the
    loader's: multiprocessing's resource tracker (pytorch/examples' mnist_hogwild: 0.0 of a core, beside its one
    worker's 0.87), a script's own pool."""
    processes = run.host.steady_processes
    main = next((p for p in processes if p.role == "main"), None)
    children = [p for p in processes if main is not None and p.ppid == main.pid]
    return [p for p in children if p.is_loader_worker] or children


def worker_cpu_per_batch_s(run: Run) -> float | None:
    """CPU seconds the loader's workers spend on one batch, over the steady steps; None without workers, batches
    or process samples."""
    loader = run.sites.loader.main
    steps = run.step_view.steady_steps
    if loader is None or not loader.num_workers or not steps:
        return None
    workers = loader_workers(run)
    batches = sum(s.batches for s in steps)
    span = steps[-1].end - steps[0].start
    if not workers or batches == 0 or span <= 0:
        return None
    return sum(w.cpu_mean for w in workers) * span / batches


def cores_per_rank(run: Run) -> float | None:
    """The cores the process may use, shared with the other ranks on its host."""
    cores = run.host.env.cores
    return cores / run.host.env.ranks_on_host if cores else None


def loader_limit_s(run: Run) -> float | None:
    """The shortest step the loader's workers can feed, from their CPU per batch: each of the `num_workers`
    makes a batch in that time, with a core of its own (the rank's own process keeps one of its share)."""
    per_batch = worker_cpu_per_batch_s(run)
    loader, cores = run.sites.loader.main, cores_per_rank(run)
    steps = run.step_view.steady_steps
    if per_batch is None or loader is None or not steps:
        return None
    parallel = min(loader.num_workers, max(1.0, (cores or loader.num_workers + 1) - 1))
    batches_per_step = sum(s.batches for s in steps) / len(steps)
    return per_batch * batches_per_step / parallel
