"""The shares of a step every page says alike: how much of it the GPU idles, the least the step can take, and the
budget the findings' savings are shared out of.

The GPU's idle share is the budget's idle slices (its data wait that of every step after start-up, as the savings'
is), else the analysed steps' idle time: a run's report, a job's rank in the job's report and on its own page all
say this one.

Every fix of an idle or a wait leaves the step its own work: the GPU's work per step where the trace shows it;
on a run without GPU activity, the main thread's CPU per step outside its wait for data (loading leaves the main
thread once workers load; its own computing stays). A run with GPU activity shares its savings out of its budget
(analysis.budget); one without, out of its step less that floor (`host_budget`), so that the findings together
never promise a step shorter than its own work (a starved loop on a 2-core host beside two busy programs: 405 ms
steps, 57 ms of the main thread's CPU in each, and 34 ms steps on a quiet host).
"""

from __future__ import annotations

from gpudoctor.analysis.budget import Budget, host_budget
from gpudoctor.analysis.run import Run


def work_floor_s(run: Run) -> float | None:
    """The least a step can take whatever the findings' fixes remove from its idle and its waits; None where
    neither the GPU's work nor the main thread's CPU was measured."""
    if run.gpu_work.per_step_s is not None:
        return run.gpu_work.per_step_s
    cpu, wait = run.host.main_thread_cpu_s, run.steady_wait_share
    return None if cpu is None else cpu * (1.0 - (wait or 0.0))


def claim_budget(run: Run) -> Budget | None:
    """The budget the findings' savings are shared out of (engine.runner.within_slices): the run's own; on a run
    without GPU activity, its step less its work floor, the stalls' excess apart."""
    if run.budget is not None:
        return run.budget
    step = run.pace.seconds
    if not step or not run.steps:
        return None
    return host_budget(step, work_floor_s(run), len(run.steps), run.job_time.stall_share)


def gpu_idle_share(run: Run) -> float | None:
    """The share of the step the GPU idles (see the module's docstring); None without GPU activity."""
    budget = run.budget
    if budget is None:
        return run.gpu_work.idle_share
    return budget.idle_share
