"""A finding's card in the report: the finding as findings.json holds it, the user's source lines around its location
(read when the report is made, if the file is still there) and its rule's full documentation."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from pathlib import Path

from gpudoctor.analysis import Run
from gpudoctor.bundle.findings import FindingJson, FindingRecord, LocationJson
from gpudoctor.report.document import Card, SourceSnippet

SOURCE_CONTEXT = 3  # lines shown either side of a finding's line
MAX_SOURCE_BYTES = 5_000_000
MAX_SOURCE_LINE = 200


def created_at(run: Run) -> float | None:
    """When the run started, in seconds since the epoch; None when its manifest does not say."""
    try:
        return dt.datetime.fromisoformat(str(run.manifest.created)).timestamp()
    except ValueError:
        return None


def _source_path(file: str, run_cwd: str | None) -> Path | None:
    """The file as recorded; a relative one from the run's working directory; a run made in another checkout of
    the same project from here. A Python file only (.py): a run directory from elsewhere names what it likes, and
    its report must not copy lines of the reader's other files (keys, tokens) into a page they may send back."""
    path = Path(file)
    if path.suffix != ".py":
        return None
    candidates = [path] if path.is_absolute() else [Path(run_cwd or ".") / path, path]
    if path.is_absolute() and run_cwd and path.is_relative_to(run_cwd):
        candidates.append(Path.cwd() / path.relative_to(run_cwd))
    for candidate in candidates:
        try:
            if candidate.is_file() and candidate.stat().st_size <= MAX_SOURCE_BYTES:
                return candidate
        except OSError:
            continue
    return None


def source_snippet(location: LocationJson | None, run_cwd: str | None = None,
                   created: float | None = None) -> SourceSnippet | None:
    """The lines around a finding's location, read now; None when the file is not here (or has no such line)."""
    if not location or not location.get("file") or not location.get("line"):
        return None
    path = _source_path(str(location["file"]), run_cwd)
    if path is None:
        return None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        changed = created is not None and path.stat().st_mtime > created
    except (OSError, ValueError):
        return None
    line = int(location["line"])
    if not 1 <= line <= len(lines):
        return None
    numbers = range(max(1, line - SOURCE_CONTEXT), min(len(lines), line + SOURCE_CONTEXT) + 1)
    return {
        "file": str(path), "line": line, "changed_since_run": changed,
        "lines": [{"number": n, "text": _shown_line(lines[n - 1]), "highlight": n == line} for n in numbers],
    }


def _shown_line(text: str) -> str:
    """A source line as the snippet shows it: whole (the page wraps it), or cut with a mark past MAX_SOURCE_LINE."""
    return text if len(text) <= MAX_SOURCE_LINE else text[:MAX_SOURCE_LINE] + " …"


def doc_paragraphs(doc: str | None) -> list[str]:
    """A rule's docstring as paragraphs, each one line (the renderer marks up `code`)."""
    if not doc:
        return []
    return [" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]


def card(index: int, record: FindingRecord, shown: FindingJson, run: Run, docs: Mapping[str, str],
          created: float | None) -> Card:
    """A finding's card: `shown` is the record as findings.json has it, which the template reads."""
    return {
        "id": f"finding-{index + 1}", "finding": shown,
        "impact_percent": None if record.impact is None else round(record.impact * 100, 1),
        "source": source_snippet(shown["location"], run.manifest.cwd, created),
        "doc": doc_paragraphs(docs.get(record.code) or record.doc),
    }


def finding_cards(records: list[FindingRecord], run: Run, docs: Mapping[str, str]) -> list[Card]:
    """A card for each finding, its source lines read from `run`'s working directory."""
    created = created_at(run)
    return [card(i, record, record.to_json(), run, docs, created) for i, record in enumerate(records)]
