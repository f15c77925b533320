"""Which rank of a torchrun job this process is: each rank writes its own bundle, `rank-K/`."""

from __future__ import annotations

import os


def torchrun_rank() -> int | None:
    """This process's global rank when torchrun started it (RANK and WORLD_SIZE set), else None.

    A job of one rank is still a torchrun job: torchrun's agent sets TORCHELASTIC_RUN_ID for its workers, and
    `gpudoctor profile torchrun --nproc_per_node 1 ...` merges the rank's bundle from rank-0/ as it would
    several. RANK=0 with WORLD_SIZE=1 and no agent (set by a cluster's launcher) is a single process.
    """
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    started_by_torchrun = world > 1 or "TORCHELASTIC_RUN_ID" in os.environ
    return rank if started_by_torchrun and 0 <= rank < world else None
