"""gpudoctor: find out why a PyTorch script leaves its GPU idle, and what to change.

The public API for rule authors is `rule`, `Finding`, `Run` and `NotEvaluated` (and the view types that
`Run` returns, importable from `gpudoctor.analysis`); a rule of a torchrun job (`@rule(..., scope="job")`)
takes a `Job` of `RankRun`s, each with its `RankFigures`. A finding whose fix gpudoctor can apply at run time
carries a `Remedy` (with a `LoaderRemedy` or an `OptimizerRemedy`), which `gpudoctor profile --try-fixes`
measures. `gpudoctor.testing` tests a rule. A training loop with neither an optimizer nor a DataLoader marks its
steps with `gpudoctor.step()`. Importing gpudoctor is cheap: the rest loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudoctor._version import __version__

if TYPE_CHECKING:
    from gpudoctor.analysis import NotEvaluated, Run
    from gpudoctor.engine.api import Finding, rule
    from gpudoctor.job import Job, RankFigures, RankRun
    from gpudoctor.remedy import LoaderRemedy, OptimizerRemedy, Remedy

__all__ = ["Finding", "Job", "LoaderRemedy", "NotEvaluated", "OptimizerRemedy", "RankFigures", "RankRun", "Remedy",
           "Run", "__version__", "rule", "step"]


def step() -> None:
    """Mark the end of a training step. Does nothing unless the script runs under `gpudoctor profile`."""
    from gpudoctor.collect.recorder import active

    recorder = active()
    if recorder is not None:
        recorder.on_explicit_step()


def __getattr__(name: str) -> Any:
    if name in ("Finding", "rule"):
        from gpudoctor.engine import api

        return getattr(api, name)
    if name in ("Run", "NotEvaluated"):
        from gpudoctor import analysis

        return getattr(analysis, name)
    if name in ("Remedy", "LoaderRemedy", "OptimizerRemedy"):
        from gpudoctor import remedy

        return getattr(remedy, name)
    if name in ("Job", "RankFigures", "RankRun"):
        from gpudoctor import job

        return getattr(job, name)
    raise AttributeError(f"module 'gpudoctor' has no attribute {name!r}")
