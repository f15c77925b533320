"""GD402: the GPU's memory: the CUDA caching allocator retrying inside the steps, or running out."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, NotEvaluated, Remedy, Run, rule
from gpudoctor.analysis import GpuMemory, OutOfMemory, gpu_memory

GiB = 1024 ** 3
EXPANDABLE = "expandable_segments:True"


@rule("GD402", "allocator-retries", category="gpu_memory")
def allocator_retries(run: Run, min_mallocs_per_step: float = 1.0,
                      warn_retries_per_step: float = 1.0) -> Iterator[Finding]:
    """The CUDA caching allocator frees its cache and retries inside the steps, or calls cudaMalloc in them; or
    the run died of CUDA running out of memory.

    What it detects: over the profiling window's steps (torch.cuda.memory_stats at each step's end), any
    allocation retry (`num_alloc_retries`: cudaMalloc failed, the allocator freed its cached blocks, which
    synchronizes the device, and tried again), or at least `min_mallocs_per_step` cudaMalloc calls a step once
    the cache should hold what the steps need; with the reserved bytes against those allocated, the peak against
    the device's capacity and the bytes free inside split blocks (fragmentation). A run that ended with CUDA's
    out-of-memory error gets a critical finding that says where the memory was at that point.

    Why it matters: a step whose tensors change size from batch to batch (sequences of varying length)
    fragments the allocator's cache of fixed-size segments until an allocation fits nowhere: the allocator then
    returns its cache to the driver and allocates again, synchronizing the device each time, inside the step.
    The same fragmentation is how a job runs out of memory with gigabytes reserved but unused.

    Example: batches of 1024 to 4096 tokens, in shuffled lengths, through a model whose weights leave the
    activations little more room than the longest batch needs (fixtures/scripts/allocator_retries_bad.py).

    Fix: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the job's environment (set before CUDA starts):
    segments grow in place instead of being split and cached by size. Out of memory: also a smaller batch,
    activation checkpointing, or bf16.

    Impact: none predicted; `gpudoctor profile --try-fixes` runs the script with expandable segments and
    measures the step. The host's time in cudaMalloc and cudaFree in the profiled steps does not tell the gain:
    allocator_retries_bad, recorded on an H200 with its activations given 1.1, 1.06 and 1.045 times what its
    longest step needs, retried once in its five profiled steps each time, and that time came to 15-33% of the
    step, while its twin under expandable segments ran at the same speed (7.2, 7.1 and 7.2 ms a step against 7.3;
    at 1.03 times, the script ran out of memory and the twin did not). Retries rarer than
    `warn_retries_per_step` a step are told as a note (info): the job is close to running out of memory, not
    slowed.
    """
    oom = run.host.out_of_memory
    if oom is not None:
        yield _out_of_memory(run, oom)
        return
    memory = gpu_memory(run.steps, run.trace, run.host.env.cuda_device)
    if memory is None:
        raise NotEvaluated("the CUDA allocator's counters were not recorded (CUDA not initialized, or a bundle "
                           "recorded before gpudoctor read them)")
    if memory.retries_per_step <= 0 and memory.mallocs_per_step < min_mallocs_per_step:
        return
    retrying = memory.retries_per_step > 0
    rare = retrying and memory.retries_per_step < warn_retries_per_step
    yield Finding(
        (f"The CUDA allocator frees its cache and retries {memory.retries_per_step:.1f} times a step"
         if retrying else f"The steps call cudaMalloc {memory.mallocs_per_step:.1f} times each")
        + f": {memory.reserved / GiB:.1f} GiB reserved for {memory.allocated / GiB:.1f} GiB of tensors",
        impact=None, location=run.sites.forward_location, severity="info" if rare else None,
        impact_reason="the allocator's cost is not predicted from the trace: `gpudoctor profile --try-fixes` "
                      "measures the fix",
        evidence=_evidence(memory),
        fix=f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE} in the job's environment (its gain is not predicted: "
            "--try-fixes measures it)" + ("; the retries tell that the memory is nearly full: a longer batch "
                                          "may run out of it" if rare else ""),
        remedy=Remedy(alloc_conf=EXPANDABLE),
    )


def _evidence(memory: GpuMemory) -> dict[str, object]:
    peak = memory.peak_share
    return {"retries per step": round(memory.retries_per_step, 2),
            "cudaMalloc per step": round(memory.mallocs_per_step, 2),
            "cudaFree per step": round(memory.frees_per_step, 2),
            "reserved": (round(memory.reserved / GiB, 2), "GiB"),
            "allocated": (round(memory.allocated / GiB, 2), "GiB"),
            "free inside split blocks": (round(memory.fragmented / GiB, 2), "GiB") if memory.fragmented else None,
            "peak reserved of the device": (round(peak * 100), "%") if peak is not None else None,
            "cudaMalloc and cudaFree per step": (round(memory.calls_s * 1e3, 2), "ms")
            if memory.calls_s is not None else None}


def _out_of_memory(run: Run, oom: OutOfMemory) -> Finding:
    memory, total, free = oom.memory, oom.total, oom.free
    evidence: dict[str, object] = {"asked for": oom.requested}
    if memory is not None:
        evidence |= {"allocated by tensors": (round(memory.allocated / GiB, 2), "GiB"),
                     "cached, unused": (round((memory.reserved - memory.allocated) / GiB, 2), "GiB"),
                     "of it inside split blocks": (round((memory.inactive_split or 0) / GiB, 2), "GiB"),
                     "peak allocated": (round(memory.max_allocated / GiB, 2), "GiB")}
    if total and free is not None:
        others = total - free - (memory.reserved if memory is not None else 0)
        evidence |= {"device": (round(total / GiB, 2), "GiB"), "free on the device": (round(free / GiB, 2), "GiB"),
                     "held outside this process's cache": (round(max(0, others) / GiB, 2), "GiB")}
    cached = memory is not None and memory.reserved - memory.allocated > 0.1 * max(memory.reserved, 1)
    fix = (f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}: the cache held unused bytes it could not give this allocation; "
           "else " if cached else "") + "a smaller batch, activation checkpointing, or bf16 autocast"
    reserved = (f"{memory.reserved / GiB:.1f} GiB reserved, {memory.allocated / GiB:.1f} GiB in tensors"
                if memory else "")
    return Finding(
        f"CUDA ran out of memory{f' asking for {oom.requested}' if oom.requested else ''}"
        + (f": {reserved}" if reserved else ""),
        impact=None, impact_reason="the run ended: nothing to save per step", severity="critical",
        location=run.host.exit.location, evidence=evidence, fix=fix,
        remedy=Remedy(alloc_conf=EXPANDABLE) if cached else None,
    )
