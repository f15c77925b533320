"""A torchrun job: every rank's bundle analysed on its own, then together (the straggler, the ranks table).

`diagnose_job` (gpudoctor.job.merge) makes the job's diagnosis; this package's own names are what a job rule
(`@rule(..., scope="job")`) reads.
"""

from gpudoctor.job.figures import RankFigures
from gpudoctor.job.layout import is_job_dir, job_bundles
from gpudoctor.job.model import Job, RankRun
from gpudoctor.job.straggling import JobAfterFix, Straggling, Turns, job_after_fix, straggling, taking_turns

__all__ = ["Job", "JobAfterFix", "RankFigures", "RankRun", "Straggling", "Turns", "is_job_dir", "job_after_fix",
           "job_bundles", "straggling", "taking_turns"]
