"""What a try writes in the script's working directory goes into the try's own folder, and the script's own files
are as the diagnosed run left them.

A try runs the script again in its working directory (its relative paths to data must still work), so it writes
its checkpoints and logs where the diagnosed run wrote them. Before the tries, the files that the diagnosed run
wrote (changed while it ran) are copied aside; after each try, every file it created or changed is moved into
RUN/tries/CODE/outputs/ (same relative path) and the copies are put back. Files written outside the working
directory are not followed. A working directory too large to list, or outputs too large to copy, make gpudoctor
refuse the tries (OutputsNotIsolated says why), rather than let a try overwrite them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.bundle.confined import inside

MAX_ENTRIES = 100_000  # files listed in the working directory before gpudoctor gives up telling outputs apart
MAX_KEPT_BYTES = 2 << 30  # the diagnosed run's own outputs copied aside, at most
SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", "gpudoctor-runs"}

Listing = dict[str, tuple[int, int]]  # relative path -> (mtime in ns, size)


class OutputsNotIsolated(Exception):
    """The tries cannot keep their outputs apart from the script's: one sentence says why."""


@dataclass(frozen=True)
class WorkingDirectory:
    root: Path
    skipped: tuple[Path, ...]  # gpudoctor's own run directory, and anything else not to list

    def listing(self) -> Listing:
        """Every file under the root, but the skipped folders, with when it was last changed and its size."""
        files: Listing = {}
        for path, stat in self._walk():
            files[os.path.relpath(path, self.root)] = (stat.st_mtime_ns, stat.st_size)
            if len(files) > MAX_ENTRIES:
                raise OutputsNotIsolated(
                    f"the working directory {self.root} holds more than {MAX_ENTRIES:,} files, too many to tell a "
                    "try's outputs apart from the script's")
        return files

    def _walk(self) -> Iterator[tuple[str, os.stat_result]]:
        skipped = {os.path.realpath(p) for p in self.skipped}
        stack = [str(self.root)]
        while stack:
            folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue  # a folder that cannot be read is not one the script writes to
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIPPED_DIRS and os.path.realpath(entry.path) not in skipped:
                        stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    try:
                        yield entry.path, entry.stat(follow_symlinks=False)
                    except OSError:
                        continue


def written_between(listing: Listing, started: float, ended: float) -> list[str]:
    """The files last changed while the diagnosed run ran (its own outputs)."""
    low, high = int(started * 1e9), int(ended * 1e9)
    return sorted(path for path, (mtime, _) in listing.items() if low <= mtime <= high)


class KeptOutputs:
    """The diagnosed run's outputs, copied aside into `store` for the tries' duration."""

    def __init__(self, directory: WorkingDirectory, paths: list[str], store: Path) -> None:
        self.directory, self.paths, self.store = directory, paths, store
        remove(store)  # an earlier store, left by a try that was stopped, or a link planted in its place
        size = sum((directory.root / p).stat().st_size for p in paths if (directory.root / p).is_file())
        if size > MAX_KEPT_BYTES:
            raise OutputsNotIsolated(
                f"the script's run wrote {size / 2**30:.1f} GiB of files in {directory.root}, more than gpudoctor "
                f"keeps aside ({MAX_KEPT_BYTES / 2**30:.0f} GiB) while a try would overwrite them")
        for path in paths:
            _copy(directory.root / path, store / path)

    def after_try(self, before: Listing, outputs: Path) -> list[str]:
        """Move what the try created or changed into `outputs`, and put the diagnosed run's files back; the
        paths moved."""
        after = self.directory.listing()
        changed = sorted(p for p, stamp in after.items() if before.get(p) != stamp)
        for path in changed:
            _move(self.directory.root / path, outputs / path)
        for path in self.paths:
            target = self.directory.root / path
            if not inside(self.directory.root, target.parent):
                continue  # the try made a folder of it a link out of the working directory: not written through
            if path in changed or not target.exists():
                _copy(self.store / path, target)
        return changed

    def discard(self) -> None:
        shutil.rmtree(self.store, ignore_errors=True)


def remove(path: Path) -> None:
    """Remove `path`, a folder with what it holds, or a file or a link (never what the link leads to)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()  # copied in its place, never through it
    shutil.copy2(source, target)


def _move(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(source, target)

