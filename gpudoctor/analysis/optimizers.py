"""The script's optimizers, as each one's first step() found it: where it was built and how its step updates the
tensors (collect.optimizer_hooks), with the host's time in optimizer.step() per step, timed in the window's detail
steps."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpudoctor.analysis.views import Location, Step
from gpudoctor.bundle.events import OptimizerEvent


@dataclass(frozen=True)
class OptimizerInfo:
    """An optimizer the script stepped: its class, where it was built, the tensors it updates, its foreach and
    fused settings (None: torch's default) and whether its class takes them, the parameters' device types, and
    whether it steps the tensors one by one in Python (`per_tensor`)."""

    name: str
    module: str | None
    location: Location | None
    tensors: int
    foreach: bool | None
    fused: bool | None
    takes_foreach: bool
    takes_fused: bool
    devices: tuple[str, ...]
    per_tensor: bool

    @property
    def built_at(self) -> str | None:
        """Where it was built, as 'file:line': how a try's remedy finds it again (gpudoctor.remedy.OptimizerRemedy)."""
        return f"{self.location.file}:{self.location.line}" if self.location else None

    @property
    def from_torch(self) -> bool:
        """One of torch.optim's own optimizers."""
        return (self.module or "").startswith("torch.optim")


def optimizers(events: Iterable[OptimizerEvent]) -> list[OptimizerInfo]:
    """Each optimizer the script stepped, in the order of their first steps."""
    return [OptimizerInfo(e.name, e.module, Location.from_site(e.site), e.tensors, e.foreach, e.fused,
                          e.takes_foreach, e.takes_fused, tuple(e.devices), e.per_tensor) for e in events]


def optimizer_step_s(steps: Sequence[Step]) -> float | None:
    """The host's mean time per step in optimizer.step(), over the steps that timed it (the window's detail steps);
    None where none did."""
    timed = [s.optimizer_s for s in steps if s.optimizer_s is not None]
    return statistics.fmean(timed) if timed else None


def optimizer_share(steps: Sequence[Step]) -> float | None:
    """The share of the steps that timed optimizer.step() (the window's detail steps) spent in it; None where none
    did. Where the step is all the host's own work (no GPU activity), the detail steps' hooks slow every part of
    it alike: this share, at the run's pace, is the optimizer's time outside the window."""
    timed = [s for s in steps if s.optimizer_s is not None and s.wall_s > 0]
    wall = sum(s.wall_s for s in timed)
    return sum(s.optimizer_s or 0.0 for s in timed) / wall if wall > 0 else None
