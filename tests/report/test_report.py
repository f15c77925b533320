"""report.html and findings.json: self-contained, and shaped as the contract says."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from markupsafe import escape

from conftest import Result
from gpudoctor.report.model import COLLECTOR_LABELS

SEVERITIES = ("info", "warning", "critical")


class _References(HTMLParser):
    """Collects every URL an element would load or link to."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "action", "data") and value:
                self.urls.append((tag, name, value))


def test_report_shows_the_verdict(training_run: Result) -> None:
    html = (training_run.run_dir / "report.html").read_text(encoding="utf-8")
    verdict = training_run.findings()["summary"]["verdict"]
    assert verdict and verdict in html
    assert f"gpudoctor: {verdict}" in training_run.stderr  # the terminal summary says the same
    assert html.lstrip().startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")


def test_report_loads_nothing_from_the_network(training_run: Result) -> None:
    html = (training_run.run_dir / "report.html").read_text(encoding="utf-8")
    parser = _References()
    parser.feed(html)
    assert not [u for u in parser.urls if re.match(r"^\s*(https?:)?//", u[2], re.IGNORECASE)], parser.urls
    assert not re.search(r"https?://", html, re.IGNORECASE)
    assert not re.search(r"<script[^>]*\ssrc\s*=", html, re.IGNORECASE)
    assert not re.search(r"<link[^>]*\shref\s*=", html, re.IGNORECASE)
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", html, re.IGNORECASE)


def test_findings_json_has_the_contract_keys(training_run: Result) -> None:
    findings = json.loads((training_run.run_dir / "findings.json").read_text(encoding="utf-8"))
    assert {"schema_version", "run", "findings", "not_evaluated", "errors"} <= set(findings)
    assert findings["schema_version"] == 1
    assert isinstance(findings["run"], dict) and findings["run"]["script"].endswith("train_loop.py")
    assert isinstance(findings["findings"], list)
    assert isinstance(findings["not_evaluated"], list) and isinstance(findings["errors"], list)
    for finding in findings["findings"]:
        keys = {"code", "name", "category", "severity", "title", "impact", "evidence", "location", "fix"}
        assert keys <= set(finding)
        assert re.fullmatch(r"[A-Z][A-Z0-9]{0,7}\d{3}", finding["code"]) and finding["severity"] in SEVERITIES
        assert finding["impact"] is None or 0 <= finding["impact"] <= 1


def test_report_lists_what_was_not_measured(training_run: Result) -> None:
    html = (training_run.run_dir / "report.html").read_text(encoding="utf-8")
    failed = {name: c["reason"] for name, c in training_run.manifest()["collectors"].items() if not c["ok"]}
    labels = COLLECTOR_LABELS
    not_measured = html[html.index("<section id=\"facts\">"):html.index("<section id=\"breakdown\">")]
    assert not_measured.count("<li>") == len(failed)
    for name, reason in failed.items():
        assert f"<li><strong>{labels[name]}</strong>: {escape(reason)}</li>" in not_measured


def test_the_cpu_side_is_measured_where_linux_keeps_it(training_run: Result) -> None:
    """The main thread's run delay (schedstat) and the host's CPU pressure (PSI), read for real where this kernel
    keeps them, and said on the page; elsewhere null, and said not measured."""
    from pathlib import Path

    wait = training_run.findings()["run"]["cpu_wait"]
    assert (wait["main_thread"] is not None) == Path("/proc/self/schedstat").exists()
    assert (wait["host_pressure"] is not None) == Path("/proc/pressure/cpu").exists()
    assert all(value is None or 0 <= value <= 1 for key, value in wait.items() if key != "workers")
    html = (training_run.run_dir / "report.html").read_text(encoding="utf-8")
    if wait["main_thread"] is not None:
        assert "waiting for a core: the main thread " in html
