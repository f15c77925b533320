"""Find the frame of the user's own code that led to an event, skipping torch, gpudoctor and the stdlib."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import traceback
from collections.abc import Sequence
from types import FrameType

from gpudoctor.bundle.records import Site, generated_code


def _dir_of(module_name: str) -> str | None:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.realpath(path)) + os.sep if path else None


def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    prefixes = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(os.path.realpath(p) + os.sep for p in prefixes if p)


@functools.lru_cache(maxsize=8)
def _install_dirs(search_path: tuple[str, ...]) -> tuple[str, ...]:
    """The entries of sys.path that packages are installed into, beside the interpreter's own site-packages.

    `pip install --user` and `--target`, PYTHONPATH folders and Debian's dist-packages are not in sysconfig's
    paths; a folder that holds an installed package's .dist-info is one of them. The script's own folder
    (the first entry) never is, and a project's .egg-info build folder is no sign of one.
    """
    found = []
    for entry in search_path[1:]:
        if not entry or not os.path.isdir(entry):
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        if any(name.endswith(".dist-info") for name in names):
            found.append(os.path.realpath(entry) + os.sep)
    return tuple(found)


def _libraries() -> tuple[str, ...]:
    return _LIBRARIES + _install_dirs(tuple(sys.path))


_GPUDOCTOR_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # gpudoctor/
_LIBRARIES = _library_prefixes()
_realpaths: dict[str, str] = {}


def _realpath(filename: str) -> str:
    cached = _realpaths.get(filename)
    if cached is None:
        cached = _realpaths[filename] = os.path.realpath(filename)
    return cached


def _is_internal(path: str, torch_dir: str | None) -> bool:
    return path.startswith(_GPUDOCTOR_DIR) or (torch_dir is not None and path.startswith(torch_dir))


def user_frame(skip: int = 1) -> FrameType | None:
    """The innermost frame in the user's code; failing that, the innermost one outside torch and gpudoctor.

    Libraries in site-packages (a Trainer, say) count as the user's only when no frame of the script's
    own code is on the stack, so that the line shown is the one the user can change.
    """
    return user_frame_from(sys._getframe(skip + 1))


def user_frame_from(frame: FrameType | None) -> FrameType | None:
    """`user_frame` of a stack that starts at `frame` (another thread's, say)."""
    torch_dir, libraries = _dir_of("torch"), _libraries()
    fallback = None
    while frame is not None:
        whose = _whose(frame.f_code.co_filename, torch_dir, libraries)
        if whose == "user":
            return frame
        if whose == "library":
            fallback = fallback or frame
        frame = frame.f_back
    return fallback


def user_site_in(frames: Sequence[traceback.FrameSummary]) -> Site | None:
    """The line of a traceback (innermost last) that `user_frame` would choose: the innermost in the user's code,
    else the innermost outside torch and gpudoctor; failing both, the line that raised."""
    torch_dir, libraries = _dir_of("torch"), _libraries()
    fallback = None
    for summary in reversed(frames):
        whose = _whose(summary.filename, torch_dir, libraries)
        if whose == "user":
            return _site_of(summary)
        if whose == "library":
            fallback = fallback or summary
    chosen = fallback or (frames[-1] if frames else None)
    return _site_of(chosen) if chosen is not None else None


def _whose(filename: str, torch_dir: str | None, libraries: tuple[str, ...]) -> str:
    """'user', 'library' (an installed package or the stdlib) or 'internal' (torch, gpudoctor, generated code)."""
    if filename.startswith("<") or generated_code(filename):
        return "internal"
    path = _realpath(filename)
    if _is_internal(path, torch_dir):
        return "internal"
    return "library" if path.startswith(libraries) else "user"


def _site_of(summary: traceback.FrameSummary) -> Site:
    return Site(file=summary.filename, line=summary.lineno or 0, function=summary.name)


def location(frame: FrameType | None) -> Site | None:
    if frame is None:
        return None
    return Site(file=frame.f_code.co_filename, line=frame.f_lineno, function=frame.f_code.co_name)


def user_location(skip: int = 1) -> Site | None:
    """The user's line calling into the instrumented code, or None."""
    return location(user_frame(skip + 1))
