"""Interval arithmetic on (start, end) pairs: unions, clipping and gaps."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from operator import itemgetter

Interval = tuple[float, float]
_START, _END = itemgetter(0), itemgetter(1)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping intervals into a sorted list of disjoint ones."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def within(disjoint: list[Interval], lo: float, hi: float) -> list[Interval]:
    """The intervals of a sorted, disjoint list (as `union` gives) that overlap [lo, hi], found by bisection."""
    return disjoint[bisect_right(disjoint, lo, key=_END):bisect_left(disjoint, hi, key=_START)]


def covered(disjoint: list[Interval], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by already-disjoint (and sorted) intervals."""
    return sum(e - s for s, e in clip(within(disjoint, lo, hi), lo, hi))


def gaps(disjoint: list[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of [lo, hi] that no interval covers (the intervals disjoint and sorted)."""
    result, cursor = [], lo
    for s, e in clip(within(disjoint, lo, hi), lo, hi):
        if s > cursor:
            result.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < hi:
        result.append((cursor, hi))
    return result
