"""Where each part of a run bundle lives in its directory.

    manifest.json       schema_version, versions, host, GPUs, argv, window, exit, collectors (`Manifest`)
    events.jsonl        instrumentation events from inside the script's process (`gpudoctor.bundle.events`)
    samples/*.jsonl     host, process-tree and GPU time series sampled by the parent (`gpudoctor.bundle.samples`)
    trace.json.gz       the torch.profiler (Kineto) Chrome trace of the profiling window, when one closed
    trace.N.json.gz     with --every, window N's trace
"""

from __future__ import annotations

import re
from pathlib import Path

from gpudoctor.bundle.confined import inside

SCHEMA_VERSION = 1

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
TRACE = "trace.json.gz"
PARTIAL_TRACE = "trace.partial.json.gz"  # a window's trace while it is written; renamed once whole
RAW_TRACE = "trace.partial.json"  # the profiler's own export, before it is compressed into PARTIAL_TRACE
SAMPLES_DIR = "samples"
SAMPLE_FILES = {"host": "host.jsonl", "procs": "procs.jsonl", "gpu": "gpu.jsonl"}
# Made by the script's process once its atexit handlers have run and only the interpreter's own teardown is left;
# the launcher reads it to tell a process that does not exit from one still at work. Removed once it has exited.
EXITING = "exiting"
# Made by the launcher just before it interrupts the script at --timeout: the script's process then prints no
# KeyboardInterrupt traceback (gpudoctor says in one sentence that it stopped it). Removed once it has exited.
STOPPING = "stopping"
FINDINGS = "findings.json"
REPORT = "report.html"
RANK_DIR = re.compile(r"^rank-(0|[1-9][0-9]{0,5})$")  # a job's rank K has its bundle in RUN/rank-K/


def trace_name(window: int) -> str:
    """The first profiling window's trace is trace.json.gz; a repeated window's is trace.<N>.json.gz."""
    return TRACE if window == 0 else f"trace.{window}.json.gz"


def trace_names(run_dir: Path) -> list[str]:
    """The window traces in a run directory, in window order (trace.partial.json.gz, being written, is not one)."""
    windows = [0] if (run_dir / TRACE).is_file() and inside(run_dir, run_dir / TRACE) else []
    for path in run_dir.glob("trace.*.json.gz"):
        number = path.name[len("trace."):-len(".json.gz")]
        if number.isdigit() and inside(run_dir, path):
            windows.append(int(number))
    return [trace_name(w) for w in sorted(windows)]


def sample_file(run_dir: Path, kind: str) -> Path:
    """samples/host.jsonl, samples/procs.jsonl or samples/gpu.jsonl."""
    return run_dir / SAMPLES_DIR / SAMPLE_FILES[kind]


def rank_dirs(directory: Path, with_manifest: bool = True) -> dict[int, Path]:
    """The rank bundles directly in `directory` (rank -> its bundle), by rank; `with_manifest=False` also gives
    the rank directories of a run that wrote no manifest (yet). A rank-K/ that is a link out of `directory` is not one
    of its bundles (`ranks_linked_out` names them)."""
    found = {}
    for child in directory.iterdir() if directory.is_dir() else ():
        match = RANK_DIR.match(child.name)
        if (match and child.is_dir() and inside(directory, child)
                and (not with_manifest or (child / MANIFEST).is_file())):
            found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def ranks_linked_out(directory: Path) -> list[Path]:
    """The rank-K/ entries of `directory` that are links to somewhere outside it: never read as its ranks."""
    entries = directory.iterdir() if directory.is_dir() else ()
    return sorted(child for child in entries if RANK_DIR.match(child.name) and not inside(directory, child))


def is_job_dir(path: Path) -> bool:
    """A job's run directory: rank bundles in it, and no bundle of its own."""
    return path.is_dir() and not (path / MANIFEST).exists() and bool(rank_dirs(path))
