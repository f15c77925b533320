"""Interval arithmetic on (start, end) pairs: unions, clipping and gaps."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


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


def covered(disjoint: list[Interval], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by already-disjoint intervals."""
    return sum(e - s for s, e in clip(disjoint, lo, hi))


def gaps(disjoint: list[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of [lo, hi] that no interval covers."""
    result, cursor = [], lo
    for s, e in clip(disjoint, lo, hi):
        if s > cursor:
            result.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < hi:
        result.append((cursor, hi))
    return result
