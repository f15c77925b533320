"""Compaction of sample files, so that hours of sampling stay bounded in memory and on disk.

A sample file (samples/host.jsonl, procs.jsonl, gpu.jsonl) grows by one row per sample, ten a second by
default. `compact_file` rewrites it in tiers by age: the samples of the last 10 minutes stay exactly as they
were written; older ones are merged into buckets 1 s wide up to 1 hour old, 10 s wide up to 12 hours old and
60 s wide beyond. Buckets are aligned on the epoch, so files sampled at the same times (host and procs) merge
into rows with the same times. Whatever the run's length, a file holds at most `Policy.max_rows` rows once
compacted: when there would be more, the coarsest buckets double in width, as often as needed.

A merged row has the keys of a raw one, so that readers keep working, plus:

    t0, t     the first and the last sample merged: the values hold at t
    n         how many samples were merged
    lo, hi    the lowest and highest value of each gauge, at the gauge's own path in its row or entry
    counts    how many samples had a gauge, only for the gauges fewer samples had than n (PCIe is read on
              one GPU sample in ten)

Counters (running totals: swap bytes, CPU seconds, context switches, per-thread CPU seconds) keep their value
at the last sample that had them, so a rate between any two rows is the exact mean rate between them. Gauges
(percentages, bytes in use, thread counts, load, clocks, power) keep their mean, rounded to three decimals; a
gauge that did not change keeps its exact value. Per-process and per-GPU entries are matched by pid and GPU
index; an entry that fewer samples had than its row has its own n. A key no sample had stays absent: unknown
is never written as zero. Merging merged rows again gives the row that merging their samples would give
(means weighted by n, lo of the lo, hi of the hi, counters last), but for the rounding of means. Ten samples of
host.jsonl and procs.jsonl, where a worker started three samples before the end:

    {"t":1700003601.9,"t0":1700003601.0,"n":10,"cpu_pct":[51.5,28.5],"load":[1.483,1.5,1.25],
     "mem_total":16000000000,"mem_available":8525500000.0,"swap_used":12288.0,"swap_in":147533824,
     "swap_out":14749696,"lo":{"cpu_pct":[5.0,6.0],"load":[1.33,1.5,1.25],"mem_total":16000000000,
     "mem_available":8028000000,"swap_used":0},"hi":{"cpu_pct":[98.0,47.0],"load":[1.63,1.5,1.25],
     "mem_total":16000000000,"mem_available":8947000000,"swap_used":24576}}
    {"t":1700001234.7,"t0":1700001233.8,"n":10,"procs":[
     {"pid":100,"ppid":1,"name":"python","cpu_s":987.76,"rss":2042500000.0,"threads":11.1,"ctx_vol":37041,
      "ctx_invol":3086,"thread_cpu":{"100":617.35,"101":123.47},
      "lo":{"rss":2038000000,"threads":10},"hi":{"rss":2047000000,"threads":12}},
     {"pid":200,"ppid":100,"name":"pt_data_worker","cpu_s":0.16,"rss":300004000.0,"threads":11.0,"ctx_vol":6,
      "ctx_invol":0,"thread_cpu":{"200":0.1,"201":0.02},"n":3,
      "lo":{"rss":300003000,"threads":10},"hi":{"rss":300005000,"threads":12}}]}

`lowest(row_or_entry, key)` and `highest(row_or_entry, key)` read the extremes of raw and merged rows alike.

Bounds. At 10 Hz and the defaults a file holds 6,000 raw rows (10 min), 3,000 rows of 1 s, 3,960 of 10 s and
60 more an hour beyond 12 hours: 13,680 rows after a day. From about 5 days on, the cap of 20,000 rows
doubles the coarsest width. Between two compactions rows are appended (3,000 when the samplers compact every 5 minutes).
Measured bytes per row, raw / merged: host 0.29 / 0.79 kB on 16 cores (0.84 / 2.6 kB on 128); gpu 0.11 /
0.47 kB per GPU; procs 0.2 / 0.3 kB per process plus ~16 B per thread. So, with at most 14,000 merged and
6,600 raw rows, host.jsonl stays under ~13 MB on 16 cores (~42 MB on 128), gpu.jsonl under ~7.5 MB per GPU,
and procs.jsonl under ~5.5 MB per process plus ~0.35 MB per thread (8 processes of 30 threads: ~125 MB).
Compacting streams the file: memory holds a time and a bucket number per row, and one bucket's rows.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from gpudoctor import intervals
from gpudoctor.errors import BundleError

try:  # several times faster than the json module
    import orjson

    _fast_loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _fast_loads = json.loads

MEAN_DECIMALS = 3
_MERGE_KEYS = frozenset({"t", "t0", "n", "lo", "hi", "counts"})


# -- what each sample file holds --------------------------------------------------------------------------
@dataclass(frozen=True)
class SampleKind:
    entries: str | None = None  # the key of the per-process or per-GPU list in each row
    entry_id: str | None = None  # what matches an entry across rows
    counters: frozenset[str] = frozenset()  # running totals: their last value is kept
    labels: frozenset[str] = frozenset()  # identities (pid, parent, name): their last value is kept

    @cached_property
    def not_gauges(self) -> frozenset[str]:
        return self.counters | self.labels


KINDS: dict[str, SampleKind] = {
    "host": SampleKind(counters=frozenset({"swap_in", "swap_out"})),
    "procs": SampleKind(entries="procs", entry_id="pid",
                        counters=frozenset({"cpu_s", "ctx_vol", "ctx_invol", "thread_cpu"}),
                        labels=frozenset({"pid", "ppid", "name"})),
    "gpu": SampleKind(entries="gpus", entry_id="gpu", labels=frozenset({"gpu"})),
}


def _kind(name: str) -> SampleKind:
    if name not in KINDS:
        raise ValueError(f"unknown sample kind {name!r}: one of {', '.join(KINDS)}")
    return KINDS[name]


# -- reading extremes --------------------------------------------------------------------------------------
def lowest(row: dict[str, Any], key: str) -> Any:
    """The lowest value a gauge took over the samples behind a row or entry, raw or merged."""
    return row.get("lo", {}).get(key, row.get(key))


def highest(row: dict[str, Any], key: str) -> Any:
    """The highest value a gauge took over the samples behind a row or entry, raw or merged."""
    return row.get("hi", {}).get(key, row.get(key))


# -- merging rows --------------------------------------------------------------------------------------------
def merge_records(records: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    """One row for consecutive rows (raw or merged) of a sample file of `kind`; a single row is returned as it is."""
    if not records:
        raise ValueError("nothing to merge")
    if len(records) == 1:
        return records[0]
    bucket = _Bucket(_kind(kind))
    for record in records:
        bucket.absorb(record)
    return bucket.emit()


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)  # not bool


def _is_numbers(value: Any) -> bool:
    return type(value) is list and bool(value) and all(type(v) in (int, float) for v in value)


class _Scalar:
    """Sum, count and extremes of a gauge with one number."""

    def __init__(self, mean: float, count: int, lo: float, hi: float) -> None:
        self.total, self.count, self.lo, self.hi = mean * count, count, lo, hi

    @staticmethod
    def fits(value: Any) -> bool:
        return _is_number(value)

    def add(self, mean: float, count: int, lo: float, hi: float) -> None:
        self.total += mean * count
        self.count += count
        self.lo = min(self.lo, lo)
        self.hi = max(self.hi, hi)

    def mean(self) -> Any:
        return _mean(self.total, self.count, self.lo, self.hi)


class _Series:
    """Sum, count and extremes of a gauge with one number per position (per core, per averaging period)."""

    def __init__(self, mean: list[float], count: int, lo: list[float], hi: list[float]) -> None:
        self.total, self.count, self.lo, self.hi = [m * count for m in mean], count, list(lo), list(hi)

    def fits(self, value: Any) -> bool:
        return _is_numbers(value) and len(value) == len(self.total)

    def add(self, mean: list[float], count: int, lo: list[float], hi: list[float]) -> None:
        self.total = [a + m * count for a, m in zip(self.total, mean)]
        self.count += count
        self.lo = [min(a, b) for a, b in zip(self.lo, lo)]
        self.hi = [max(a, b) for a, b in zip(self.hi, hi)]

    def mean(self) -> list[Any]:
        return [_mean(total, self.count, lo, hi) for total, lo, hi in zip(self.total, self.lo, self.hi)]


def _mean(total: float, count: int, lo: Any, hi: Any) -> Any:
    if lo == hi:  # a constant keeps its exact value and type
        return lo
    return min(max(round(total / count, MEAN_DECIMALS), lo), hi)


_NONE: dict[str, Any] = {}


class _Fields:
    """The fields of one row, or of one process or GPU entry, merged over the samples that had them."""

    def __init__(self) -> None:
        self.n = 0
        self.order: dict[str, None] = {}
        self.gauges: dict[str, _Scalar | _Series] = {}
        self.last: dict[str, Any] = {}

    def absorb(self, data: dict[str, Any], n: int, kind: SampleKind) -> None:
        self.n += n
        lo, hi, counts = data.get("lo") or _NONE, data.get("hi") or _NONE, data.get("counts") or _NONE
        skip = kind.not_gauges
        for key, value in data.items():
            if key in _MERGE_KEYS or key == kind.entries:
                continue
            self.order[key] = None
            gauge = None if key in skip else self.gauges.get(key)
            if gauge is not None and gauge.fits(value):
                gauge.add(value, counts.get(key, n), lo.get(key, value), hi.get(key, value))
            elif key not in skip and (_is_number(value) or _is_numbers(value)):
                # New, or its shape changed (cores went on or off line): the newer values win.
                gauge_type = _Scalar if _is_number(value) else _Series
                self.gauges[key] = gauge_type(value, counts.get(key, n), lo.get(key, value), hi.get(key, value))
            else:
                self._keep_last(key, value)

    def _keep_last(self, key: str, value: Any) -> None:
        before = self.last.get(key)
        # Per-thread CPU seconds: a thread that ended within the bucket keeps its final total.
        self.last[key] = {**before, **value} if isinstance(before, dict) and isinstance(value, dict) else value

    def values(self) -> dict[str, Any]:
        return {key: self.gauges[key].mean() if key in self.gauges else self.last[key] for key in self.order}

    def extremes(self, row_n: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.n != row_n:
            out["n"] = self.n
        if self.gauges:
            out["lo"] = {key: gauge.lo for key, gauge in self.gauges.items()}
            out["hi"] = {key: gauge.hi for key, gauge in self.gauges.items()}
        counts = {key: gauge.count for key, gauge in self.gauges.items() if gauge.count != self.n}
        if counts:
            out["counts"] = counts
        return out


class _Bucket:
    def __init__(self, kind: SampleKind) -> None:
        self.kind = kind
        self.t0: Any = None
        self.t: Any = None
        self.n = 0
        self.fields = _Fields()
        self.entries: dict[Any, _Fields] | None = None

    def absorb(self, record: dict[str, Any]) -> None:
        n = record.get("n", 1)
        if self.t0 is None:
            self.t0 = record.get("t0", record.get("t"))
        self.t = record.get("t")
        self.n += n
        self.fields.absorb(record, n, self.kind)
        if self.kind.entries is not None and self.kind.entries in record:
            self._absorb_entries(record[self.kind.entries] or [], n)

    def _absorb_entries(self, entries: list[dict[str, Any]], row_n: int) -> None:
        if self.entries is None:
            self.entries = {}
        for entry in entries:
            merged = self.entries.setdefault(entry.get(self.kind.entry_id), _Fields())
            merged.absorb(entry, entry.get("n", row_n), self.kind)

    def emit(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": self.t, "t0": self.t0, "n": self.n, **self.fields.values()}
        if self.entries is not None:
            row[self.kind.entries] = [{**e.values(), **e.extremes(self.n)} for e in self.entries.values()]
        row.update(self.fields.extremes(self.n))
        return row


# -- planning the buckets ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tier:
    """Samples at least `from_age_s` old merge into buckets `width_s` wide (aligned on the epoch)."""

    width_s: float
    from_age_s: float


def _divides(finer: float, coarser: float) -> bool:
    ratio = coarser / finer
    return ratio >= 1 and abs(ratio - round(ratio)) < 1e-9


@dataclass(frozen=True)
class Policy:
    """Tiers from the finest to the coarsest; samples younger than the first tier's age stay raw."""

    tiers: tuple[Tier, ...] = (Tier(1.0, 600.0), Tier(10.0, 3600.0), Tier(60.0, 12 * 3600.0))
    max_rows: int = 20_000

    def __post_init__(self) -> None:
        if not self.tiers or self.max_rows < 1:
            raise ValueError("a policy needs at least one tier and max_rows >= 1")
        for finer, coarser in zip(self.tiers, self.tiers[1:]):
            if coarser.from_age_s <= finer.from_age_s or not _divides(finer.width_s, coarser.width_s):
                raise ValueError("tiers must grow older, each width a whole multiple of the previous one "
                                 "(so that buckets nest)")
        if self.tiers[0].width_s <= 0 or self.tiers[0].from_age_s < 0:
            raise ValueError("widths must be positive and ages not negative")

    @property
    def full_resolution_s(self) -> float:
        return self.tiers[0].from_age_s


DEFAULT_POLICY = Policy()


BucketKey = tuple[int, int]  # (tier, bucket number at that tier's width)


@dataclass(frozen=True)
class Plan:
    widths: tuple[float, ...]  # each tier's bucket width, the coarsest doubled where the row cap asked for it
    keys: list[BucketKey | None]  # per row: the bucket it merges into, None to stay as it is
    rows: int  # rows once compacted


def plan(times: Sequence[float | None], now: float, policy: Policy = DEFAULT_POLICY,
         keep: Sequence[tuple[float, float]] = ()) -> Plan:
    """Where each row (given by its time `t`) goes; consecutive rows with the same key merge into one.

    Rows inside a `keep` span (the profiling windows, whose steps the rules analyse) stay as they are.

    A row's tier is the coarsest whose whole bucket around it is old enough, so that a bucket is merged all at
    once, never in part. Over `policy.max_rows`, the buckets of the coarsest tier double in width, as often as
    needed; a doubled bucket may be merged in parts, which later compactions merge together. The finer tiers
    hold a bounded number of rows (12,960 at the defaults and 10 Hz), so the cap holds up to about 20 samples a
    second; above, the plan with the fewest rows is taken.
    """
    kept = _KeptSpans(keep)
    tiers = [None if kept.holds(t) else _tier_of(t, now, policy.tiers) for t in times]
    widths = [tier.width_s for tier in policy.tiers]
    layout = _layout(times, tiers, widths)
    best, coarsest = layout, len(widths) - 1
    doublings = _fewest_doublings(layout, policy.max_rows)
    while layout.rows > policy.max_rows and _groups_in_tier(layout.keys, coarsest) > 1:
        widths[coarsest] = policy.tiers[coarsest].width_s * 2 ** doublings
        layout = _layout(times, tiers, widths)
        best = min(best, layout, key=lambda candidate: candidate.rows)
        doublings += 1
    return layout if layout.rows <= policy.max_rows else best


class _KeptSpans:
    """Spans whose rows stay raw, merged where they overlap, for a lookup by bisection."""

    def __init__(self, spans: Sequence[tuple[float, float]]) -> None:
        disjoint = intervals.union(spans)
        self._starts = [start for start, _ in disjoint]
        self._ends = [end for _, end in disjoint]

    def holds(self, t: float | None) -> bool:
        """Whether t lies in a span, its ends included."""
        if not self._starts or not _is_number(t):
            return False
        index = bisect_right(self._starts, t) - 1
        return index >= 0 and t <= self._ends[index]


def _tier_of(t: float | None, now: float, tiers: Sequence[Tier]) -> int | None:
    """The coarsest tier whose whole bucket around t is old enough for it; None: the row stays as it is."""
    if not _is_number(t):
        return None
    for index in range(len(tiers) - 1, -1, -1):
        width = tiers[index].width_s
        if (t // width + 1) * width <= now - tiers[index].from_age_s:
            return index
    return None


def _layout(times: Sequence[float | None], tiers: list[int | None], widths: list[float]) -> Plan:
    keys = [None if tier is None else (tier, int(t // widths[tier])) for t, tier in zip(times, tiers)]
    return Plan(tuple(widths), keys, _count_rows(keys))


def _fewest_doublings(layout: Plan, max_rows: int) -> int:
    """A lower bound on the doublings of the coarsest width that fit the cap, to skip those that cannot:
    a doubling at most halves the coarsest tier's rows, and leaves the other tiers' rows as they are."""
    coarsest_rows = _groups_in_tier(layout.keys, len(layout.widths) - 1)
    room = max_rows - (layout.rows - coarsest_rows)
    doublings = 1
    while room > 0 and coarsest_rows > room * 2 ** doublings:
        doublings += 1
    return doublings


def _count_rows(keys: Iterable[BucketKey | None]) -> int:
    rows, previous = 0, None
    for key in keys:
        if key is None or key != previous:
            rows += 1
        previous = key
    return rows


def _groups_in_tier(keys: Iterable[BucketKey | None], tier: int) -> int:
    return len({key for key in keys if key is not None and key[0] == tier})


# -- compacting a file ---------------------------------------------------------------------------------------
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
    sample_kind = _kind(kind)
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
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            if not text.endswith(b"\n"):  # only the last line can lack its newline
                if not _parses(text):
                    return  # the writer was killed mid-line
                text += b"\n"
            yield number, text


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
        bucket = _Bucket(kind)
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
