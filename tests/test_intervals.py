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
