"""Where a torchrun job's bundles are: `rank-K/` (K the global rank) in each run directory given, one per node."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpudoctor.bundle.layout import is_job_dir, rank_dirs
from gpudoctor.errors import BundleError

__all__ = ["is_job_dir", "job_bundles"]


def job_bundles(paths: Iterable[Path]) -> dict[int, Path]:
    """Every rank bundle of the run directories `paths` (one per node of a job), by global rank.

    Raises BundleError when a directory holds no rank bundle or two of them hold the same rank.
    """
    found: dict[int, Path] = {}
    for path in paths:
        ranks = rank_dirs(path)
        if not ranks:
            raise BundleError(f"{path} holds no rank bundle (rank-0/, rank-1/, ...) of a torchrun job.")
        for rank, bundle in ranks.items():
            if rank in found:
                raise BundleError(f"rank {rank} is in both {found[rank]} and {bundle}: give each node's run "
                                  "directory once, from one job.")
            found[rank] = bundle
    return dict(sorted(found.items()))
