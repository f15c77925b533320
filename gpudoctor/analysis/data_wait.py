"""How long the steps wait for data, and how much of that wait the GPU spends idle.

The recorder times the wait for the next batch at every step, cheaply, so the figure covers every step after
start-up, not only the few the profiler watched. But a wait on the host is not always a wait of the GPU: with no
sync in the loop, the host launches a GPU-bound step and moves on, and can run many steps ahead of the GPU. Its
own step then takes less than the GPU's work for that step, and it can wait for a batch while the GPU works
through the queue. In steady state the GPU idles for data only to the extent that the host's step, wait
included, takes longer than the GPU's work for one step (`gpu_work_s`, measured on the trace). More workers
cannot make a step faster than the GPU's work, so this is also the most a faster input pipeline can save.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis.views import Step

STARVED_STEP_SHARE = 0.5  # a step that waited more than this share of its time for data is a starved one


@dataclass(frozen=True)
class DataWait:
    """The data wait of a run's steps after start-up, as means per step."""

    wait_s: float  # on the host
    wall_s: float
    starved_steps: int  # steps that waited more than STARVED_STEP_SHARE of their time
    steps: int
    gpu_work_s: float | None = None  # the GPU's work for one step (None: no trace with GPU activity)

    @property
    def gpu_bound(self) -> bool:
        """The GPU's work for a step takes at least as long as the host's step, wait included: the host ran ahead
        of the GPU, and its waits for data did not leave the GPU idle."""
        return self.gpu_work_s is not None and self.gpu_work_s >= self.wall_s

    @property
    def idle_s(self) -> float:
        """The part of the wait the GPU spent idle: all of it without a trace, else at most the time the host's
        step took beyond the GPU's work for it."""
        if self.gpu_work_s is None:
            return self.wait_s
        return min(self.wait_s, max(0.0, self.wall_s - self.gpu_work_s))

    @property
    def share(self) -> float:
        """The GPU-idle part of the wait as a share of the step."""
        return self.idle_s / self.wall_s if self.wall_s > 0 else 0.0

    def starving(self, min_wait_share: float, min_starved_steps: float) -> bool:
        """On average, or in enough single steps that an average would hide them (3 long waits in 30 steps);
        never when the GPU's own work sets the pace."""
        if self.gpu_bound:
            return False
        return self.share >= min_wait_share or self.starved_steps >= max(2.0, min_starved_steps * self.steps)

    def evidence(self) -> dict[str, object]:
        """The wait, and how many steps it starved. The step it is a share of is the run's one step figure (the
        report gives it), not shown again here: the mean of these steps differs from it by the window's."""
        figures: dict[str, object] = {
            "data wait per step": (round(self.wait_s * 1e3, 2), "ms"),
            "steps waiting over half their time": f"{self.starved_steps} of {self.steps}"}
        if self.gpu_work_s is not None:
            figures["GPU work per step"] = (round(self.gpu_work_s * 1e3, 2), "ms")
        return figures


def data_wait(steps: Sequence[Step], gpu_work_s: float | None) -> DataWait | None:
    """The data wait of `steps` (None when there are none, or they took no time)."""
    if not steps:
        return None
    wall = sum(s.wall_s for s in steps) / len(steps)
    if wall <= 0:
        return None
    starved = sum(1 for s in steps if s.wall_s > 0 and s.data_wait_s / s.wall_s > STARVED_STEP_SHARE)
    return DataWait(sum(s.data_wait_s for s in steps) / len(steps), wall, starved, len(steps), gpu_work_s)
