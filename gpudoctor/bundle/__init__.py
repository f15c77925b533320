"""The run bundle: the one versioned object that collection writes and analysis reads.

A bundle is a directory (its layout: gpudoctor.bundle.layout). Every file holds typed records, validated
when they are read: the manifest (`Manifest`), the script's events (gpudoctor.bundle.events), the parent's
samples (gpudoctor.bundle.samples) and the findings (gpudoctor.bundle.findings). The profiler's Chrome
trace is read by gpudoctor.bundle.trace_stream. Everything is JSON, so a bundle made on one machine
analyses on another, weeks later.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec

from gpudoctor.bundle.confined import bundle_file, listed_file
from gpudoctor.bundle.events import EVENT_DECODER, AnyEvent
from gpudoctor.bundle.jsonio import JsonlWriter, read_jsonl, write_json_atomic
from gpudoctor.bundle.layout import (
    EVENTS,
    EXITING,
    FINDINGS,
    MANIFEST,
    PARTIAL_TRACE,
    RAW_TRACE,
    REPORT,
    SAMPLE_FILES,
    SAMPLES_DIR,
    SCHEMA_VERSION,
    STOPPING,
    TRACE,
    trace_name,
    trace_names,
)
from gpudoctor.bundle.manifest import Manifest, read_manifest
from gpudoctor.bundle.samples import GPU_ROWS, HOST_ROWS, PROCS_ROWS, GpuRow, HostRow, ProcsRow
from gpudoctor.bundle.trace_file import read_trace
from gpudoctor.bundle.trace_stream import EventFilter, TraceNotStreamable, TraceStream
from gpudoctor.errors import BundleError

__all__ = [
    "EVENTS", "EXITING", "FINDINGS", "MANIFEST", "PARTIAL_TRACE", "RAW_TRACE", "REPORT", "SAMPLES_DIR", "SAMPLE_FILES",
    "SCHEMA_VERSION", "STOPPING",
    "TRACE", "Bundle", "EventFilter", "JsonlWriter", "Manifest", "TraceNotStreamable", "TraceStream", "load",
    "read_jsonl", "read_manifest", "read_trace", "trace_name", "trace_names", "write_json_atomic",
]

_Row = TypeVar("_Row")


@dataclass(frozen=True)
class Bundle:
    """A run bundle on disk, its manifest checked. Parsing into views is gpudoctor.analysis's job. Its files are read
    only inside its directory (gpudoctor.bundle.confined)."""

    path: Path
    manifest: Manifest

    @property
    def trace_path(self) -> Path | None:
        return self.window_trace_path(0)

    def window_trace_path(self, window: int) -> Path | None:
        return bundle_file(self.path, trace_name(window))

    def events(self) -> Iterator[AnyEvent]:
        path = bundle_file(self.path, EVENTS)
        return read_jsonl(path, EVENT_DECODER) if path is not None else iter(())

    def host_samples(self) -> list[HostRow]:
        return self._rows("host", HOST_ROWS)

    def proc_samples(self) -> list[ProcsRow]:
        return self._rows("procs", PROCS_ROWS)

    def gpu_samples(self) -> list[GpuRow]:
        return self._rows("gpu", GPU_ROWS)

    def _rows(self, kind: str, decoder: msgspec.json.Decoder[_Row]) -> list[_Row]:
        path = bundle_file(self.path, Path(SAMPLES_DIR, SAMPLE_FILES[kind]))
        return list(read_jsonl(path, decoder)) if path is not None else []


def load(run_dir: Path) -> Bundle:
    """Open a run directory, checking the manifest and that every file it lists is there."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BundleError(f"{run_dir} is not a directory.")
    manifest = read_manifest(run_dir)
    for name in manifest.files:
        if not listed_file(run_dir, name).exists():
            raise BundleError(f"{run_dir} is incomplete: {name} is listed in the manifest but missing.")
    return Bundle(run_dir, manifest)
