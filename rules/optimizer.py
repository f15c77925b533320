"""GD312: the optimizer's own step."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, NotEvaluated, OptimizerRemedy, Remedy, Run, rule
from gpudoctor.analysis import OptimizerInfo, optimizer_share, optimizer_step_s

# torch.optim's optimizers with a fused kernel for CPU tensors as well as CUDA ones (torch 2.4 and later).
FUSED_ON_CPU = ("Adam", "AdamW", "SGD", "Adagrad")


@rule("GD312", "optimizer-per-tensor-loop", category="optimizer")
def optimizer_per_tensor_loop(run: Run, min_share: float = 0.1, min_tensors: int = 16,
                              fused_speedup: float = 10.0) -> Iterator[Finding]:
    """The optimizer updates its tensors one at a time in Python, where a fused or foreach kernel does them all.

    What it detects: an optimizer with at least `min_tensors` tensors whose step loops over them in Python
    (torch.optim with `foreach=False`; on the CPU, where foreach is not torch's default, left unset), when the
    host's time in its `step()` (timed in the profiling window's detail steps), made `fused_speedup` times
    shorter, would save at least `min_share` of the step. An optimizer that takes neither `foreach` nor `fused`
    steps its own way, which gpudoctor cannot see into: it draws nothing.

    Why it matters: the per-tensor loop runs a dozen small operations for each parameter, each a Python call
    and, on a GPU, a kernel launch: a model of many small layers spends most of its step in the optimizer's
    Python while the GPU waits. `foreach=True` does each operation for every tensor in one call; `fused=True`
    does the whole update in one kernel. The update is the same (rounded in another order).

    Example: `torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)` over 48 Linear + LayerNorm
    blocks: 192 tensors, two thousand small kernels a step.

    Fix: `fused=True` where torch has a fused kernel for the optimizer and the parameters' device (Adam,
    AdamW, SGD, Adagrad on CUDA and, from torch 2.4, the CPU); else `foreach=True`. `gpudoctor profile
    --try-fixes` builds the optimizer so and measures the step.

    Impact: the host's time in `step()` per step, less what the fused step would take (`fused_speedup`
    times shorter: on an H100, optimizer_foreach_bad's Adam step took 18.8 ms of host time, its fused twin's
    1.8 ms), as a share of the step at the run's pace; on a GPU, at most the GPU's idle while the host works
    (the budget's host-side slices, which a launch-bound step's GD301 claims too: the optimizer's share is
    counted here, the rest there). On a run without GPU activity the step is the host's own work, which the
    fix shrinks: the host's time in `step()` is its share of the detail steps, at the run's pace.
    """
    steps = run.require_steps()
    if not run.sites.optimizers:
        raise NotEvaluated("the optimizers were not recorded (a bundle recorded before gpudoctor recorded them)"
                           if run.step_source == "optimizer" else "the script stepped no optimizer")
    hooked, step_s, budget = run.step_view.hooked_steps, run.pace.seconds, run.budget
    step_opt_s = optimizer_step_s(hooked) if budget is not None else _at_pace(optimizer_share(hooked), step_s)
    if step_opt_s is None or not step_s:
        raise NotEvaluated("optimizer.step() was not timed (it is in the profiling window's detail steps)")
    every = sum(o.tensors for o in run.sites.optimizers) or 1
    for opt in run.sites.optimizers:
        if not opt.per_tensor or opt.tensors < min_tensors:
            continue
        opt_s = step_opt_s * opt.tensors / every  # several optimizers: each its share, by tensors
        share = opt_s * (1 - 1 / fused_speedup) / step_s
        if budget is not None:
            share = min(share, budget.share_of("optimizer"))
        if share < min_share:
            continue
        yield _finding(opt, opt_s, step_s, share, len(steps))


def _at_pace(share: float | None, step_s: float | None) -> float | None:
    """The optimizer's time per step at the run's pace, on a run without GPU activity: its share of the detail
    steps it was timed in. slow_optimizer.py --impl loop on a 2-core host: 3.7 ms of 8.1 ms detail steps, at a
    3.8 ms pace; its own time, 3.7 ms, would leave forward and backward nothing. Plainly its loop took 61% of a
    3.8 ms step, and the fused twin's step 50% less (GD312's impact: 41%). On a GPU the host's time in step() is
    the launches the GPU waits for, which the hooks slow less than the rest: optimizer_foreach_bad's 22.4 ms of
    47.4 ms detail steps at a 35.5 ms pace predicts 57% as its own time, and its fused twin measured 55%."""
    return share * step_s if share is not None and step_s else None


def _finding(opt: OptimizerInfo, opt_s: float, step_s: float, share: float, steps: int) -> Finding:
    implementation = _implementation(opt)
    setting = f"{implementation}=True" if implementation else "an optimizer with a fused or foreach kernel"
    where = f" at {opt.built_at}" if opt.built_at else ""
    return Finding(
        f"{opt.name}'s step updates its {opt.tensors} tensors one at a time: {opt_s * 1e3:.1f} ms of each "
        f"{step_s * 1e3:.1f} ms step",
        impact=share, location=opt.location,
        evidence={"optimizer": opt.name, "tensors": opt.tensors, "foreach": opt.foreach, "fused": opt.fused,
                  "parameters on": ", ".join(opt.devices) or None,
                  "optimizer.step() per step": (round(opt_s * 1e3, 2), "ms"),
                  "step with the fix (est.)": (round(step_s * (1 - share) * 1e3, 2), "ms")},
        fix=(f"{opt.name}(..., {setting}){where}: the same update"
             + (" in one kernel" if implementation == "fused" else " a call per operation for every tensor")
             if implementation else f"{setting} (torch.optim.AdamW(..., fused=True)){where}"),
        remedy=Remedy(optimizer=OptimizerRemedy(at=opt.built_at, implementation=implementation))
        if implementation and opt.from_torch else None,
    )


def _implementation(opt: OptimizerInfo) -> str | None:
    """fused where torch has the kernel for the optimizer and every parameter's device, else foreach."""
    devices = set(opt.devices)
    if opt.takes_fused and devices and (devices <= {"cuda"} or (devices <= {"cuda", "cpu"}
                                                                 and opt.name in FUSED_ON_CPU)):
        return "fused"
    return "foreach" if opt.takes_foreach else None
