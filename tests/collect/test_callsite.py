"""Which line is the user's: a library installed outside the interpreter's site-packages is not."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from gpudoctor.bundle.records import Site
from gpudoctor.collect.window_hooks import _site_and_library

LIBRARY = '''
from gpudoctor.collect.callsite import user_location


def where():
    return patched_call()


def calls(function):
    """Stands for library code that makes a call gpudoctor wraps (GradScaler.step() reading .item())."""
    return function()


def patched_call():
    """Stands for a call gpudoctor wraps: user_location() names the line that called it."""
    return user_location()
'''


def _import_library(folder: Path, monkeypatch: pytest.MonkeyPatch, installed: bool):
    """`minitrainer`, a package on sys.path after the script's own folder, as PYTHONPATH or --target puts one."""
    (folder / "minitrainer").mkdir()
    (folder / "minitrainer" / "__init__.py").write_text(LIBRARY)
    if installed:
        (folder / "minitrainer-1.0.dist-info").mkdir()
        (folder / "minitrainer-1.0.dist-info" / "METADATA").write_text("Name: minitrainer\nVersion: 1.0\n")
    monkeypatch.setattr(sys, "path", [sys.path[0], str(folder), *sys.path[1:]])
    monkeypatch.delitem(sys.modules, "minitrainer", raising=False)
    return importlib.import_module("minitrainer")


def test_a_package_installed_into_a_folder_on_the_path_is_not_the_users_line(tmp_path, monkeypatch):
    library = _import_library(tmp_path, monkeypatch, installed=True)
    site = library.where()
    assert isinstance(site, Site)
    assert site.file == __file__
    assert site.function == "test_a_package_installed_into_a_folder_on_the_path_is_not_the_users_line"


def test_a_folder_of_plain_modules_on_the_path_is_the_users_code(tmp_path, monkeypatch):
    library = _import_library(tmp_path, monkeypatch, installed=False)
    site = library.where()
    assert isinstance(site, Site)
    assert (Path(site.file), site.function) == (tmp_path / "minitrainer" / "__init__.py", "where")


def _sync_wrapper():
    """Stands for gpudoctor's wrapper of a synchronizing call: it asks who called it."""
    return _site_and_library()


def test_a_call_a_library_makes_for_the_users_line_names_the_library(tmp_path, monkeypatch):
    library = _import_library(tmp_path, monkeypatch, installed=True)
    site, via = library.calls(_sync_wrapper)
    assert via == "minitrainer"
    assert site is not None and site.function == "test_a_call_a_library_makes_for_the_users_line_names_the_library"
    site, via = _sync_wrapper()  # the user's own call
    assert via is None
    assert site is not None and site.function == "test_a_call_a_library_makes_for_the_users_line_names_the_library"
