"""Writing a built bundle: every file through the bundle's own writers, the manifest last, as the launcher does."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import msgspec

from gpudoctor.bundle.jsonio import JsonlWriter, write_json_atomic
from gpudoctor.bundle.layout import EVENTS, FINDINGS, MANIFEST, REPORT, SAMPLE_FILES, SAMPLES_DIR, TRACE, sample_file
from gpudoctor.bundle.manifest import Manifest
from gpudoctor.testing.built_events import events
from gpudoctor.testing.built_manifest import manifest
from gpudoctor.testing.built_samples import sample_files
from gpudoctor.testing.built_trace import write_trace
from gpudoctor.testing.spec import BundleSpec


def write_bundle(spec: BundleSpec) -> Manifest:
    """Write the bundle `spec` describes into its directory, replacing what an earlier write left there; returns
    the manifest written."""
    path = spec.settings.path
    spec.check_rows()
    _clear(path)
    files = [EVENTS]
    write_jsonl(path / EVENTS, events(spec))
    if spec.writes_trace:
        write_trace(path / TRACE, spec)
        files.append(TRACE)
    for kind, rows in sample_files(spec).items():
        write_jsonl(sample_file(path, kind), rows)
        files.append(f"{SAMPLES_DIR}/{SAMPLE_FILES[kind]}")
    written = manifest(spec, files)
    write_json_atomic(path / MANIFEST, written)
    return written


def _clear(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name in (EVENTS, TRACE, FINDINGS, REPORT):
        (path / name).unlink(missing_ok=True)
    shutil.rmtree(path / SAMPLES_DIR, ignore_errors=True)


def write_jsonl(path: Path, records: Iterable[msgspec.Struct]) -> None:
    writer = JsonlWriter(path, keep_free=False)  # a bundle built in code: no script to leave room to
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()
