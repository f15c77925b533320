import random

from gpudoctor import intervals


def test_union_merges_overlaps_across_streams():
    assert intervals.union([(0, 2), (1, 3), (5, 6), (6, 7)]) == [(0, 3), (5, 7)]


def test_covered_clips_to_the_range():
    busy = intervals.union([(0, 2), (3, 5)])
    assert intervals.covered(busy, 1, 4) == 2


def test_gaps_are_the_uncovered_parts():
    busy = intervals.union([(1, 2), (3, 4)])
    assert intervals.gaps(busy, 0, 5) == [(0, 1), (2, 3), (4, 5)]
    assert intervals.gaps([], 0, 1) == [(0, 1)]


def test_overlaps_says_whether_clipped_finds_an_interval():
    rng = random.Random(7)
    for _ in range(200):
        starts = [rng.uniform(0.0, 50.0) for _ in range(rng.randint(0, 12))]
        pairs = sorted((s, s + rng.uniform(0.0, 3.0)) for s in starts)
        spans = intervals.union_of([s for s, _ in pairs], [e for _, e in pairs])
        for _ in range(20):
            lo = rng.uniform(-2.0, 55.0)
            hi = lo + rng.uniform(0.0, 5.0)
            assert spans.overlaps(lo, hi) == bool(spans.clipped(lo, hi)), (pairs, lo, hi)
