"""A torchrun job: every rank's bundle analysed on its own, then together (the straggler, the ranks table)."""

from gpudoctor.job.figures import RankFigures
from gpudoctor.job.layout import is_job_dir, job_bundles
from gpudoctor.job.merge import diagnose_job
from gpudoctor.job.model import Job, RankRun

__all__ = ["Job", "RankFigures", "RankRun", "diagnose_job", "is_job_dir", "job_bundles"]
