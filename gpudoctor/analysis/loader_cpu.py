"""What the DataLoader's workers cost: their CPU per batch, and so how fast they can deliver.

A loader whose rank waits for another rank in every collective is never seen starving: its workers fill their
queue and idle. Their CPU per batch still says how fast they could go: N workers deliver a batch at most every
(CPU per batch / N) seconds, given N cores. That is the limit a straggler's fix runs into.
"""

from __future__ import annotations

from gpudoctor.analysis.run import Run
from gpudoctor.analysis.views import ProcessInfo


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
