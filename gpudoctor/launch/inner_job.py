"""torchrun around gpudoctor (`torchrun ... -m gpudoctor profile --out RUN train.py`): each rank is a `gpudoctor
profile` of its own, writing RUN/rank-K/, and the last rank of the node to finish merges them into RUN's
findings.json and report.html, as `gpudoctor profile torchrun ...` does once torchrun has ended.

A rank says it is done (its bundle finished and analysed) with a marker in its bundle naming torchrun's agent, the
parent every rank of this run on this node shares; the rank that finds the markers of all LOCAL_WORLD_SIZE ranks
takes the merge, once. Rank directories of an earlier run into the same RUN, with no marker of this run, are
replaced by this run's, as an earlier run's files are.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.launch.ranks import torchrun_rank

# Set by `gpudoctor profile torchrun ...` for the ranks it starts: it merges them itself when torchrun ends.
OUTER_ENV = "GPUDOCTOR_OUTER_JOB"
DONE = ".analysed"


def merges_itself() -> bool:
    """Whether this `gpudoctor profile` is a rank of torchrun's whose job nobody else merges."""
    return torchrun_rank() is not None and OUTER_ENV not in os.environ


def merged_by_outer() -> bool:
    """Whether this `gpudoctor profile` is a rank of a job that `gpudoctor profile torchrun ...` runs: that command
    analyses every rank, once, when torchrun has ended, and writes each rank's report with the job's."""
    return torchrun_rank() is not None and OUTER_ENV in os.environ


def _agent() -> str:
    return str(os.getppid())


def mark_done(rank_dir: Path) -> None:
    try:
        (rank_dir / DONE).write_text(_agent(), encoding="utf-8")
    except OSError:
        return


def take_merge(job_dir: Path) -> bool:
    """Whether this rank is the last of its node's to finish and the one to merge (then earlier runs' rank
    directories are gone from `job_dir`)."""
    expected = _ranks_on_node()
    dirs = rank_dirs(job_dir, with_manifest=False)
    ours = {rank: path for rank, path in dirs.items() if _marker(path) == _agent()}
    if len(ours) < expected:
        return False
    try:
        os.close(os.open(job_dir / f".merging-{_agent()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return False  # another rank took it
    for rank, path in dirs.items():
        if rank not in ours:
            shutil.rmtree(path, ignore_errors=True)
    return True


def merged(job_dir: Path) -> None:
    """The merge is written: the markers and the lock go, leaving the run directory as the outer form leaves it."""
    from gpudoctor.bundle.layout import rank_dirs

    for path in rank_dirs(job_dir, with_manifest=False).values():
        (path / DONE).unlink(missing_ok=True)
    (job_dir / f".merging-{_agent()}").unlink(missing_ok=True)


def _marker(rank_dir: Path) -> str | None:
    try:
        return (rank_dir / DONE).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _ranks_on_node() -> int:
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        try:
            return max(1, int(os.environ[name]))
        except (KeyError, ValueError):
            continue
    return 1
