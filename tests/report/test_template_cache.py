"""The report's templates are compiled once and kept in the user's cache directory; a cache that is missing, damaged
or cannot be written changes nothing in the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.pipeline import RuleSelection, diagnose, prepare_rules, report_of
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import to_html
from gpudoctor.testing import fixture_path


@pytest.fixture(scope="module")
def report() -> dict:
    diagnosis = diagnose([fixture_path("blocking_copy_bad")], prepare_rules(RuleSelection()))
    return link_outputs(report_of(diagnosis), fixture_path("blocking_copy_bad"))


def _cached(cache_home: Path) -> list[Path]:
    return sorted(cache_home.glob("gpudoctor/templates-jinja2-*/*"))


def test_the_second_page_comes_from_the_compiled_template(report: dict, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = to_html(report)
    compiled = _cached(tmp_path)
    stamps = [c.stat().st_mtime_ns for c in compiled]
    assert compiled
    assert to_html(report) == first
    assert [c.stat().st_mtime_ns for c in _cached(tmp_path)] == stamps  # read, not written again


DAMAGE = {
    "emptied": lambda code: b"",
    "overwritten": lambda code: b"\x00" * 64,
    "cut short": lambda code: code[: len(code) // 2],  # jinja's header whole, the code object cut
    "scrambled": lambda code: code[:64] + bytes(b ^ 0x5A for b in code[64:]),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_cache_is_compiled_again(report: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           damage: str) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = to_html(report)
    for compiled in _cached(tmp_path):
        compiled.write_bytes(DAMAGE[damage](compiled.read_bytes()))
    assert to_html(report) == first


def test_a_cache_that_cannot_be_made_is_no_cache(report: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    first = to_html(report)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert to_html(report) == first
