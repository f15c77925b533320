"""GD1xx: the input pipeline starves the GPU."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from gpudoctor import Finding, LoaderRemedy, NotEvaluated, Remedy, Run, rule
from gpudoctor.analysis import (
    DataWait,
    LoaderInfo,
    LoadingTime,
    Location,
    Setting,
    cores_per_rank,
    flag_value,
    loader_setting,
    loader_workers,
    loading_time,
    setting_at,
    settings_location,
)


def _loader(run: Run) -> LoaderInfo:
    loader = run.sites.loader.main
    if loader is None:
        raise NotEvaluated("the script iterated no DataLoader")
    return loader


def _starvation(run: Run) -> DataWait:
    run.require_steps()
    wait = run.data_wait
    if wait is None:
        raise NotEvaluated("no step after start-up took any time")
    return wait


def _compute_s(run: Run, wall: float, wait: float) -> float:
    """Time a step needs once data is ready: the host's own work, or the GPU's, whichever is longer.

    GPU work launched in one step runs while the host waits for the next batch, so the GPU's work per step
    (from the trace) is the better measure when there is one.
    """
    host = max(wall - wait, 1e-6)
    gpu = run.gpu_work.per_step_s
    return max(host, gpu) if gpu is not None else host


@dataclass(frozen=True)
class Workers:
    """How many workers to suggest, and why that many, in the words the fix gives."""

    count: int
    why: str


# An I/O-bound loader's workers each use a share of a core while they load: as many fit the rank's spare cores as
# that share allows, up to this many per core. The bound is ours, not a measurement: each worker is a process with
# its own copy of the dataset and prefetch_factor batches in memory, and past a few per core those grow while what
# waiting hides does not (the CPU tests' sleeping loaders need 3 workers on a share of one core).
IO_WORKERS_PER_CORE = 4


def _suggested_workers(run: Run, load_s: float, compute_s: float, loading: LoadingTime | None = None) -> Workers:
    """Enough workers that loading a batch in parallel takes less than a step's compute, within what the cores hold
    (this rank's share of the host's, where several ranks share it): a core each for a CPU-bound loader, a share of
    one each for a loader that mostly waits on I/O (`loading`, analysis/loader_cpu.py)."""
    cores = cores_per_rank(run)
    needed = math.ceil(1.5 * load_s / max(compute_s, 1e-6))
    # One core stays with the training process, except on the smallest hosts, where a starved training
    # process mostly waits and two workers still beat one.
    spare = int(cores or 2) - 1
    limit = max(2, spare)
    if loading is not None and loading.io_bound:
        fits = math.floor(max(1.0, (cores or 2) - 1) / max(loading.cpu_share, 0.01))
        limit = max(limit, min(fits, IO_WORKERS_PER_CORE * max(1, round(cores or 2))))
    count = max(1, min(limit, max(2, needed)))
    ranks = run.host.env.ranks_on_host
    shared = f" (the host's {run.host.env.cores} shared by {ranks} ranks)" if ranks > 1 else ""
    the_cores = f"the {_cores(cores or 2)}{shared}"
    enough = (f"enough to load a batch ({load_s * 1e3:.1f} ms) in parallel within the step's {compute_s * 1e3:.1f} ms "
              "of compute")
    capped = count == limit and needed > limit
    if loading is not None and loading.io_bound:
        if capped:
            return Workers(count, f"as many as {the_cores} hold of workers that each use {loading.cpu_share:.0%} of "
                                  f"a core while they load (at most {IO_WORKERS_PER_CORE} a core)")
        waits = (f"; loading waits {loading.io_share:.0%} of its time on I/O and uses {loading.cpu_share:.0%} of a "
                 f"core, so more workers than {the_cores} help")
        return Workers(count, enough + (waits if count > (cores or 2) else ""))
    if capped and count + 1 > (cores or 2):  # the smallest hosts: the workers share the cores with the trainer
        return Workers(count, f"on {_cores(cores or 2)}{shared}: more workers than the cores left beside the "
                              "training process, which mostly waits for their batches")
    if capped:
        return Workers(count, f"as many as {the_cores} allow, one kept for the training process")
    return Workers(count, enough)


def _cores(count: float) -> str:
    return f"{count:g} core{'' if count == 1 else 's'}"


def _cores_evidence(run: Run) -> dict[str, object]:
    """The cores the suggestion is made within: the host's, and this rank's share where ranks share the host."""
    shared = run.host.env.ranks_on_host
    if shared <= 1:
        return {"cores available": run.host.env.cores}
    share = cores_per_rank(run)
    return {"cores available": run.host.env.cores, "ranks on this host": shared,
            "cores per rank": round(share, 1) if share is not None else None}


def _loading_evidence(loading: LoadingTime | None) -> dict[str, object]:
    """What loading a batch waits on, where it was measured: the share on a core, and on I/O."""
    if loading is None:
        return {}
    return {"loading on a core": (round(loading.cpu_share * 100), "%"),
            "loading waiting on I/O": (round(loading.io_share * 100), "%")}


def _uses_a_gpu(run: Run) -> bool:
    """Whether the script computed on a GPU: pinned batches only help a copy to one (on a CPU-only run torch
    warns that pin_memory has no accelerator to pin for)."""
    return run.host.env.cuda_device is not None or run.gpu is not None


def _where_set(run: Run, loader: LoaderInfo) -> Location | None:
    """The line where the script sets the loader's workers: its DataLoader(...), or where the Trainer builds the
    loader, its TrainingArguments(...)."""
    built = settings_location(run, loader) if loader_setting(loader, 1, False) is not None else None
    return built or loader.location


def _loader_fix(run: Run, loader: LoaderInfo, suggested: Workers, pin: bool, at: Location | None) -> str:
    """The fix at `at`, and why that many workers (a TensorDataset's fix is a batch sampler, not workers)."""
    fix = _loader_call_fix(run, loader, suggested.count, pin, at)
    return fix if _indexes_tensors_per_sample(loader) else f"{fix}: {suggested.count} workers, {suggested.why}"


def _loader_call_fix(run: Run, loader: LoaderInfo, workers: int, pin: bool, at: Location | None) -> str:
    where = f" at {at}" if at else ""
    if _indexes_tensors_per_sample(loader):
        sampler = loader.sampler if loader.sampler in ("RandomSampler", "SequentialSampler") else "RandomSampler"
        return (f"DataLoader(dataset, sampler=BatchSampler({sampler}(dataset), batch_size={loader.batch_size}, "
                f"drop_last={loader.drop_last}), batch_size=None){where}: the TensorDataset then takes one index "
                "per batch instead of one per sample (workers would add the cost of sending each batch between "
                "processes)")
    pinning = " pin_memory=True," if pin and not loader.pin_memory else ""
    torch_call = f"DataLoader(..., num_workers={workers},{pinning} persistent_workers=True)"
    setting = loader_setting(loader, workers, pin)
    if setting is not None:  # the Trainer builds the loader from its arguments: they are what the script sets
        return f"{setting}{where}: the Trainer then builds {torch_call}"
    fed = setting_at(loader.location, "num_workers")
    if fed is not None and fed.flag is not None:  # the script reads the count from its command line
        rest = (" and pin_memory=True, persistent_workers=True in the DataLoader" if pinning
                else " and persistent_workers=True in the DataLoader")
        return _flag_fix(run, loader, fed, workers, where) + rest
    return f"{torch_call}{where}"


def _flag_fix(run: Run, loader: LoaderInfo, fed: Setting, workers: int, where: str) -> str:
    """'run with --workers 9 (it feeds num_workers=args.workers at train.py:41; ...)', the flag's value followed
    through what the script does to it first: ImageNet's -j is divided among the node's GPUs, so 15 workers a rank
    is -j 30."""
    declared = f"the flag is declared at line {fed.flag_line}"
    followed = flag_value(fed, workers, loader.num_workers, run.manifest.target.args, _known_figures(run))
    if followed is None and fed.rewrites:  # changed before use, in a way the run does not let us follow
        changed = "; ".join(f"line {r.line}: {r.source}" for r in fed.rewrites)
        return (f"set {fed.flag} so that num_workers={fed.expression}{where} becomes {workers}: the script changes "
                f"the flag's value before that ({changed}); {declared}")
    if followed is None or not followed.through:
        return f"run with {fed.flag} {workers} (it feeds num_workers={fed.expression}{where}; {declared})"
    names = ", ".join(f"{name}={value:g}" for name, value in followed.names)
    with_names = f" with {names}" if names else ""
    changed = "; ".join(f"line {r.line}: {r.source}" for r in followed.through)
    return (f"run with {followed.option} {followed.value} (the script changes it before it feeds "
            f"num_workers={fed.expression}{where} ({changed}){with_names}, so {followed.value} gives {workers}; "
            f"{declared})")


def _known_figures(run: Run) -> dict[str, float]:
    """The run's figures a script's arithmetic on a flag may read: its ranks on this host, the job's ranks."""
    process = run.manifest.child.process
    known: dict[str, float] = {"ranks_on_host": run.host.env.ranks_on_host}
    if process is not None and process.world_size:
        known["world_size"] = process.world_size
    return known


def loader_remedy(run: Run, loader: LoaderInfo, workers: int) -> Remedy | None:
    """The loader's fix as `--try-fixes` applies it: `workers` persistent workers, pinned batches on a GPU; none
    for a TensorDataset, whose fix is a batch sampler (an edit of the DataLoader call)."""
    if _indexes_tensors_per_sample(loader):
        return None
    return Remedy(loader=LoaderRemedy(
        at=loader.built_at, num_workers=workers, persistent_workers=True,
        pin_memory=True if _uses_a_gpu(run) and not loader.pin_memory else None))


def _indexes_tensors_per_sample(loader: LoaderInfo) -> bool:
    """A TensorDataset (tensors already in memory) read one sample at a time and collated into a batch."""
    return loader.dataset == "TensorDataset" and loader.batch_size is not None


def _idles(run: Run, share: float) -> str:
    """What the wait costs, as far as it was measured: the GPU's idle time, or without GPU activity in the run
    (a CPU-only machine), the step's own time."""
    if run.gpu is not None:
        return f"The GPU idles {share:.0%} of each step"
    return f"Each step waits {share:.0%} of its time"


def _waits_for_data(run: Run, share: float, still: bool = False) -> str:
    if run.gpu is not None:
        return f"the GPU {'still ' if still else ''}idles {share:.0%} of each step waiting for data"
    return f"each step {'still ' if still else ''}waits {share:.0%} of its time for data"


def _severity(share: float) -> str:
    return "critical" if share >= 0.5 else "warning"


@rule("GD101", "loader-in-main-process", category="data_starvation", claims="data_wait")
def loader_in_main_process(run: Run, min_wait_share: float = 0.15, min_starved_steps: float = 0.1) -> Iterator[Finding]:
    """The DataLoader loads every batch in the training process, and each step waits for it.

    What it detects: `num_workers=0` while the GPU idles at least `min_wait_share` of each step waiting for
    the next batch, or at least `min_starved_steps` of the steps wait more than half their time. The GPU's
    idle part of the wait is the host's wait beyond the GPU's own work for the step (from the trace): a host
    that runs ahead of a GPU-bound step can wait for a batch while the GPU works through its queue.

    Why it matters: with no workers, loading and augmenting a batch runs between steps on the same
    thread that launches GPU work, so the GPU idles for the whole load.

    Example: `DataLoader(dataset, batch_size=32)` with image decoding in `__getitem__`.

    Fix: `DataLoader(dataset, batch_size=32, num_workers=N, pin_memory=True, persistent_workers=True)`,
    N enough to load a batch within a step's compute, within the cores available (this rank's share, where ranks
    share the host): a core each where loading a batch keeps a core busy, a share of one each where it mostly
    waits on I/O (a file, the network), so that an I/O-bound loader gets more workers than cores (the training
    thread's CPU time in its waits for batches against their wall time, its run delay aside:
    analysis/loader_cpu.py; at most 4 workers a core). The workers load the next
    batches while the GPU computes (`pin_memory` is suggested only when the script uses a GPU). Where the script
    reads num_workers from a command-line flag (`num_workers=args.workers`), the fix is that flag's value; where
    Hugging Face's Trainer builds the loader, its `TrainingArguments(dataloader_num_workers=...)`. A
    `TensorDataset` is in memory already: its cost is one index and one collate per sample, and workers would add
    the cost of sending each batch between processes, so the fix there is a `BatchSampler` with
    `batch_size=None`, one index per batch (a LightningModule on a TensorDataset of 200,000 samples, batch 256, on
    an H100: predicted 33%; two pinned workers measured 7%, the BatchSampler 36%).

    Severity: critical when the GPU idles at least half of each step waiting for data, else warning.

    Impact: with N workers the step takes max(compute, load / N) instead of compute + load.
    """
    loader = _loader(run)
    if loader.num_workers != 0:
        return
    starved = _starvation(run)
    if not starved.starving(min_wait_share, min_starved_steps):
        return
    wait, wall, share = starved.wait_s, starved.wall_s, starved.share
    compute = _compute_s(run, wall, wait)
    loading = loading_time(run)
    workers = _suggested_workers(run, wait, compute, loading)
    fixed = max(compute, wait / workers.count)
    yield Finding(
        f"{_idles(run, share)} while the DataLoader loads the next batch in the main process",
        impact=1 - fixed / wall, location=_where_set(run, loader), severity=_severity(share),
        evidence={**starved.evidence(), "num_workers": 0, "batch size": loader.batch_size, **_cores_evidence(run),
                  **_loading_evidence(loading)},
        fix=_loader_fix(run, loader, workers, _uses_a_gpu(run), _where_set(run, loader)),
        remedy=loader_remedy(run, loader, workers.count),
    )


@rule("GD102", "loader-workers-too-few", category="data_starvation", claims="data_wait")
def loader_workers_too_few(run: Run, min_wait_share: float = 0.15, busy_worker_cores: float = 0.6,
                           min_starved_steps: float = 0.1) -> Iterator[Finding]:
    """The DataLoader has workers, but too few to keep up, and the host has cores to spare.

    What it detects: `num_workers > 0`, the GPU idles at least `min_wait_share` of each step waiting for data
    (or at least `min_starved_steps` of the steps wait more than half their time), the workers are CPU-busy
    (the median worker uses at least `busy_worker_cores` of a core) and the process may use more cores than it
    has workers. The threshold lies between the starved workers of the recorded fixtures and of
    pytorch/examples' dcgan (0.64 to 1.0 of a core each) and workers held back by other programs' load
    (cpu_contention_bad: 0.31 to 0.38, which GD504 explains).

    Why it matters: each worker makes one batch at a time; when a batch takes longer to make than the
    GPU takes to consume `num_workers` of them, the GPU waits.

    Fix: raise `num_workers` (the suggestion is derived from the measured load and compute times and the
    cores available), keep `persistent_workers=True`.

    Severity: critical when the GPU idles at least half of each step waiting for data, else warning.
    """
    loader = _loader(run)
    if loader.num_workers == 0:
        return
    starved = _starvation(run)
    wait, wall, share = starved.wait_s, starved.wall_s, starved.share
    workers = loader_workers(run)
    if not starved.starving(min_wait_share, min_starved_steps) or not workers:
        return
    # The median worker: workers without persistent_workers start afresh each epoch, and a generation that lived
    # while the main process was slow (start-up, a checkpoint) sat with its queue full (dcgan: 0.09 and 0.17 of
    # a core, the six after it 0.74 to 0.85).
    worker_cores = statistics.median(p.cpu_mean for p in workers)
    cores = cores_per_rank(run) or 1
    if worker_cores < busy_worker_cores or loader.num_workers + 1 >= cores:
        return
    loading = loading_time(run)
    compute = _compute_s(run, wall, wait)
    batch_s = wall * loader.num_workers  # starved, the loader delivers a batch every step
    suggested = _suggested_workers(run, batch_s, compute, loading)
    if suggested.count <= loader.num_workers:
        return
    fixed = max(compute, batch_s / suggested.count)
    yield Finding(
        f"{loader.num_workers} DataLoader worker{'s' if loader.num_workers > 1 else ''} cannot keep up: "
        f"{_waits_for_data(run, share)}",
        impact=1 - fixed / wall, location=_where_set(run, loader), severity=_severity(share),
        evidence={**starved.evidence(), "num_workers": loader.num_workers,
                  "CPU per worker": (round(worker_cores, 2), "cores"), **_cores_evidence(run),
                  **_loading_evidence(loading)},
        fix=_loader_fix(run, loader, suggested, _uses_a_gpu(run), _where_set(run, loader)),
        remedy=loader_remedy(run, loader, suggested.count),
    )


@rule("GD103", "loader-cpu-bound", category="data_starvation", claims="data_wait")
def loader_cpu_bound(run: Run, min_wait_share: float = 0.15, busy_host_share: float = 0.85,
                     min_own_share: float = 0.5, min_starved_steps: float = 0.1) -> Iterator[Finding]:
    """The DataLoader's workers use every core and still cannot keep up: per-sample work is too heavy.

    What it detects: `num_workers > 0`, the GPU idles at least `min_wait_share` of each step waiting for data
    (or at least `min_starved_steps` of the steps wait more than half their time), the host's cores are at
    least `busy_host_share` busy, and the script's own processes use at least `min_own_share` of that CPU
    (otherwise other programs are the cause: see GD504).

    Why it matters: the CPU, not the GPU, sets the pace of training.

    Fix: make each sample cheaper: decode or resize once ahead of time, move augmentation to the GPU
    (batched, after the copy), cache preprocessed samples, or use a faster decoder.

    Severity: critical when the GPU idles at least half of each step waiting for data, else warning.
    """
    loader = _loader(run)
    if loader.num_workers == 0:
        return
    starved = _starvation(run)
    share = starved.share
    host = run.require_host_samples().host
    cores = run.host.env.cores or 1
    busy_cores = statistics.fmean(p.values["busy_cores"] for p in host)
    own = [p.values["tree_cores"] for p in host if p.values.get("tree_cores") is not None]
    own_share = statistics.fmean(own) / busy_cores if own and busy_cores else 1.0
    busy = busy_cores / cores
    if not starved.starving(min_wait_share, min_starved_steps) or busy < busy_host_share or own_share < min_own_share:
        return
    yield Finding(
        f"The host's CPUs are {busy:.0%} busy and {_waits_for_data(run, share, still=True)}",
        impact=share, location=loader.location, severity=_severity(share),
        evidence={**starved.evidence(), "host CPU busy": (round(busy * 100), "%"),
                  "num_workers": loader.num_workers, "cores available": cores},
        fix="make __getitem__ cheaper: preprocess once ahead of time, or move augmentation to the GPU after the copy",
    )
