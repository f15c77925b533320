"""Compaction of sample files, so that hours of sampling stay bounded in memory and on disk.

A sample file (samples/host.jsonl, procs.jsonl, gpu.jsonl) grows by one row per sample, ten a second by
default. `compact_file` rewrites it in tiers by age (bundle.tiers: the last 10 minutes stay exactly as they
were written; older samples merge into buckets 1 s, 10 s and 60 s wide as they age, at most `Policy.max_rows`
rows a file), each bucket's samples merged into one row that keeps their extremes and counters
(bundle.buckets, which describes merged rows; `lowest` and `highest` read them).

Bounds on disk, for the rows that bundle.tiers bounds. Measured bytes per row, raw / merged: host 0.29 / 0.79 kB
on 16 cores (0.84 / 2.6 kB on 128); gpu 0.11 / 0.47 kB per GPU; procs 0.2 / 0.3 kB per process plus ~16 B per
thread. So, with at most 14,000 merged and 6,600 raw rows, host.jsonl stays under ~13 MB on 16 cores (~42 MB
on 128), gpu.jsonl under ~7.5 MB per GPU, and procs.jsonl under ~5.5 MB per process plus ~0.35 MB per thread
(8 processes of 30 threads: ~125 MB).
Compacting streams the file: memory holds a time and a bucket number per row, and one bucket's rows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.bundle.buckets import Bucket, SampleKind, kind_of
from gpudoctor.bundle.tiers import DEFAULT_POLICY, BucketKey, Policy, plan
from gpudoctor.errors import BundleError

try:  # several times faster than the json module
    import orjson

    _fast_loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _fast_loads = json.loads


@dataclass(frozen=True)
class CompactStats:
    rows_before: int
    rows_after: int
    bytes_before: int
    bytes_after: int
    rewritten: bool  # False when nothing was to merge: the file was left as it was
    widths: tuple[float, ...]


def compact_file(path: Path | str, kind: str, now: float, policy: Policy = DEFAULT_POLICY,
                 keep: Sequence[tuple[float, float]] = ()) -> CompactStats:
    """Compact the sample file at `path` in place, as of time `now` (seconds since the epoch); rows inside a
    `keep` span stay as they are.

    The file is read twice, as a stream: once for the rows' times, to plan the buckets, then to write the
    compacted rows beside it, which are renamed over it. So memory holds one number per row and one bucket's
    rows, and a crash at any moment leaves either file whole. Rows not merged keep their exact text.

    Nothing may append to the file meanwhile, and a writer open on it must be reopened afterwards when
    `rewritten` (it would go on appending to the replaced file). A last line cut short by a crash is dropped;
    any other bad line raises BundleError and leaves the file as it was. Give files sampled together (host and
    procs) the same `now`, so that their rows keep the same times.
    """
    path = Path(path)
    sample_kind = kind_of(kind)
    bytes_before = path.stat().st_size
    times = _times(path)
    layout = plan(times, now, policy, keep)
    groups = _groups(layout.keys)
    if len(groups) == len(times) and _ends_with_newline(path, bytes_before):
        return CompactStats(len(times), len(times), bytes_before, bytes_before, False, layout.widths)
    _write_atomically(path, _compacted_lines(path, groups, sample_kind))
    return CompactStats(len(times), len(groups), bytes_before, path.stat().st_size, True, layout.widths)


def _row_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, text) of each row, newline included; a last line cut short is left out, as
    bundle.read_jsonl does."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if line.endswith(b"\n"):
                yield number, line
            elif _parses(line):  # only the last line can lack its newline
                yield number, line + b"\n"
            else:
                return  # the writer was killed mid-line


def _loads(text: bytes) -> Any:
    try:
        return _fast_loads(text)
    except ValueError:  # NaN, or an integer past 64 bits: only the json module reads those
        return json.loads(text)


def _parses(text: bytes) -> bool:
    try:
        _loads(text)
    except ValueError:
        return False
    return True


def _times(path: Path) -> list[Any]:
    times = []
    for number, text in _row_lines(path):
        try:
            row = _loads(text)
        except ValueError:
            raise BundleError(f"{path} is corrupt: line {number} is not JSON.") from None
        times.append(row.get("t") if isinstance(row, dict) else None)
    return times


def _ends_with_newline(path: Path, size: int) -> bool:
    if size == 0:
        return True
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _groups(keys: list[BucketKey | None]) -> list[int]:
    """The sizes of the runs of consecutive rows with the same bucket."""
    sizes: list[int] = []
    for index, key in enumerate(keys):
        if index and key is not None and key == keys[index - 1]:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def _compacted_lines(path: Path, groups: list[int], kind: SampleKind) -> Iterator[bytes]:
    lines = (text for _, text in _row_lines(path))
    for size in groups:
        if size == 1:
            yield next(lines)
            continue
        bucket = Bucket(kind)
        for _ in range(size):
            bucket.absorb(_loads(next(lines)))
        yield (json.dumps(bucket.emit(), separators=(",", ":"), default=str) + "\n").encode()  # as JsonlWriter


def _write_atomically(path: Path, lines: Iterable[bytes]) -> None:
    tmp = path.with_name(path.name + ".compact.tmp")
    try:
        with open(tmp, "wb") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
