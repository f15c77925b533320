"""Recorded GPU fixtures: bundles in fixtures/bundles (or packed in a .tar.gz there), opened as a `Run`."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from gpudoctor import bundle as bundle_io
from gpudoctor.analysis import Run

FIXTURES_ENV = "GPUDOCTOR_FIXTURES"
_extracted: dict[Path, Path] = {}


def _default_fixtures_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "fixtures" / "bundles"


def fixture_path(name: str, root: Path | str | None = None) -> Path:
    """The directory of the recorded bundle `name`: ROOT/NAME, or NAME/ inside a .tar.gz in ROOT (extracted
    once per process into a temporary directory). ROOT defaults to $GPUDOCTOR_FIXTURES, else the
    checkout's fixtures/bundles/."""
    base = Path(root or os.environ.get(FIXTURES_ENV) or _default_fixtures_dir())
    direct = base / name
    if (direct / bundle_io.MANIFEST).is_file():
        return direct
    archives = [base / f"{name}.tar.gz", *sorted(p for p in base.glob("*.tar.gz") if p.name != f"{name}.tar.gz")]
    for archive in archives:
        if archive.is_file():
            extracted = _extract(archive)
            if (extracted / name / bundle_io.MANIFEST).is_file():
                return extracted / name
    raise FileNotFoundError(f"no recorded bundle named {name!r} in {base} (as a directory or inside a .tar.gz); "
                            f"available: {', '.join(available_fixtures(base)) or 'none'}. Record them with "
                            "fixtures/record.py on a GPU machine.")


def available_fixtures(root: Path | str | None = None) -> list[str]:
    """Names of the recorded bundles in ROOT, unpacked or packed."""
    base = Path(root or os.environ.get(FIXTURES_ENV) or _default_fixtures_dir())
    if not base.is_dir():
        return []
    names = {p.parent.name for p in base.glob(f"*/{bundle_io.MANIFEST}")}
    for archive in base.glob("*.tar.gz"):
        with tarfile.open(archive) as tar:
            names |= {m.name.split("/")[0] for m in tar.getmembers() if m.name.endswith(f"/{bundle_io.MANIFEST}")}
    return sorted(names)


def load_fixture(name: str, root: Path | str | None = None) -> Run:
    """The recorded bundle `name` (see fixture_path), loaded as a `Run`."""
    return Run.from_bundle(fixture_path(name, root))


@functools.cache
def _cache_root() -> Path:
    """The temporary directory archives are extracted into, made at the first extraction, removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="gpudoctor-fixtures-"))
    atexit.register(shutil.rmtree, root, True)
    return root


def _extract(archive: Path) -> Path:
    archive = archive.resolve()
    if archive not in _extracted:
        target = _cache_root() / f"{len(_extracted)}-{archive.name.removesuffix('.tar.gz')}"
        target.mkdir()
        with tarfile.open(archive) as tar:
            _safe_extract(tar, target)
        _extracted[archive] = target
    return _extracted[archive]


def _safe_extract(tar: tarfile.TarFile, target: Path) -> None:
    if hasattr(tarfile, "data_filter"):  # Python 3.12, and 3.10.12 / 3.11.4 onwards
        tar.extractall(target, filter="data")
        return
    for member in tar.getmembers():
        resolved = (target / member.name).resolve()
        if not (member.isfile() or member.isdir()) or target.resolve() not in (resolved, *resolved.parents):
            raise ValueError(f"refusing to extract {member.name!r}: not a plain file inside the archive")
    tar.extractall(target)  # noqa: S202 - every member was checked above

