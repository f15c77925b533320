"""GD3xx: kernels and launches that leave the GPU's SMs idle."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, Remedy, Run, rule
from gpudoctor.analysis import BatchGrowth, batch_setting, compile_setting, settings_location

# The start of GD301's evidence key for the saving per sample of a larger batch (bench/validate_impacts.py reads it).
SAMPLE_SAVING = "saving per sample"


# The evidence bench/validate_impacts.py sets beside a twin that replays its steps as CUDA graphs.
GRAPHED_STEP = "step with CUDA graphs (est.)"
GRAPHS_FIX = ('replay the steps as CUDA graphs: torch.compile(model, mode="reduce-overhead") (compiling alone fuses '
              'little of these kernels)')

# Why a step compiled or replayed as CUDA graphs already gets no saving: no recorded pair measured one.
UNSIZED_AFTER_COMPILE = ("the step is compiled or replays CUDA graphs already: what capturing more of it saves "
                         "depends on the Python around its launches, which the trace does not tell apart from them; "
                         "a run with the change measures it")


@rule("GD301", "launch-bound-steps", category="small_batch")
def launch_bound_steps(run: Run, max_busy_share: float = 0.5, max_median_kernel_us: float = 20.0,
                       max_wait_share: float = 0.1, max_idle_per_kernel_us: float = 200.0,
                       min_compile_saving: float = 0.05) -> Iterator[Finding]:
    """Steps are launch-bound: many tiny kernels, and the GPU finishes each before the next is launched.

    What it detects: the GPU is busy less than `max_busy_share` of the step (not counting idle time
    that synchronizing calls explain: see GD211), its kernels are short (median under
    `max_median_kernel_us` µs), the GPU idles at most `max_idle_per_kernel_us` µs per kernel (the time
    to launch the next one: 36-64 µs in the launch-bound fixtures; 490-890 µs where the host computes
    between launches, as in the thread-pool inference fixtures), the step is not waiting on data (under
    `max_wait_share`), and one Python thread launches the work (several point to GD501) — so the
    host's launches set the pace.

    Why it matters: each kernel launch costs the host a few microseconds; when a kernel runs for less
    than that, the GPU idles between kernels. Small batches are the usual cause.

    Fix: cut launches at the same batch: `torch.compile(model)` (which `--try-fixes=all` tries, as GD313's fix, with
    how far the loss moved); a model compiled already, with
    `mode="reduce-overhead"` (CUDA graphs); a step that replays CUDA graphs already, by compiling what launches
    outside them (the optimizer step). Or raise the batch size: the host's launches stay as many, and the
    kernels, which fill little of the GPU, take more samples in about the same time. A residual MLP at
    batch 64 on an H100: 4.7-5.2 ms a step eager, 4.4 compiled, 2.5 with CUDA graphs.

    Impact: what its fix saves. Where nothing is compiled yet, the fix is compiling the model, and the saving is
    the share of the step's launches compiling removes (analysis.fusion: each run of fusible kernels becomes one
    kernel per reduction in it), within the GPU's idle between launches: optimizer_fused_fixed, 48 Linear +
    LayerNorm + GELU blocks on an H200, 19% predicted where compiling measured 17% (539 to 443 launches a step).
    Where compiling would save less than `min_compile_saving` (a step of matrix products, which it leaves as they
    are), the fix is replaying the steps as CUDA graphs, sized as below, which `--try-fixes` does not try.
    The evidence gives the step with CUDA graphs too (`mode="reduce-overhead"`), which removes all of that idle
    at the run's pace (the budget's host-side and unexplained slices, without the profiler's own cost):
    small_batch_bad predicts 37% there, and its twin replaying forward and backward as CUDA graphs
    (small_batch_graphed) measured 49%. CUPTI slows every launch, so the profiled steps show this idle
    inflated (small_batch_bad: 3.0 ms steps outside the window, 2.2 times that profiled).
    A step compiled or replayed as CUDA graphs already gets no saving, only the fix: the launch-bound idle then
    holds the Python that runs around the compiled code (the eager optimizer, autograd), which no capture of
    the launches removes, and no recorded pair measured it (elementwise_compiled_fixed, compiled: 97% of its
    3.9 ms step idle, which "all of it" would have made a 38× promise).
    Where GD313 sizes the same compile fix for a step of fusible kernels, that is the one claim both findings
    make (engine.runner.one_claim_per_fix).
    The evidence adds what a larger batch would save per sample (analysis.batch_growth): the batch grown
    by powers of two until the saving nears its limit, as far as the device's memory allows, from how much
    of the GPU the kernels fill. It errs both ways: small_batch_bad's 74% at 8× against 97% measured at
    64×; up to 18% high on public programs (docs/rules.md).
    """
    run.require_gpu()
    run.require_steps()
    launches = run.gpu_work.launches  # the placed steps' shares and kernels (analysis.gpu_work.Launches)
    if launches is None or (run.host.python_threads_sharing or 1) > 1:
        return
    busy, stalled = launches.busy_share, launches.stalled_share
    if busy + stalled >= max_busy_share or launches.wait_share >= max_wait_share:
        return
    if launches.idle_per_kernel_s * 1e6 > max_idle_per_kernel_us:
        return  # the host does other work between launches
    median_us = launches.median_kernel_s * 1e6
    if median_us >= max_median_kernel_us:
        return
    idle, impact = 1 - busy, 1 - busy - stalled
    budget = run.budget
    if budget is not None:  # at the run's pace, without the profiler's own cost (analysis.budget)
        # of the steps that do not stall: a periodic save's or an epoch's worker start's idle is not the launches'
        stall = budget.seconds("stall") / budget.step_s if budget.step_s > 0 else 0.0
        idle = (budget.idle_share - stall) / (1 - stall) if stall < 1 else budget.idle_share
        impact = min(impact, budget.share_of("small_batch"))
        busy = 1 - idle
    loader = run.sites.loader.main
    batch = loader.batch_size if loader else None
    headroom, growth = run.memory_headroom, run.batch_growth
    evidence = {"GPU busy": (round(busy * 100), "%"), "kernels per step": round(launches.kernels_per_step),
                "median kernel": (round(median_us, 1), "µs"), "batch size": batch}
    if headroom is not None:
        evidence["GPU memory used"] = (round(100 / headroom), "%")
    if growth is not None:
        if growth.fill is not None:
            evidence["GPU filled by its kernels"] = (round(growth.fill * 100), "%")
        evidence[f"{SAMPLE_SAVING}, batch {growth.factor}× larger"] = (round(growth.sample_saving * 100), "%")
    first = _compiles_first(run)
    compiled = _compile_saving(run, impact) if first else None
    graphs = first and (compiled is None or compiled < min_compile_saving)  # compiling fuses little of it
    step = budget.step_s if budget is not None else None
    if first and step:
        evidence[GRAPHED_STEP] = (round(step * (1 - impact) * 1e3, 2), "ms")
        if compiled is not None:
            evidence["step compiled (est.)"] = (round(step * (1 - compiled) * 1e3, 2), "ms")
    yield Finding(
        f"Launch-bound steps: the GPU is idle {idle:.0%} of each step, waiting for the host to launch its "
        f"{launches.kernels_per_step:.0f} kernels, each done in about {_microseconds(median_us)}",
        impact=(impact if graphs else compiled) if first else None,
        impact_reason=None if first else UNSIZED_AFTER_COMPILE,
        location=settings_location(run, loader) or (loader.location if loader else None)
        or run.sites.forward_location,
        evidence=evidence,
        fix=f"{GRAPHS_FIX if graphs else _fewer_launches(run)}, or {_larger_batch(run, batch, growth, headroom)}",
        remedy=Remedy(compile="inductor") if first and not graphs else None,
    )


def _microseconds(us: float) -> str:
    return f"{us:.1f} µs" if us < 10 else f"{us:.0f} µs"


def _compile_saving(run: Run, launch_idle: float) -> float | None:
    """The share of the step compiling the model saves: the launches it removes, within the launches' idle."""
    mix = run.gpu_work.fusion
    return None if mix is None else min(launch_idle, 1 - mix.kept_share)


def _compiled(run: Run) -> bool:
    """Whether the step runs a compiled model: the script's own torch.compile, or Triton kernels that a compiler
    made (a try that compiled the model through gpudoctor leaves the script's module as it was)."""
    fusion = run.gpu_work.fusion
    return run.sites.forward_module == "OptimizedModule" or (fusion is not None and fusion.triton)


def _compiles_first(run: Run) -> bool:
    """Whether the fix that cuts launches is compiling the model (nothing compiled or replayed as graphs yet)."""
    return not run.gpu_work.replays_cuda_graphs and not _compiled(run)


def _larger_batch(run: Run, batch: int | None, growth: BatchGrowth | None, headroom: float | None) -> str:
    """The batch to try, and what it would save per sample; where the framework sets the batch, its setting."""
    if growth is None:
        full = headroom is not None and headroom < 2
        setting = batch_setting(run, None)
        return ("raise the batch size" + (f" ({setting})" if setting else "")
                + (" (the device's memory has room for little more)" if full else ""))
    size = f"to about {batch * growth.factor}" if batch else f"about {growth.factor}×"
    setting = batch_setting(run, batch * growth.factor if batch else None)
    limit = ", as far as the device's memory allows" if growth.memory_bound else ""
    return (f"raise the batch size {size}{f' ({setting})' if setting else ''}{limit}: "
            f"~{growth.sample_saving:.0%} less time per sample (est.)")


def _fewer_launches(run: Run) -> str:
    """How to cut launches, from what the step does already."""
    if run.gpu_work.replays_cuda_graphs:
        return ("compile what launches outside the CUDA graphs the step replays already (the optimizer step: "
                "torch.compile a function that calls optimizer.step())")
    if _compiled(run):
        return 'replay the compiled model as CUDA graphs: torch.compile(model, mode="reduce-overhead")'
    setting = compile_setting(run)
    if setting is not None:
        return f"compile the model to fuse kernels: {setting}"
    return "wrap the model in torch.compile(model) to fuse kernels"
