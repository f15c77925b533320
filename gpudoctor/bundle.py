"""The run bundle: the one versioned object that collection writes and analysis reads.

A bundle is a directory:

    manifest.json       schema_version, versions, host, GPUs, argv, window, exit, collectors
    events.jsonl        instrumentation events from inside the script's process (steps, loader, copies, ...)
    samples/*.jsonl     host, process-tree and GPU time series sampled by the parent
    trace.json.gz       the torch.profiler (Kineto) Chrome trace of the profiling window, when one closed

Everything is JSON so a bundle made on one machine analyses on another, weeks later.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.errors import BundleError

SCHEMA_VERSION = 1

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
TRACE = "trace.json.gz"
SAMPLES_DIR = "samples"
SAMPLE_FILES = {"host": "host.jsonl", "procs": "procs.jsonl", "gpu": "gpu.jsonl"}
FINDINGS = "findings.json"
REPORT = "report.html"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader never sees half a file: write beside it, then rename over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class JsonlWriter:
    """Appends one JSON object per line and flushes each, so a crash loses at most the line being written."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the records of a JSONL file; a last line cut short by a crash is skipped, any other bad line is an error."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not line.endswith("\n"):
                return  # the writer was killed mid-line
            raise BundleError(f"{path} is corrupt: line {number} is not JSON ({exc.msg}).") from None


def read_manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / MANIFEST
    if not path.is_file():
        raise BundleError(f"{run_dir} is not a gpudoctor run directory: it has no {MANIFEST}.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is corrupt: it is not valid JSON ({exc}).") from None
    if not isinstance(manifest, dict) or "schema_version" not in manifest:
        raise BundleError(f"{path} is not a gpudoctor manifest: it has no schema_version.")
    version = manifest["schema_version"]
    if version != SCHEMA_VERSION:
        raise BundleError(
            f"{run_dir} was written with bundle schema version {version}; this gpudoctor reads version "
            f"{SCHEMA_VERSION}. Re-run `gpudoctor profile` or use a gpudoctor that matches."
        )
    return manifest


def read_trace(path: Path) -> dict[str, Any]:
    """Load a Chrome trace (.json or .json.gz) and check it is one; raise BundleError saying what is wrong."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (EOFError, OSError, zlib.error) as exc:
        raise BundleError(f"{path} is truncated or not gzip: {exc}.") from None
    try:
        trace = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not a complete JSON trace ({exc.msg} at byte {exc.pos}).") from None
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise BundleError(f"{path} is JSON but not a Chrome trace: it has no traceEvents list.")
    return trace


@dataclass(frozen=True)
class Bundle:
    """A validated run bundle on disk. Parsing into views is gpudoctor.analysis's job."""

    path: Path
    manifest: dict[str, Any]

    @property
    def trace_path(self) -> Path | None:
        path = self.path / TRACE
        return path if path.is_file() else None

    def events(self) -> Iterator[dict[str, Any]]:
        path = self.path / EVENTS
        return read_jsonl(path) if path.is_file() else iter(())

    def samples(self, kind: str) -> Iterator[dict[str, Any]]:
        path = self.path / SAMPLES_DIR / SAMPLE_FILES[kind]
        return read_jsonl(path) if path.is_file() else iter(())


def load(run_dir: Path) -> Bundle:
    """Open a run directory, checking the manifest and that every file it lists is there."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BundleError(f"{run_dir} is not a directory.")
    manifest = read_manifest(run_dir)
    for name in manifest.get("files", []):
        if not (run_dir / name).exists():
            raise BundleError(f"{run_dir} is incomplete: {name} is listed in the manifest but missing.")
    return Bundle(run_dir, manifest)
