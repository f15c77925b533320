"""The report: a JSON-serializable summary of a run and its findings, and the renderers that format it."""

from gpudoctor.report.document import Report
from gpudoctor.report.model import build_report

__all__ = ["Report", "build_report"]
