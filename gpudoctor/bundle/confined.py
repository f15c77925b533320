"""A run directory is data: gpudoctor reads a bundle's files where they are, inside its run directory, and nowhere
else.

Run directories are handed around (attached to a bug report, kept by CI, copied from a cluster), so one may hold a
symbolic link to somewhere else on the disk of whoever reads it: a trace that is a link to the reader's own files, a
rank-1/ that is a link to their project, a findings.json that is a link to a file gpudoctor would then overwrite. A
bundle's file or folder that leads out of its run directory is never followed (`inside` is False for it, and
`bundle_file` refuses it, naming the link), and one that is not a regular file (a FIFO, a device) is never opened:
reading either could hang, fill the memory, or read what the bundle does not hold. A link that stays inside the run
directory is followed, as a copy of it would be.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpudoctor.errors import BundleError


def inside(root: Path, path: Path) -> bool:
    """Whether `path`, its links followed, lies within `root` (its own links followed: a run directory given by a
    link is the one it leads to)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # RuntimeError: a loop of links
        return False


def leads_out(root: Path, path: Path) -> BundleError:
    """The error for a bundle's `path` that leads out of `root`."""
    try:
        target = os.path.realpath(path)
    except (OSError, ValueError):
        target = "somewhere else"
    return BundleError(f"{path} is a link to {target}, outside the run directory {root}: gpudoctor reads a run "
                       "directory's files only inside it.")


def bundle_file(root: Path, name: str | Path) -> Path | None:
    """root/name when it is a regular file within `root`; None when there is none, or it is no regular file (a FIFO,
    a device). Raises BundleError when it leads out of `root`."""
    path = root / name
    if not inside(root, path):
        raise leads_out(root, path)
    return path if path.is_file() else None


def listed_file(root: Path, name: str) -> Path:
    """root/name, for a file name a bundle lists (its manifest's `files`). Raises BundleError when the name is no
    place within `root` (an absolute path, `..` out of it) or leads out of it by a link."""
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise BundleError(f"{root}'s manifest lists {name}, which is not inside the run directory: gpudoctor reads a "
                          "run directory's files only inside it.")
    if not inside(root, root / relative):
        raise leads_out(root, root / relative)
    return root / relative
