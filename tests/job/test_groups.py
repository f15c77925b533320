"""A big job's ranks table: the outliers first, then node by node."""

from __future__ import annotations

from gpudoctor.job.figures import RankFigures, RankTime
from gpudoctor.job.groups import rank_groups


def _rank(rank: int, *, step_s: float = 0.1, waiting_s: float = 0.02, data_wait_s: float = 0.0,
          ending: str = "completed") -> RankFigures:
    time = RankTime(step_s, 0.05, 0.03, data_wait_s, step_s - 0.08 - data_wait_s, None, waiting_s=waiting_s)
    return RankFigures(rank=rank, median_step_s=step_s, data_wait_s=data_wait_s, collective_s=0.03, gpu_idle_s=None,
                       gpu_compute_s=None, steps_analysed=10, ending=ending, exit_status=0, bundle=f"rank-{rank}",
                       step_s=step_s, time=time, host=f"gpu-{rank // 8:02d}", node_rank=rank // 8)


def test_sixty_four_ranks_open_with_their_outliers_then_list_each_node() -> None:
    ranks = [_rank(n) for n in range(64)]
    ranks[37] = _rank(37, waiting_s=0.0)  # the one the others wait for
    ranks[12] = _rank(12, data_wait_s=0.03)  # waits for data far longer than the others
    ranks[50] = _rank(50, ending="lost")
    groups = rank_groups(ranks, slow_rank=37)
    assert groups[0] == ("Outliers", [12, 37, 50])
    assert [title for title, _ in groups[1:]] == [f"node {n} (gpu-{n:02d}): 8 ranks" for n in range(8)]
    assert groups[2][1] == [8, 9, 10, 11, 13, 14, 15]  # node 1 without its outlier
    assert sorted(r for _, members in groups for r in members) == list(range(64))


def test_a_small_job_on_one_node_stays_in_rank_order() -> None:
    ranks = [_rank(n) for n in (3, 1, 0, 2)]
    ranks = [RankFigures(**{**r.__dict__, "node_rank": 0, "host": "one"}) for r in ranks]
    assert rank_groups(ranks, slow_rank=1) == [(None, [0, 1, 2, 3])]
