"""What a command analyses: a run directory, a trace, a TensorBoard profiler directory's newest trace, or the run
directories of a job of ranks, one per node."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpudoctor.analysis import Run
from gpudoctor.bundle import MANIFEST
from gpudoctor.bundle.confined import inside
from gpudoctor.bundle.layout import is_job_dir
from gpudoctor.errors import BundleError

# What torch.profiler.tensorboard_trace_handler writes: DIR/<worker>.<time>.pt.trace.json(.gz), found in the directory
# itself, in one run below it (torch-tb-profiler reads LOGDIR/RUN/) or in TensorBoard's plugins/profile/RUN/ layout.
PROFILER_TRACE_GLOBS = tuple(f"{where}*.pt.trace.{ext}" for where in ("", "*/", "plugins/profile/*/")
                             for ext in ("json", "json.gz"))


def is_job(paths: Sequence[Path]) -> bool:
    """Whether `paths` are a job of ranks: several run directories (one per node), or one that holds rank bundles
    and none of its own. The one place the commands choose between a run and a job."""
    return len(paths) > 1 or is_job_dir(paths[0])


def profiler_traces(directory: Path) -> list[Path]:
    """The profiler traces of a TensorBoard profiler directory, oldest first (none that leads out of it by a link)."""
    found = {path for pattern in PROFILER_TRACE_GLOBS for path in directory.glob(pattern)
             if path.is_file() and inside(directory, path)}
    return sorted(found, key=lambda path: (path.stat().st_mtime, path.name))


def analysis_inputs(paths: Sequence[Path]) -> tuple[list[Path], str | None]:
    """What `analyze PATH...` reads: the paths, or, for a TensorBoard profiler directory, its newest trace and a
    sentence saying which."""
    if is_job(paths):
        return list(paths), None
    source, chosen = analysis_input(paths[0])
    return [source], chosen


def analysis_input(path: Path) -> tuple[Path, str | None]:
    """What `analyze PATH` reads of one path: PATH, or the newest trace of a TensorBoard profiler directory and a
    sentence saying which."""
    if not path.is_dir() or (path / MANIFEST).exists():
        return path, None
    traces = profiler_traces(path)
    if not traces:
        raise BundleError(f"{path} is neither a gpudoctor run directory (it has no {MANIFEST}) nor a TensorBoard "
                          "profiler directory (it holds no *.pt.trace.json traces).")
    chosen = traces[-1]
    name = chosen.relative_to(path)
    if len(traces) == 1:
        return chosen, f"{path} holds one profiler trace; analysing it, {name}."
    return chosen, (f"{path} holds {len(traces)} profiler traces; analysing the newest, {name} "
                    "(use analyze PATH-TO-TRACE for another).")


def open_run(path: Path) -> Run:
    """A run directory, or a Chrome trace (.json / .json.gz) from torch.profiler."""
    return Run.from_bundle(path) if path.is_dir() else Run.from_trace(path)
