"""Where the shipped rule pack and templates are, in a source checkout and in an installed wheel; and a project's
pyproject.toml."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    # In a wheel they are copied into the package; in a checkout they sit beside it.
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


def builtin_rules_dir() -> Path:
    return _shipped("rules")


def templates_dir() -> Path:
    return _shipped("templates")


def findings_schema() -> Path:
    """The JSON Schema (draft 2020-12) of findings.json, shipped inside the package."""
    return _PACKAGE / "schemas" / "findings.schema.json"


def find_pyproject(start: Path) -> Path | None:
    """The pyproject.toml of the project that `start` is in: in it, or in the nearest folder above that has one."""
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None
