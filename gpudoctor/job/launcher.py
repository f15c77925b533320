"""What launched a job's ranks, as its pages name it: torchrun, Lightning, mp.spawn or accelerate.

The ranks' bundles say how gpudoctor came to record each (`RankEvent.source`): in their own `gpudoctor profile`
(torchrun's workers, in the form `gpudoctor profile torchrun ...` rewrites a job into: no source of their own), from
the RANK a launcher put in their environment ("environment": Lightning's launcher, accelerate, a script's own
subprocesses) or as torch.multiprocessing's children ("torch.multiprocessing": mp.spawn, Lightning's ddp_spawn).
The frameworks the script ran on (`Env.frameworks`) tell Lightning's and accelerate's launchers from the others.
"""

from __future__ import annotations

from gpudoctor.job.model import Job


def launcher_of(job: Job) -> str | None:
    """"torchrun", "Lightning", "mp.spawn" or "accelerate"; None where the bundles do not tell (ranks a script
    started with a RANK of its own)."""
    sources = {source for r in job.ranks for source in r.figures.recorded_as}
    frameworks = {name for r in job.ranks for name in r.figures.frameworks}
    if "lightning" in frameworks:
        return "Lightning"
    if "torch.multiprocessing" in sources:
        return "mp.spawn"
    if "accelerate" in frameworks:
        return "accelerate"
    if "environment" not in sources:  # every rank recorded by a gpudoctor profile of its own: torchrun's workers
        return "torchrun"
    return None
