"""Which rank of a torchrun job this process is: each rank writes its own bundle, `rank-K/`."""

from __future__ import annotations

import os


def torchrun_rank() -> int | None:
    """This process's global rank when torchrun started it as one of several (RANK and WORLD_SIZE set), else None."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return rank if world > 1 and 0 <= rank < world else None
