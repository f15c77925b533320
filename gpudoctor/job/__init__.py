"""A torchrun job: every rank's bundle analysed on its own, then together (the straggler, the ranks table).

`diagnose_job` (gpudoctor.job.merge) makes the merged report; this package's own names are what a job rule
(`@rule(..., scope="job")`) reads.
"""

from gpudoctor.job.figures import RankFigures
from gpudoctor.job.layout import is_job_dir, job_bundles
from gpudoctor.job.model import Job, RankRun

__all__ = ["Job", "RankFigures", "RankRun", "is_job_dir", "job_bundles"]
