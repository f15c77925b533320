"""A diagnosis written: its report built, then findings.json, report.html and the text summary made of it; a job's
ranks each get their own report in their bundle."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.bundle import FINDINGS, REPORT
from gpudoctor.bundle.jsonio import write_replacing
from gpudoctor.engine import RunDiagnosis
from gpudoctor.errors import OutputNotWritableError
from gpudoctor.job.parallel import analysis_processes, each_rank
from gpudoctor.job.report import job_reports
from gpudoctor.pipeline.diagnosis import Diagnosis
from gpudoctor.report import build_report
from gpudoctor.report.document import Report
from gpudoctor.report.model import TRACE_CUT_SHORT, TRACE_LEFT_OUT, link_outputs
from gpudoctor.report.render import to_html, to_json, to_text

FORMATS = ("text", "json", "html")


@dataclass(frozen=True)
class Written:
    report: Report
    files: dict[str, Path]  # "json" -> findings.json, "html" -> report.html, as asked
    summary: str | None  # the text summary, for the terminal, when "text" was asked


def report_of(diagnosis: Diagnosis, out_dir: Path | None = None) -> Report:
    """The report of `diagnosis`, as written into `out_dir` (default: its own directory)."""
    return _reports(diagnosis, out_dir or diagnosis.out_dir)[0]


def write(diagnosis: Diagnosis, out_dir: Path, formats: Iterable[str] = FORMATS,
          say: Callable[[str], None] | None = None) -> Written:
    """The report built and written into `out_dir` in `formats` (text: the summary returned); a job's ranks each
    get their own findings.json and report.html first. `say` is told when the run's trace had to be left out."""
    formats = tuple(formats)
    report, own = _reports(diagnosis, out_dir)
    _write_ranks(own)
    left_out = _trace_left_out(report)
    if say is not None and left_out is not None:
        say(left_out)
    files = write_files(report, out_dir, formats)
    shown = files.get("html") or files.get("json")
    summary = to_text(report, str(shown) if shown else None) if "text" in formats else None
    return Written(report, files, summary)


def _write_ranks(own: dict[Path, Report]) -> None:
    """Each rank's own findings.json and report.html into its bundle, side by side in as many processes as its
    analysis took (gpudoctor.job.parallel): rendering a page is most of a small rank's time."""
    bundles = dict(enumerate(own))
    each_rank(bundles, lambda _, bundle: write_files(own[bundle], bundle), analysis_processes(bundles))


def _reports(diagnosis: Diagnosis, out_dir: Path) -> tuple[Report, dict[Path, Report]]:
    """The report, and a job's ranks' own reports by their bundle."""
    found = diagnosis.found
    if isinstance(found, RunDiagnosis):
        return build_report(found.run, found.result, diagnosis.docs, found.windows, diagnosis.left), {}
    return job_reports(found, diagnosis.docs, out_dir)


def _trace_left_out(report: Report) -> str | None:
    """One sentence when the run's trace could not be read and the report was made without it, or ended early."""
    row = next((row for row in report["not_measured"] if row["what"] in (TRACE_LEFT_OUT, TRACE_CUT_SHORT)), None)
    return None if row is None else f"{row['reason']}."


def write_files(report: Report, out_dir: Path, formats: Iterable[str] = ("json", "html")) -> dict[str, Path]:
    """findings.json and report.html of `report` in `out_dir`, as asked."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = {}
        if "json" in formats:
            written["json"] = out_dir / FINDINGS
            write_replacing(written["json"], to_json(report).encode("utf-8"))
        if "html" in formats:
            written["html"] = out_dir / REPORT
            write_replacing(written["html"], to_html(link_outputs(report, out_dir)).encode("utf-8"))
        return written
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write the report to {out_dir} ({exc.strerror}).") from None
