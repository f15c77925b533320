"""Which line is the user's: a library installed outside the interpreter's site-packages is not."""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

import pytest

from gpudoctor.bundle.records import Site
from gpudoctor.collect.callsite import user_location, user_site_in
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


GENERATED = '''
def call(function):
    """Stands for the `call` of a module inductor wrote into its cache: it runs the compiled graph."""
    return function()
'''


def test_code_torch_compile_generated_is_never_the_users_line(tmp_path, monkeypatch):
    """recompiles_bad (H200) ran its graph through /tmp/torchinductor_root/6e/c6ep....py:123, `call`: no line the user
    can change, though it lies outside torch and every installed package. The line that called the model is named."""
    cache = tmp_path / "torchinductor_ana" / "6e"
    cache.mkdir(parents=True)
    (cache / "c6eplqdysw.py").write_text(GENERATED)
    monkeypatch.setattr(sys, "path", [sys.path[0], str(cache), *sys.path[1:]])
    monkeypatch.delitem(sys.modules, "c6eplqdysw", raising=False)
    generated = importlib.import_module("c6eplqdysw")
    site = generated.call(_patched_call)
    assert site is not None
    assert (site.file, site.function) == (__file__, "test_code_torch_compile_generated_is_never_the_users_line")


def _patched_call():
    """Stands for a call gpudoctor wraps, made by the compiled graph: user_location() names the line that led to it."""
    return user_location()


# -- the line an exception is told at -------------------------------------------------------------------------
def _raised_through(*frames: tuple[str, int, str]) -> list[traceback.FrameSummary]:
    return [traceback.FrameSummary(file, line, function) for file, line, function in frames]


def test_an_exception_raised_inside_torch_is_told_at_the_users_line() -> None:
    import torch

    inside_torch = str(Path(torch.__file__).parent / "serialization.py")
    frames = _raised_through(("/project/train.py", 12, "<module>"), ("/project/train.py", 47, "load_data"),
                             (inside_torch, 1609, "load"))
    assert user_site_in(frames) == Site(file="/project/train.py", line=47, function="load_data")


def test_an_exception_no_user_line_passed_is_told_at_the_innermost_library_line_else_where_it_was_raised() -> None:
    import json

    import torch

    library, inside_torch = json.__file__, str(Path(torch.__file__).parent / "nn" / "modules" / "module.py")
    frames = _raised_through((library, 3, "loads"), (inside_torch, 1775, "_call_impl"))
    assert user_site_in(frames) == Site(file=library, line=3, function="loads")
    assert user_site_in(_raised_through((inside_torch, 1775, "_call_impl"))) == Site(
        file=inside_torch, line=1775, function="_call_impl")
    assert user_site_in([]) is None


def test_an_exception_whose_frames_cannot_be_placed_is_still_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.collect import session

    def cannot_place(frames: object) -> None:
        raise TypeError("a sys.path entry that is not a path")

    monkeypatch.setattr(session, "user_site_in", cannot_place)
    try:
        raise ValueError("bad batch")
    except ValueError as exc:
        assert session.exception_details(exc) == ("ValueError", "bad batch", None)
