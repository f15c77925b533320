"""Analysis: a run bundle parsed once into typed, cached views (see `Run`)."""

from gpudoctor.analysis.run import NotEvaluated, Run

__all__ = ["NotEvaluated", "Run"]
