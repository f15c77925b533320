"""Merging rows of a sample file (samples/host.jsonl, procs.jsonl, gpu.jsonl) into one, as compaction does.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13 on; only the type checker reads it

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
    "host": SampleKind(counters=frozenset({"swap_in", "swap_out", "job_cpu", "cpu_pressure_s", "throttled_s"})),
    "procs": SampleKind(entries="procs", entry_id="pid",
                        counters=frozenset({"cpu_s", "ctx_vol", "ctx_invol", "thread_cpu", "run_delay_s",
                                            "thread_run_delay"}),
                        labels=frozenset({"pid", "ppid", "name"})),
    "gpu": SampleKind(entries="gpus", entry_id="gpu", labels=frozenset({"gpu"})),
}


def kind_of(name: str) -> SampleKind:
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
    bucket = Bucket(kind_of(kind))
    for record in records:
        bucket.absorb(record)
    return bucket.emit()


def is_number(value: Any) -> TypeIs[float]:
    return type(value) in (int, float)  # not bool


def _is_numbers(value: Any) -> bool:
    return type(value) is list and bool(value) and all(type(v) in (int, float) for v in value)


class _Scalar:
    """Sum, count and extremes of a gauge with one number."""

    def __init__(self, mean: float, count: int, lo: float, hi: float) -> None:
        self.total, self.count, self.lo, self.hi = mean * count, count, lo, hi

    @staticmethod
    def fits(value: Any) -> bool:
        return is_number(value)

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
            elif key not in skip and (is_number(value) or _is_numbers(value)):
                # New, or its shape changed (cores went on or off line): the newer values win.
                gauge_type = _Scalar if is_number(value) else _Series
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


class Bucket:
    """Consecutive rows of one sample file, absorbed one at a time and emitted as one merged row."""

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
        key, id_key = self.kind.entries, self.kind.entry_id
        if key is not None and id_key is not None and key in record:
            self._absorb_entries(record[key] or [], id_key, n)

    def _absorb_entries(self, entries: list[dict[str, Any]], id_key: str, row_n: int) -> None:
        if self.entries is None:
            self.entries = {}
        for entry in entries:
            merged = self.entries.setdefault(entry.get(id_key), _Fields())
            merged.absorb(entry, entry.get("n", row_n), self.kind)

    def emit(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": self.t, "t0": self.t0, "n": self.n, **self.fields.values()}
        if self.entries is not None and self.kind.entries is not None:
            row[self.kind.entries] = [{**e.values(), **e.extremes(self.n)} for e in self.entries.values()]
        row.update(self.fields.extremes(self.n))
        return row
