"""GD2xx: host<->device copies and synchronizations that block the host."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from gpudoctor import Finding, LoaderRemedy, NotEvaluated, Remedy, Run, rule
from gpudoctor.analysis import call_of
from gpudoctor.analysis.views import CopySite, Location, SyncSite

MB = 1024 * 1024
# Nominal PCIe bandwidth per lane by generation (bytes/s), and the share of it a pinned host-to-device
# copy reaches. 0.6 is measured: blocking_copy_fixed moved 80 MB per step from pinned memory over an
# H100's gen5 x16 link in ~2.2 ms beyond its compute (36 GB/s of 63 GB/s nominal).
PCIE_LANE_BPS = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
PINNED_LINK_EFFICIENCY = 0.6


def _pinned_copy_bps(run: Run) -> float | None:
    """The host-to-device rate a pinned copy can expect on this run's GPU link, from NVML's PCIe facts."""
    gpu = next(iter(run.host.env.gpus), None)
    if gpu is None:
        return None
    lane, width = PCIE_LANE_BPS.get(gpu.pcie_gen or 0), gpu.pcie_width
    return lane * width * PINNED_LINK_EFFICIENCY if lane and width else None


def _per_step(run: Run) -> tuple[int, float]:
    """How many steps the call sites add up (`run.step_view.site_steps`), and the analysed steps' mean wall time.

    Not evaluated when several Python threads share the work: their host times overlap and add up to more
    than the step, and the GIL they take turns on (GD501) is what the time goes to."""
    steps = run.require_steps()
    if (run.host.python_threads_sharing or 1) > 1:
        raise NotEvaluated("several Python threads share the work: a line's host time is not a share of the step")
    return run.step_view.site_steps, statistics.fmean(s.wall_s for s in steps)


def _copy_evidence(site: CopySite, steps: int) -> dict[str, object]:
    return {
        "copies per step": round(site.count / steps, 1), "MB per step": (round(site.bytes / steps / MB, 2), "MB"),
        "host blocked per step": (round(site.host_s / steps * 1e3, 2), "ms"),
        "source pinned": site.pinned, "non_blocking": site.non_blocking,
    }


def _pinned_batches(run: Run) -> Remedy | None:
    """Where the script iterates a DataLoader that does not pin its batches, the fix `--try-fixes` applies: pinned
    batches, and non_blocking copies of them (a copy whose source is not a batch is left as it is)."""
    loader = run.sites.loader.main
    if loader is None or loader.pin_memory:
        return None
    return Remedy(loader=LoaderRemedy(at=loader.built_at, pin_memory=True), non_blocking_batches=True)


def _pin_where_made(run: Run) -> str:
    """How to pin a copy's source: in the DataLoader that makes the batches, where the script iterates one that does
    not pin them; else where the script makes the tensor (no DataLoader runs, or its batches are pinned already and
    the copy's source is another tensor): a DataLoader option would change nothing there."""
    loader = run.sites.loader.main
    if loader is not None and not loader.pin_memory:
        return "DataLoader(..., pin_memory=True), or tensor.pin_memory() once for a tensor the script reuses"
    return ("tensor.pin_memory() where the script makes the tensor, once, outside the loop (a buffer reused each "
            "step: pin it when it is made)")


@rule("GD201", "pageable-host-to-device-copy", category="blocking_copy", claims="host_copy")
def pageable_host_to_device_copy(run: Run, min_share: float = 0.03) -> Iterator[Finding]:
    """Host-to-device copies from pageable (unpinned) memory block the training loop.

    What it detects: `.to("cuda")` / `.cuda()` / `copy_` of a CPU tensor that is not pinned, from one
    line, taking at least `min_share` of the step's host time.

    Why it matters: CUDA cannot copy pageable memory asynchronously: the driver stages it through a
    pinned buffer while the host waits, and the copy cannot overlap compute.

    Fix: pin the source (`DataLoader(..., pin_memory=True)` or `tensor.pin_memory()` once for reused
    buffers) and copy with `non_blocking=True`. Where no DataLoader makes the batches (a tensor the script made
    itself), or its batches are pinned already, the fix pins the tensor where the script makes it.

    Impact: the host time the copy blocks, less the time the same bytes still take over the PCIe link
    from pinned memory (NVML's link generation and width, at the share of nominal measured on an H100).
    """
    steps, wall = _per_step(run)
    link = _pinned_copy_bps(run)
    for site in run.sites.copies:
        share = site.host_s / steps / wall
        if site.direction != "h2d" or site.pinned or share < min_share:
            continue
        still = site.bytes / steps / link / wall if link else 0.0
        yield Finding(
            f"Host-to-device copy from pageable memory blocks {share:.0%} of each step",
            impact=max(0.0, share - still), location=site.location, evidence=_copy_evidence(site, steps),
            count=site.count,
            fix=f"pin the source ({_pin_where_made(run)}) and copy with .to(device, non_blocking=True)",
            remedy=_pinned_batches(run),
        )


@rule("GD202", "non-blocking-from-pageable", category="blocking_copy", severity="info", claims="host_copy")
def non_blocking_from_pageable(run: Run) -> Iterator[Finding]:
    """`non_blocking=True` on a copy from unpinned memory does nothing: the copy still blocks.

    What it detects: host-to-device copies made with `non_blocking=True` whose source is not pinned.

    Why it matters: the code reads as if the copy overlapped compute, but from pageable memory CUDA
    copies synchronously; the intent is lost.

    Fix: pin the source tensor (`pin_memory=True` in the DataLoader, or `.pin_memory()`), or drop
    `non_blocking=True` so the code says what happens. Where the script iterates a DataLoader that does not pin
    its batches, `--try-fixes` pins them (a framework's loop moving a batch to the GPU: Lightning's, on a rank whose
    loader does not pin).
    """
    steps, wall = _per_step(run)
    for site in run.sites.copies:
        if site.direction == "h2d" and site.non_blocking and site.pinned is False:
            yield Finding(
                "non_blocking=True on a copy from unpinned memory: the copy still blocks",
                impact=site.host_s / steps / wall, location=site.location, evidence=_copy_evidence(site, steps),
                count=site.count, fix=f"pin the source: {_pin_where_made(run)}; or drop non_blocking=True",
                remedy=_pinned_batches(run),
            )


@rule("GD203", "device-to-host-copy-in-step", category="blocking_copy", claims="host_copy")
def device_to_host_copy_in_step(run: Run, min_mb_per_step: float = 1.0, min_share: float = 0.02) -> Iterator[Finding]:
    """Large device-to-host copies inside the step wait for the GPU and then for the copy.

    What it detects: `.cpu()` / `.to("cpu")` / `.numpy()` of CUDA tensors from one line moving at least
    `min_mb_per_step` MB per step, or blocking at least `min_share` of the step.

    Why it matters: a device-to-host copy synchronizes with all queued GPU work, then blocks on the
    transfer; the GPU idles until the host launches again.

    Fix: keep results on the GPU and move them once per N steps, or copy into a pinned buffer with
    `non_blocking=True` and read it after an event.
    """
    steps, wall = _per_step(run)
    for site in run.sites.copies:
        share = site.host_s / steps / wall
        if site.direction != "d2h" or (site.bytes / steps / MB < min_mb_per_step and share < min_share):
            continue
        yield Finding(
            f"Device-to-host copy of {site.bytes / steps / MB:.1f} MB per step blocks {share:.0%} of the step",
            impact=share, location=site.location, evidence=_copy_evidence(site, steps), count=site.count,
            fix="keep the tensor on the GPU and copy every N steps, or copy to a pinned buffer with non_blocking=True",
        )


SYNC_FIXES = {
    "item": "accumulate on the GPU (running = running + loss.detach()) and call .item() once every N steps",
    "tolist": "keep the values on the GPU; convert once every N steps",
    "bool": "avoid `if tensor:` on CUDA tensors in the step; compare on the GPU with torch.where, "
            "or check every N steps",
    "float": "avoid float(tensor) in the step; accumulate on the GPU and read once every N steps",
    "int": "avoid int(tensor) in the step; keep the value on the GPU",
    "print": "do not print CUDA tensors in the step; log a detached copy every N steps",
    "synchronize": "remove torch.cuda.synchronize() from the step; use torch.cuda.Event timing if you are measuring",
    "empty_cache": "remove torch.cuda.empty_cache() from the step: it synchronizes and defeats the caching allocator",
}


# A library's own synchronizing call, made for the user's line: what to change there instead.
LIBRARY_SYNC_FIXES = {
    "torch.amp.grad_scaler": "GradScaler.step() reads whether any gradient overflowed with .item() every step, "
                             "unless the optimizer is fused: torch.optim.SGD, Adam or AdamW(..., fused=True) take "
                             "the flag on the GPU and GradScaler skips the read; or, on a GPU with bfloat16 (Ampere "
                             "and later), autocast(dtype=torch.bfloat16) needs no GradScaler (time it: its kernels "
                             "are not float16's)",
}


@dataclass(frozen=True)
class FrameworkSync:
    """A synchronizing call a framework's own loop makes inside the user's `trainer.fit(...)` or `.train()`: the
    setting that changes it (`fix`), made where the script builds `built_by` (its Trainer, TrainingArguments)."""

    built_by: str
    fix: str


PROGRESS_BAR = ("a progress bar that refreshes less often (callbacks=[TQDMProgressBar(refresh_rate=N)], or "
                "enable_progress_bar=False)")
# Lightning's modules, by the name of the module that made the call (the old package names read as the new).
FRAMEWORK_SYNCS = {
    "lightning.pytorch.loops.training_epoch_loop": FrameworkSync(
        "Trainer", "Lightning's training loop makes it at every batch under DDP (Lightning 2.5 and later): rank 0's "
                   "SIGTERM flag, broadcast and read with .item(), so that every rank stops together; no Trainer "
                   "setting turns it off: it costs less where each batch does more work (a larger batch per rank)"),
    "lightning.fabric.utilities.apply_func": FrameworkSync(
        "Trainer", "Lightning reads the logged values as numbers for the progress bar and the loggers: "
                   f"Trainer(log_every_n_steps=N) and {PROGRESS_BAR}; self.log(..., on_step=False, on_epoch=True) "
                   "for values that need not be read at every step"),
    "lightning.pytorch.callbacks.progress": FrameworkSync(
        "Trainer", f"Lightning's progress bar reads the values logged with prog_bar=True: {PROGRESS_BAR}"),
    "lightning.pytorch.loggers": FrameworkSync(
        "Trainer", "Lightning's logger reads the logged values as numbers: Trainer(log_every_n_steps=N)"),
    "lightning.fabric.loggers": FrameworkSync(
        "Trainer", "Lightning's logger reads the logged values as numbers: Trainer(log_every_n_steps=N)"),
    "lightning.fabric.utilities.distributed": FrameworkSync(
        "Trainer", "Lightning gathers a value logged with sync_dist=True from every rank: self.log(..., "
                   "sync_dist=False) for a value each rank can log alone, or on_step=False to gather once an epoch"),
    "transformers.trainer": FrameworkSync(
        "TrainingArguments", "the Trainer checks each step's loss for nan and inf (a read of the GPU's value): "
                             "TrainingArguments(logging_nan_inf_filter=False), and logging_steps=N for the logged "
                             "loss"),
}
OLD_NAMES = {"pytorch_lightning.": "lightning.pytorch.", "lightning_fabric.": "lightning.fabric."}
# The frameworks whose Trainer runs the loop (the user's line is then `trainer.fit(...)` or `trainer.train()`),
# and what their Trainer is built from: a call of theirs not in FRAMEWORK_SYNCS still has its setting there.
FRAMEWORK_TRAINERS = {"lightning.": "Trainer", "transformers.": "TrainingArguments"}


def framework_sync(site: SyncSite) -> FrameworkSync | None:
    """The framework's setting, where a framework's loop made the call (the user's line is then `fit(...)`)."""
    if site.via is None:
        return None
    via = next((new + site.via[len(old):] for old, new in OLD_NAMES.items() if site.via.startswith(old)), site.via)
    known = next((sync for module, sync in FRAMEWORK_SYNCS.items() if via == module or via.startswith(module + ".")),
                 None)
    if known is not None:
        return known
    built_by = next((callee for prefix, callee in FRAMEWORK_TRAINERS.items() if via.startswith(prefix)), None)
    if built_by is None:
        return None
    return FrameworkSync(built_by, f"the call is made by {site.via} for this line, inside the framework's loop: "
                                   f"look for the {built_by}'s or a callback's setting that makes it less often "
                                   "(logging, progress, checks)")


def _sync_fix(site: SyncSite) -> str:
    if site.via is None:
        return SYNC_FIXES.get(site.kind, "move the call out of the step")
    library = next((fix for module, fix in LIBRARY_SYNC_FIXES.items() if site.via.startswith(module)), None)
    framework = framework_sync(site)
    if framework is not None and library is None:
        return framework.fix
    return library or (f"the call is made by {site.via} for this line: look for its option to read values less "
                       "often (logging, progress, checks), or call this line every N steps")


def _sync_location(site: SyncSite) -> Location | None:
    """Where the fix goes: the user's line, or where the script builds the framework object whose setting it is."""
    framework = framework_sync(site)
    if framework is None or site.location is None:
        return site.location
    return call_of(site.location.file, framework.built_by) or site.location


def _stall_share(run: Run, wall: float) -> float | None:
    stall = run.gpu_work.sync_stall_s  # summed over the analysed steps
    return None if stall is None else stall / (wall * len(run.steps))


@rule("GD211", "sync-in-step", category="sync_point", claims="sync")
def sync_in_step(run: Run, min_calls_per_step: float = 1.0, min_share: float = 0.01) -> Iterator[Finding]:
    """A call in the step makes the host wait for the GPU: `.item()`, `print(tensor)`, `synchronize()`, ...

    What it detects: synchronizing calls on CUDA tensors from one line, made at least
    `min_calls_per_step` times per step, whose cost is at least `min_share` of the step; one finding per
    line, ranked by the host time it blocked. Reads `.item()`, `.tolist()`, `bool()`, `float()`, `int()`,
    printing a CUDA tensor, `torch.cuda.synchronize()` and `torch.cuda.empty_cache()`.

    Why it matters: the host stops launching work until the GPU has drained its queue; after the call
    the GPU idles while the host launches again. Several per step add up.

    Example: `running_loss += loss.item()` and `print(f"loss {loss}")` in every step.

    Fix: keep values on the GPU (`running = running + loss.detach()`) and read them once every N steps;
    drop `torch.cuda.synchronize()` and `empty_cache()` from the step. Where a library makes the call for
    the user's line, the finding names it and the fix is that library's: `torch.amp.GradScaler.step()` reads
    its overflow flag every step unless the optimizer is fused (`fused=True`), which reads it on the GPU. Where
    a framework's own loop makes the call inside the script's `trainer.fit(...)` (Lightning's logging, progress
    bar or DDP loop; Hugging Face's Trainer), the finding points at the line that builds the Trainer (or its
    `TrainingArguments`) and the fix is the framework's setting, not a change to the call to `fit`.

    Impact: what the step loses to the synchronizing calls, shared among the lines by their number of
    calls (each sync costs one drain-and-refill of the GPU's queue): the lesser of two shares of the step.
    One is the GPU idle the calls cause (the budget's `sync` slice): the gaps a synchronizing CUDA call
    overlaps, and the gaps after it while the host launches into the drained queue, up to the host's time
    blocked (amp_scaler_bad, three recordings on an H100: 5-6% of the step in the first kind of gap,
    14-20% with the second; the twin without the read measured 15% over all their plain runs). The other
    is the host's time blocked in the calls, all lines together (timed in the detail steps): without them
    the host would launch on, and save no more than that. A host that launches slower than the GPU
    computes finds little queued at each sync, so its syncs cost little (pytorch/examples' dcgan: 0.16 ms
    a step blocked in four .item() lines, beside a 13% sync slice; no gain measured when they go). With no
    GPU timeline, the host time blocked is the cost.
    """
    steps, wall = _per_step(run)
    sites: list[SyncSite] = run.sites.syncs
    calls = sum(s.count for s in sites) or 1
    budget = run.budget
    stall = budget.share_of("sync_point") if budget is not None else _stall_share(run, wall)
    pace = budget.step_s if budget is not None else wall  # the hooks time the calls outside the profiler
    blocked_total = (run.sync_blocked_s or 0.0) / pace
    if stall is not None and blocked_total > 0:  # calls timed by the hooks (older bundles did not time them)
        stall = min(stall, blocked_total)
    for site in sites:
        blocked = site.host_s / steps / pace
        impact = blocked if stall is None else stall * site.count / calls
        if site.count / steps < min_calls_per_step or max(impact, blocked) < min_share:
            continue
        made_by = f" in {site.via}" if site.via else ""
        yield Finding(
            f"{_call_name(site.kind)}{made_by} makes the host wait for the GPU {site.count / steps:.0f}× per step",
            impact=impact, location=_sync_location(site), count=site.count,
            evidence={"calls per step": round(site.count / steps, 1),
                      "host blocked per step": (round(site.host_s / steps * 1e3, 2), "ms"),
                      "longest wait": (round(site.max_s * 1e3, 2), "ms")},
            fix=_sync_fix(site),
        )


def _call_name(kind: str) -> str:
    return {"synchronize": "torch.cuda.synchronize()", "empty_cache": "torch.cuda.empty_cache()",
            "print": "Printing a CUDA tensor", "bool": "bool() of a CUDA tensor"}.get(kind, f".{kind}()")


@rule("GD204", "copy-not-overlapped", category="blocking_copy", severity="info", claims="host_copy")
def copy_not_overlapped(run: Run, min_share: float = 0.05, max_overlapped: float = 0.2) -> Iterator[Finding]:
    """Host-to-device copies sit on the GPU's critical path: no compute runs while they do.

    What it detects: host-to-device copies (in the trace) that take at least `min_share` of the step on
    the GPU, with less than `max_overlapped` of their time overlapping a kernel: each batch is copied
    only when the step needs it, so the SMs wait for the copy engine.

    Why it matters: the copy engine can move the next batch while the SMs compute this one; copied just
    in time, the transfer adds to every step instead of hiding behind it.

    Example: `x = batch.to("cuda", non_blocking=True)` right before `model(x)`, with nothing in flight.

    Fix: prefetch: issue the copy of batch N+1 on a side `torch.cuda.Stream` before step N's forward (and
    `wait_stream` before using it), or use a prefetching loader wrapper that keeps one batch on the GPU.

    Impact: the copy time no kernel overlaps, up to the step's compute time it could hide behind.
    """
    gpu = run.require_gpu()
    steps = [s for s in run.require_steps() if s.gpu_busy_s is not None]
    if not steps:
        return
    wall = sum(s.wall_s for s in steps)
    per_step = [gpu.h2d_copy_overlap(s.start, s.end) for s in steps]
    copy_s, overlapped = sum(c for c, _ in per_step), sum(o for _, o in per_step)
    exposed = copy_s - overlapped
    if copy_s <= 0 or exposed / wall < min_share or overlapped / copy_s > max_overlapped:
        return
    compute = sum(s.gpu_compute_s or 0.0 for s in steps)
    site = next((c for c in run.sites.copies if c.direction == "h2d"), None)
    yield Finding(
        f"The GPU spends {exposed / wall:.0%} of the step copying to the device, with no compute beside the copies",
        impact=min(exposed, compute) / wall, location=site.location if site else None,
        evidence={"copy time per step": (round(copy_s / len(steps) * 1e3, 2), "ms"),
                  "overlapped with kernels": (round(100 * overlapped / copy_s), "%"),
                  "kernel time per step": (round(compute / len(steps) * 1e3, 2), "ms")},
        fix="prefetch the next batch: copy it with non_blocking=True on a side torch.cuda.Stream while this step "
            "computes, then torch.cuda.current_stream().wait_stream(side) before using it",
    )
