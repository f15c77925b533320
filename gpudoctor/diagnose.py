"""From a bundle (or a bare trace) to findings.json and report.html: analyse, run the rules, render."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.analysis import Run
from gpudoctor.bundle import FINDINGS, REPORT
from gpudoctor.engine import run_rules
from gpudoctor.errors import OutputNotWritableError
from gpudoctor.loading import load_rules, select_rules
from gpudoctor.report import build_report
from gpudoctor.report.render import to_html, to_json


@dataclass
class RuleSelection:
    paths: tuple[str, ...] = ()
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    options: dict[str, dict[str, Any]] | None = None


def open_run(path: Path) -> Run:
    """A run directory, or a Chrome trace (.json / .json.gz) from torch.profiler."""
    return Run.from_bundle(path) if path.is_dir() else Run.from_trace(path)


def diagnose(run: Run, rules: RuleSelection) -> dict[str, Any]:
    chosen = select_rules(load_rules(rules.paths), rules.select, rules.ignore)
    return build_report(run, run_rules(run, chosen, rules.options))


def write_outputs(report: dict[str, Any], out_dir: Path, formats: Iterable[str] = ("json", "html")) -> dict[str, Path]:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = {}
        if "json" in formats:
            written["json"] = out_dir / FINDINGS
            written["json"].write_text(to_json(report), encoding="utf-8")
        if "html" in formats:
            written["html"] = out_dir / REPORT
            written["html"].write_text(to_html(report), encoding="utf-8")
        return written
    except OSError as exc:
        raise OutputNotWritableError(f"gpudoctor cannot write the report to {out_dir} ({exc.strerror}).") from None
