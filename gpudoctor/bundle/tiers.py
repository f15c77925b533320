"""Where each row of a sample file goes when it is compacted: the tiers by age, and the plan of the buckets.

A sample file (samples/host.jsonl, procs.jsonl, gpu.jsonl) grows by one row per sample, ten a second by
default. Compaction rewrites it in tiers by age: the samples of the last 10 minutes stay exactly as they
were written; older ones are merged into buckets 1 s wide up to 1 hour old, 10 s wide up to 12 hours old and
60 s wide beyond. Buckets are aligned on the epoch, so files sampled at the same times (host and procs) merge
into rows with the same times. Whatever the run's length, a file holds at most `Policy.max_rows` rows once
compacted: when there would be more, the coarsest buckets double in width, as often as needed.

Bounds. At 10 Hz and the defaults a file holds 6,000 raw rows (10 min), 3,000 rows of 1 s, 3,960 of 10 s and
60 more an hour beyond 12 hours: 13,680 rows after a day. From about 5 days on, the cap of 20,000 rows
doubles the coarsest width. Between two compactions rows are appended (3,000 when the samplers compact every 5 minutes).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpudoctor import intervals
from gpudoctor.bundle.buckets import is_number


@dataclass(frozen=True)
class Tier:
    """Samples at least `from_age_s` old merge into buckets `width_s` wide (aligned on the epoch)."""

    width_s: float
    from_age_s: float


def _divides(finer: float, coarser: float) -> bool:
    ratio = coarser / finer
    return ratio >= 1 and abs(ratio - round(ratio)) < 1e-9


@dataclass(frozen=True)
class Policy:
    """Tiers from the finest to the coarsest; samples younger than the first tier's age stay raw."""

    tiers: tuple[Tier, ...] = (Tier(1.0, 600.0), Tier(10.0, 3600.0), Tier(60.0, 12 * 3600.0))
    max_rows: int = 20_000

    def __post_init__(self) -> None:
        if not self.tiers or self.max_rows < 1:
            raise ValueError("a policy needs at least one tier and max_rows >= 1")
        for finer, coarser in zip(self.tiers, self.tiers[1:]):
            if coarser.from_age_s <= finer.from_age_s or not _divides(finer.width_s, coarser.width_s):
                raise ValueError("tiers must grow older, each width a whole multiple of the previous one "
                                 "(so that buckets nest)")
        if self.tiers[0].width_s <= 0 or self.tiers[0].from_age_s < 0:
            raise ValueError("widths must be positive and ages not negative")

    @property
    def full_resolution_s(self) -> float:
        return self.tiers[0].from_age_s


DEFAULT_POLICY = Policy()


BucketKey = tuple[int, int]  # (tier, bucket number at that tier's width)


@dataclass(frozen=True)
class Plan:
    widths: tuple[float, ...]  # each tier's bucket width, the coarsest doubled where the row cap asked for it
    keys: list[BucketKey | None]  # per row: the bucket it merges into, None to stay as it is
    rows: int  # rows once compacted


def plan(times: Sequence[float | None], now: float, policy: Policy = DEFAULT_POLICY,
         keep: Sequence[tuple[float, float]] = ()) -> Plan:
    """Where each row (given by its time `t`) goes; consecutive rows with the same key merge into one.

    Rows inside a `keep` span (the profiling windows, whose steps the rules analyse) stay as they are.

    A row's tier is the coarsest whose whole bucket around it is old enough, so that a bucket is merged all at
    once, never in part. Over `policy.max_rows`, the buckets of the coarsest tier double in width, as often as
    needed; a doubled bucket may be merged in parts, which later compactions merge together. The finer tiers
    hold a bounded number of rows (12,960 at the defaults and 10 Hz), so the cap holds up to about 20 samples a
    second; above, the plan with the fewest rows is taken.
    """
    kept = _KeptSpans(keep)
    tiers = [None if kept.holds(t) else _tier_of(t, now, policy.tiers) for t in times]
    widths = [tier.width_s for tier in policy.tiers]
    layout = _layout(times, tiers, widths)
    best, coarsest = layout, len(widths) - 1
    doublings = _fewest_doublings(layout, policy.max_rows)
    while layout.rows > policy.max_rows and _groups_in_tier(layout.keys, coarsest) > 1:
        widths[coarsest] = policy.tiers[coarsest].width_s * 2 ** doublings
        layout = _layout(times, tiers, widths)
        best = min(best, layout, key=lambda candidate: candidate.rows)
        doublings += 1
    return layout if layout.rows <= policy.max_rows else best


class _KeptSpans:
    """Spans whose rows stay raw, merged where they overlap, for a lookup by bisection."""

    def __init__(self, spans: Sequence[tuple[float, float]]) -> None:
        disjoint = intervals.union(spans)
        self._starts = [start for start, _ in disjoint]
        self._ends = [end for _, end in disjoint]

    def holds(self, t: float | None) -> bool:
        """Whether t lies in a span, its ends included."""
        if not self._starts or not is_number(t):
            return False
        index = bisect_right(self._starts, t) - 1
        return index >= 0 and t <= self._ends[index]


def _tier_of(t: float | None, now: float, tiers: Sequence[Tier]) -> int | None:
    """The coarsest tier whose whole bucket around t is old enough for it; None: the row stays as it is."""
    if not is_number(t):
        return None
    for index in range(len(tiers) - 1, -1, -1):
        width = tiers[index].width_s
        if (t // width + 1) * width <= now - tiers[index].from_age_s:
            return index
    return None


def _layout(times: Sequence[float | None], tiers: list[int | None], widths: list[float]) -> Plan:
    # A row has a tier only when its time is a number (_tier_of): the None check is for the type checker.
    keys = [None if tier is None or t is None else (tier, int(t // widths[tier])) for t, tier in zip(times, tiers)]
    return Plan(tuple(widths), keys, _count_rows(keys))


def _fewest_doublings(layout: Plan, max_rows: int) -> int:
    """A lower bound on the doublings of the coarsest width that fit the cap, to skip those that cannot:
    a doubling at most halves the coarsest tier's rows, and leaves the other tiers' rows as they are."""
    coarsest_rows = _groups_in_tier(layout.keys, len(layout.widths) - 1)
    room = max_rows - (layout.rows - coarsest_rows)
    doublings = 1
    while room > 0 and coarsest_rows > room * 2 ** doublings:
        doublings += 1
    return doublings


def _count_rows(keys: Iterable[BucketKey | None]) -> int:
    rows, previous = 0, None
    for key in keys:
        if key is None or key != previous:
            rows += 1
        previous = key
    return rows


def _groups_in_tier(keys: Iterable[BucketKey | None], tier: int) -> int:
    return len({key for key in keys if key is not None and key[0] == tier})
