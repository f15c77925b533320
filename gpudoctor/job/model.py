"""What a job rule (`@rule(..., scope="job")`) receives: every rank's run, figures and findings."""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.analysis import Run
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.job.figures import RankFigures


@dataclass(frozen=True)
class RankRun:
    """One rank: its run, its figures per step, and what its own rules found on it (largest impact first)."""

    rank: int
    run: Run
    figures: RankFigures
    findings: list[FindingRecord]


@dataclass(frozen=True)
class Job:
    """A torchrun job's ranks, by rank (one node's or several nodes' run directories merged)."""

    ranks: list[RankRun]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def step_s(self) -> float | None:
        """The job's step: the slowest rank's median (under DDP the ranks' medians differ only by noise)."""
        return max((r.figures.median_step_s for r in self.ranks if r.figures.median_step_s), default=None)

    @property
    def paced_rank(self) -> RankRun:
        """The rank with the longest step time, which the others wait for (the first one when none was measured)."""
        return max(self.ranks, key=lambda r: r.figures.step_s or 0.0)

    @property
    def pace_s(self) -> float | None:
        """The job's step at its pace, which savings are of: the slowest rank's step time."""
        return self.paced_rank.figures.step_s or None

    def rank(self, number: int) -> RankRun:
        return next(r for r in self.ranks if r.rank == number)

    @property
    def missing_ranks(self) -> list[int]:
        """The job's ranks, as its launcher counted them (each rank's manifest), whose bundle is not here: another
        node's, written where that node ran; empty where the launcher said nothing."""
        worlds = [r.run.manifest.launch.world_size for r in self.ranks if r.run.manifest.launch is not None]
        present = {r.rank for r in self.ranks}
        return sorted(set(range(max(worlds))) - present) if worlds else []
