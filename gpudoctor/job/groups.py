"""The order of a big job's ranks in its report: the outliers first, then the others node by node.

A table of 64 rows in rank order hides the one rank that matters. From GROUPED_FROM ranks, or wherever the
ranks ran on several nodes, the report's ranks table opens with the outliers (a rank that failed, the one the
others wait for, and any whose step, wait for the others or wait for data stands out from the job's median by
more than OUTLIER_SHARE of the job's step), then gives each node's other ranks under its name.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence

from gpudoctor.job.figures import LOST, RankFigures

GROUPED_FROM = 9  # up to 8 ranks, one node: the table stays in rank order
OUTLIER_SHARE = 0.1  # of the job's step, beyond the ranks' median
FAILED_ENDINGS = ("exception", "signal", "timeout", "no_start", LOST)


def rank_groups(figures: Sequence[RankFigures], slow_rank: int | None) -> list[tuple[str | None, list[int]]]:
    """(title, ranks) in the order the table shows them; one untitled group for a small job on one node."""
    ranks = sorted(figures, key=lambda f: f.rank)
    nodes = _by_node(ranks)
    if len(ranks) < GROUPED_FROM and len(nodes) < 2:
        return [(None, [f.rank for f in ranks])]
    outliers = _outliers(ranks, slow_rank)
    groups: list[tuple[str | None, list[int]]] = []
    if outliers:
        groups.append(("Outliers", outliers))
    for node, members in nodes.items():
        rest = [f.rank for f in members if f.rank not in outliers]
        if rest:
            groups.append((_node_title(node, members), rest))
    return groups


def _by_node(ranks: Sequence[RankFigures]) -> dict[tuple[int, str], list[RankFigures]]:
    nodes: dict[tuple[int, str], list[RankFigures]] = defaultdict(list)
    for f in ranks:
        nodes[(f.node_rank if f.node_rank is not None else -1, f.host or "")].append(f)
    return dict(sorted(nodes.items()))


def _node_title(node: tuple[int, str], members: Sequence[RankFigures]) -> str:
    number, host = node
    where = (f"node {number}" + (f" ({host})" if host else "")) if number >= 0 else (host or "an unnamed host")
    return f"{where}: {len(members)} rank{'s' if len(members) > 1 else ''}"


def _outliers(ranks: Sequence[RankFigures], slow_rank: int | None) -> list[int]:
    steps = [f.step_s for f in ranks if f.step_s]
    job_step = max(steps) if steps else None
    found = {f.rank for f in ranks if f.ending in FAILED_ENDINGS}
    if slow_rank is not None:
        found.add(slow_rank)
    if job_step:
        for value in (_step, _wait_for_ranks, _data_wait):
            found |= _standing_out(ranks, value, OUTLIER_SHARE * job_step)
    return sorted(found)


def _standing_out(ranks: Sequence[RankFigures], value: Callable[[RankFigures], float | None],
                  margin: float) -> set[int]:
    measured = {f.rank: v for f in ranks if (v := value(f)) is not None}
    if len(measured) < 3:
        return set()
    middle = statistics.median(measured.values())
    return {rank for rank, v in measured.items() if abs(v - middle) > margin}


def _step(f: RankFigures) -> float | None:
    return f.step_s


def _wait_for_ranks(f: RankFigures) -> float | None:
    return f.time.waiting_s if f.time is not None else f.collective_wait_s


def _data_wait(f: RankFigures) -> float | None:
    return f.time.data_wait_s if f.time is not None else f.data_wait_s
