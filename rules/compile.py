"""GD313 and GD314: torch.compile, not used where it would fuse, and breaking or recompiling where it is."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, NotEvaluated, Remedy, Run, rule
from gpudoctor.analysis import Compiles, GraphBreak, Recompiles, compile_setting

# What dynamo's reasons say, and the change that removes the break or the recompilation.
BREAK_FIXES = (
    ("Tensor.item()", ("keep `.item()` and other reads of a value out of the compiled forward, or set "
                      "torch._dynamo.config.capture_scalar_outputs = True")),
    ("data-dependent", "replace the Python branch on a tensor's value with torch.where / torch.cond"),
    ("print", "move the print (or the logging) out of the compiled code"),
    ("call_function", ("move the call dynamo cannot trace out of the compiled code, or wrap it in "
                      "torch.compiler.disable")),
)
# Reasons of a break that reads a value the GPU computes: the host waits for the GPU there, on every call.
VALUE_READS = ("Tensor.item()", "data-dependent", "Tensor.tolist()")
RECOMPILE_FIXES = (
    ("size mismatch", ("mark the changing dimension dynamic (torch._dynamo.mark_dynamic(x, 1), or "
                      "torch.compile(model, dynamic=True)), or pad the batches to a few fixed sizes")),
    ("dtype mismatch", "give the compiled model one dtype"),
    ("___check_obj_id", "keep the Python objects the forward reads (a module, a flag) the same between calls"),
)


@rule("GD313", "fusible-work-not-compiled", category="compile")
def fusible_work_not_compiled(run: Run, max_busy_share: float = 0.5, max_median_kernel_us: float = 20.0,
                              max_idle_per_kernel_us: float = 200.0, min_fusible_share: float = 0.8,
                              min_impact: float = 0.1) -> Iterator[Finding]:
    """A launch-bound step of small elementwise kernels that torch.compile would fuse runs eagerly.

    What it detects: a step launch-bound as GD301 finds it (the GPU busy under `max_busy_share` of the step,
    its median kernel under `max_median_kernel_us` µs, at most `max_idle_per_kernel_us` µs of idle per kernel),
    whose kernels are at least `min_fusible_share` elementwise operations, reductions and normalizations (by
    count: each one a launch; an eager optimizer's kernels, launched in its step(), are GD312's and not
    fusible by compiling the model), in a script that compiles nothing (no Triton kernel, no compiled model, nothing
    torch._dynamo compiled).

    Why it matters: eager PyTorch launches a kernel for each operation; a model of hand-written elementwise
    blocks (a gated activation, a residual, an RMS norm) launches a dozen tiny kernels per block, and the GPU
    finishes each before the host launches the next. torch.compile fuses each block's operations into a kernel
    or two: the same step with a fraction of the launches.

    Example: 24 blocks of `x * torch.sigmoid(x * gate) + 0.1 * torch.tanh(x)`, a residual and an RMS norm, at
    batch 32: ~600 kernels of 2-4 µs a step, the GPU idle 80% of it.

    Fix: `model = torch.compile(model)` where the model is built (the first steps compile it; later ones run the
    fused kernels). `gpudoctor profile --try-fixes=all` runs the model the loop calls through torch.compile
    (as `torch.compile(model)` does) and times the steps after it, the compilation reported apart; compiled
    kernels round differently, so the try also reports how far the loss moved.

    Impact: the share of the step's launches compiling removes (analysis.fusion: each run of fusible kernels
    launched one after another becomes one kernel per reduction or normalization in it), as a share of the
    launch-bound step, within the GPU's idle while the host launches (the budget's `compile` slice). On an H100,
    elementwise_eager_bad's step went from 18.1 and 17.5 ms to 3.6 and 4.0 ms compiled, in two recordings (80%
    saved): its one run of 935 kernels a step, one kernel per reduction in it left, gives 90%; compiling fused across
    the norms too (35 kernels a step), and the Python around the launches stayed.
    """
    run.require_gpu()
    run.require_steps()
    launches, mix, budget = run.gpu_work.launches, run.gpu_work.fusion, run.budget
    if launches is None or mix is None or budget is None:
        raise NotEvaluated("the analysed steps ran no kernel on the GPU")
    if mix.triton or run.sites.forward_module == "OptimizedModule" or run.job_time.compiles is not None:
        return  # compiled already: GD314 looks at how
    median_us = launches.median_kernel_s * 1e6
    if (launches.busy_share + launches.stalled_share >= max_busy_share or median_us >= max_median_kernel_us
            or launches.idle_per_kernel_s * 1e6 > max_idle_per_kernel_us or mix.fusible_share < min_fusible_share):
        return
    kept = mix.kept_share
    impact = min(1 - kept, budget.share_of("compile"))
    if impact < min_impact:
        return
    step = budget.step_s
    setting = compile_setting(run) or "model = torch.compile(model) where the model is built"
    yield Finding(
        f"{mix.fusible_share:.0%} of the step's {launches.kernels_per_step:.0f} kernels are small elementwise "
        "operations torch.compile would fuse, and the model runs eagerly",
        impact=impact, location=run.sites.forward_location,
        evidence={"kernels per step": round(launches.kernels_per_step),
                  "fusible kernels": (round(mix.fusible_share * 100), "%"),
                  "median kernel": (round(median_us, 1), "µs"),
                  "GPU busy": (round((1 - budget.idle_share) * 100), "%"),
                  "step compiled (est.)": (round(step * (1 - impact) * 1e3, 2), "ms")},
        fix=f"{setting}: the first steps compile it, the later ones launch ~{kept:.0%} of the kernels; "
            "--try-fixes=all measures it, with the compile time apart and how far the loss moves",
        remedy=Remedy(compile="inductor"),
    )


@rule("GD314", "graph-breaks-and-recompiles", category="compile")
def graph_breaks_and_recompiles(run: Run, min_recompiles: int = 1) -> Iterator[Finding]:
    """A compiled model breaks its graph, or compiles again, while the script trains.

    What it detects: from torch._dynamo's own records of what it compiled, each line where the compiled code
    breaks its graph (dynamo resumes after it in a frame named `torch_dynamo_resume_in_<function>_at_<line>`),
    with dynamo's reason; and each compiled function compiled again at least `min_recompiles` times, with
    dynamo's reasons (the guard that failed: a size, a dtype, a Python object) and the compile time they took.

    Why it matters: each break splits the model into graphs with Python between them: more launches, less
    fusion, and a `.item()` or a print that waits for the GPU. Each recompilation costs seconds of compile time
    inside training steps; a model that keeps recompiling (a new sequence length each batch) may hit dynamo's
    recompile limit and fall back to eager for the rest of the run.

    Example: `if x.abs().max().item() > 1e4:` in a compiled forward (a graph break at that line, on every call),
    fed batches whose length changes every step (a recompilation for each new length until dynamo marks it
    dynamic).

    Fix: for a break, what its reason says (a read of a value: keep it out of the forward, or
    `torch._dynamo.config.capture_scalar_outputs = True`; a print: move it out); for recompilations on sizes,
    `torch._dynamo.mark_dynamic(x, dim)` or `torch.compile(model, dynamic=True)`, or batches padded to a few
    fixed lengths.

    Impact: the recompilations' compile time inside the steps after start-up, as a share of those steps' time.
    A break that reads a value the GPU computes (`.item()`, a branch on a tensor's value) makes the host wait
    for the GPU at each call, as GD211's syncs do, though no hook sees it inside the compiled code: where no
    other synchronizing call was recorded, its impact is the budget's `sync` slice, the GPU's idle around the
    host's synchronizations, shared among the breaks that read a value (recompiles_bad on an H200: 7.8% of the
    step; its twin without the break and the recompilations measured 9% faster). Another break's cost (the
    launches and Python between its graphs), or one beside recorded syncs, which GD211 sizes, is not predicted:
    its finding gives its count, reason and the compile time of the code after it.
    """
    run.require_steps()
    found = run.job_time.compiles
    if found is None:
        if run.sites.forward_module == "OptimizedModule":
            raise NotEvaluated("the compiled model's compilations were not recorded (torch._dynamo gave no metrics)")
        return
    steady = run.step_view.steady_steps
    first = steady[0].index if steady else 0
    wall = sum(s.wall_s for s in steady)
    waits = _unclaimed_sync_share(run)
    reading = sum(_reads_value(_reason(broken, found)) for broken in found.breaks)
    for broken in found.breaks:  # the breaks that read a value share the waits
        yield _break_finding(broken, found, waits / reading if waits and reading else None)
    for again in found.recompiles:
        if again.count >= min_recompiles:
            yield _recompile_finding(again, again.seconds_from(first) / wall if wall > 0 else None)


def _unclaimed_sync_share(run: Run) -> float | None:
    """The budget's `sync` slice where no synchronizing call was recorded (GD211 sizes the ones that were); None
    without a budget or with recorded calls."""
    budget = run.budget
    if budget is None or run.sites.syncs:
        return None
    return next(s.share for s in budget.slices if s.name == "sync")


def _reason(broken: GraphBreak, found: Compiles) -> str | None:
    return broken.reason or next(iter(found.graph_breaks), None)


def _reads_value(reason: str | None) -> bool:
    return reason is not None and any(key.lower() in reason.lower() for key in VALUE_READS)


def _break_finding(broken: GraphBreak, found: Compiles, waits: float | None) -> Finding:
    reason = _reason(broken, found)
    hits = found.graph_breaks.get(reason, 0) if reason else 0
    impact = round(waits, 4) if waits and _reads_value(reason) else None
    return Finding(
        # the line is the finding's location, which every view shows beside the title
        "The compiled code breaks its graph" + (f" in {broken.location.function}()" if broken.location else "")
        + (f": {_first_sentence(reason)}" if reason else ""),
        impact=impact,
        impact_reason=None if impact is not None else
        "a graph break's cost at run time is not predicted: compiling without it measures it",
        location=broken.location,
        evidence={"reason": _first_sentence(reason) if reason else None, "breaks counted by dynamo": hits or None,
                  "code after the break compiled": broken.compiles,
                  "its compile time": (round(broken.seconds, 2), "s")},
        fix=_fix(reason, BREAK_FIXES, "move what dynamo cannot trace out of the compiled code"),
    )


def _recompile_finding(again: Recompiles, impact: float | None) -> Finding:
    reason = again.reasons[0] if again.reasons else None
    return Finding(
        f"{again.function} was compiled {again.count} more time{'s' if again.count > 1 else ''}"
        + (f": {reason}" if reason else ""),
        impact=impact, impact_reason=None if impact is not None else "the steps' time is not known",
        location=again.location,
        evidence={"recompilations": again.count, "compile time": (round(again.seconds, 2), "s"),
                  "reasons": "; ".join(again.reasons[:3]) or None,
                  "in steps": ", ".join(map(str, again.steps[:8])) + ("..." if len(again.steps) > 8 else "")},
        fix=_fix(reason, RECOMPILE_FIXES, "make what the failing guard checks the same from call to call"),
    )


def _fix(reason: str | None, fixes: tuple[tuple[str, str], ...], otherwise: str) -> str:
    return next((fix for key, fix in fixes if reason and key.lower() in reason.lower()), otherwise)


def _first_sentence(reason: str) -> str:
    first = reason.split("\n")[0].strip()
    return first[:200]
