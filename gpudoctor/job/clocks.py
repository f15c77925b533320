"""The job's ranks' clocks, aligned by the ends of their collectives rather than by the hosts' wall clocks.

Each rank's times are its own host's: two hosts' clocks can differ by milliseconds, even under NTP, which is a
step's length. Under DDP, a step's last collective ends at one moment on every rank (when the last rank's data
has arrived). So a rank's clock offset from the job's first rank is the median, over the steps both analysed, of
the difference between their last collectives' ends; what is left after it (the median absolute deviation) is
the residual, which the report says beside the offsets: an offset known only to within it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_STEPS = 3  # steps in common with the first rank, below which no offset is given


@dataclass(frozen=True)
class ClockOffset:
    """How far a rank's clock runs ahead of the first rank's (`offset_s`, negative: behind), from `steps` steps,
    to within `residual_s`."""

    offset_s: float
    residual_s: float
    steps: int


def clock_offsets(ends: Mapping[int, Mapping[int, float]]) -> dict[int, ClockOffset]:
    """Each rank's offset from the lowest rank's clock, from the ends of their steps' last collectives (`ends`:
    rank -> step -> time on that rank's clock). Ranks with too few steps in common with it get none."""
    if len(ends) < 2:
        return {}
    reference = min(ends)
    offsets = {}
    for rank, own in ends.items():
        common = sorted(set(own) & set(ends[reference]))
        if len(common) < MIN_STEPS:
            continue
        offsets[rank] = _offset([own[step] - ends[reference][step] for step in common])
    return offsets


def _offset(differences: Sequence[float]) -> ClockOffset:
    offset = statistics.median(differences)
    return ClockOffset(offset, statistics.median(abs(d - offset) for d in differences), len(differences))
