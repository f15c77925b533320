"""GPU ops (kernels, memcpys, memsets) as a trace gives them: `GpuOp`, one of them, and `GpuOps`, many of them held
as columns, which is how a trace's are kept (a GpuOp object each would take 3.5 times the memory)."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import astuple, dataclass
from itertools import accumulate, compress, count, islice, pairwise
from operator import eq, gt, sub
from typing import Any, overload

GPU_KINDS = ("kernel", "memcpy", "memset")
_SORT_BLOCK = 1 << 13
INT64 = 1 << 63
NO_ID = -INT64  # in the column of correlation ids: None, or an id kept aside (one that is not a 64-bit int)
NO_WARPS = float("nan")  # in the column of warps per SM: the trace gives none


@dataclass(frozen=True, slots=True)
class GpuOp:
    """One kernel, memcpy or memset on a GPU stream, from the trace (times in seconds since the epoch)."""

    kind: str  # kernel | memcpy | memset
    name: str
    start: float
    end: float
    device: int
    stream: int
    bytes: int | None
    correlation: int | None
    # A kernel's resident warps per SM, as CUPTI reports it ("warps per SM"): how much of the GPU its blocks
    # occupy. None for copies, memsets and traces without it.
    warps_per_sm: float | None = None

    @property
    def dur(self) -> float:
        return self.end - self.start


class _Columns:
    """The fields of GPU ops, a column each: about 54 bytes an op, where a GpuOp with its floats and its correlation
    id takes 180. A correlation id that is not a 64-bit int is NO_ID in its column, and kept aside in `odd` unless
    it is None."""

    __slots__ = ("_durations", "bytes", "correlations", "devices", "ends", "kinds", "name_ids", "names", "odd",
                 "starts", "streams", "warps")

    def __init__(self) -> None:
        self.kinds, self.name_ids, self.names = bytearray(), array("I"), list[Any]()  # kinds: GPU_KINDS' indices
        self.starts, self.ends = array("d"), array("d")
        self.devices, self.streams, self.bytes = list[int](), list[int](), list[Any]()
        self.correlations, self.odd = array("q"), dict[int, Any]()
        self.warps = array("f")  # warps per SM (single precision: 4 bytes an op); NaN where the trace gives none
        self._durations: array[float] | None = None

    def durations(self) -> array[float]:
        """Each op's `dur` (end - start), computed once the ops are all in."""
        if self._durations is None or len(self._durations) != len(self.starts):
            self._durations = array_of("d", map(sub, self.ends, self.starts))
        return self._durations

    def add(self, kind: int, name_id: int, start: float, end: float, device: int, stream: int, size: Any,
            correlation: Any, warps: float | None = None) -> None:
        self.kinds.append(kind)
        self.name_ids.append(name_id)
        self.starts.append(start)
        self.ends.append(end)
        self.devices.append(device)
        self.streams.append(stream)
        self.bytes.append(size)
        self.add_correlation(correlation)
        self.warps.append(NO_WARPS if warps is None else warps)

    def add_correlation(self, correlation: Any) -> None:
        if type(correlation) is int and NO_ID < correlation < INT64:
            self.correlations.append(correlation)
            return
        if correlation is not None:
            self.odd[len(self.correlations)] = correlation
        self.correlations.append(NO_ID)

    def op(self, i: int) -> GpuOp:
        correlation: Any = self.correlations[i]
        if correlation == NO_ID:
            correlation = self.odd.get(i)
        warps = self.warps[i]
        return GpuOp(GPU_KINDS[self.kinds[i]], self.names[self.name_ids[i]], self.starts[i], self.ends[i],
                     self.devices[i], self.streams[i], self.bytes[i], correlation, None if warps != warps else warps)

    def sort(self) -> None:
        """Every column in the order of the starts (a stable sort). A trace's ops are nearly in that order (the ops
        of a stream, then those of another), so the rows move a run of consecutive ones at a time."""
        order, self._durations = self._order(), None
        if order is None:
            return
        breaks = list(compress(count(1), map((1).__ne__, map(sub, islice(order, 1, None), order))))
        runs = [(order[a], order[a] + b - a) for a, b in pairwise((0, *breaks, len(order)))]
        for name in ("kinds", "name_ids", "starts", "ends", "devices", "streams", "bytes", "correlations", "warps"):
            column = getattr(self, name)
            if len(runs) > len(order) // 8:  # far from in order: row by row
                moved = _gather(column, order)
            else:
                moved = column[:0]
                for a, b in runs:
                    moved += column[a:b]
            setattr(self, name, moved)
        if self.odd:
            self.odd = {new: self.odd[old] for new, old in enumerate(order) if old in self.odd}

    def _order(self) -> array[int] | None:
        """The rows in the order of their starts (a stable sort), or None when they are in that order already.

        The rows are sorted a block at a time, with the suffix minima of the starts saying which of them no later
        row can precede: few wait for the next block, and the sort costs a few MB where sorting all at once takes
        70 bytes an op."""
        starts = self.starts
        if not any(map(gt, starts, islice(starts, 1, None))):
            return None
        blocks = range(0, len(starts), _SORT_BLOCK)
        least = [min(starts[first:first + _SORT_BLOCK]) for first in blocks]
        later = list(accumulate(reversed(least), min))[::-1]  # later[k]: the least start of blocks k, k + 1, ...
        order, waiting, key = array("I"), list[int](), starts.__getitem__
        for k, first in enumerate(blocks):
            waiting.extend(range(first, min(len(starts), first + _SORT_BLOCK)))
            waiting.sort(key=key)  # stable: by start, then by row (those waiting precede the block's)
            done = bisect_right(waiting, later[k + 1], key=key) if k + 1 < len(later) else len(waiting)
            order.extend(waiting[:done])
            del waiting[:done]
        return order


def _gather(column: Sequence[Any], rows: Iterable[int]) -> Any:
    """The values of a column at `rows`, in a container of the column's type (an array of floats stays one)."""
    values = list(map(column.__getitem__, rows))
    return array_of(column.typecode, values) if isinstance(column, array) else type(column)(values)  # type: ignore[call-arg]


def array_of(typecode: str, values: Iterable[Any]) -> array[Any]:
    """array(typecode, values), made from a list: array.fromlist takes a twentieth of a µs a value, the array
    constructor fed by an iterator twice that."""
    made = array(typecode)
    made.fromlist(values if isinstance(values, list) else list(values))
    return made


class GpuOps(Sequence[GpuOp]):
    """GPU ops held as columns (`_Columns`): a GpuOp is made each time one is read. `rows` picks and orders the
    columns' rows (None: all of them, in order), so that a subset (the kernels, those of a step) costs 4 bytes an
    op and shares the columns."""

    __slots__ = ("columns", "rows")

    def __init__(self, columns: _Columns | None = None, rows: Sequence[int] | None = None) -> None:
        self.columns = _Columns() if columns is None else columns
        self.rows = rows

    @classmethod
    def of(cls, ops: Iterable[GpuOp]) -> GpuOps:
        """GpuOps holding `ops`, in their order."""
        table, ids = cls(), dict[Any, int]()
        for op in ops:
            table.columns.add(GPU_KINDS.index(op.kind), ids.setdefault(op.name, len(ids)), op.start, op.end,
                              op.device, op.stream, op.bytes, op.correlation, op.warps_per_sm)
        table.columns.names = list(ids)
        return table

    def row_ids(self) -> Sequence[int]:
        return range(len(self.columns.starts)) if self.rows is None else self.rows

    def select(self, rows: Iterable[int]) -> GpuOps:
        """The ops at `rows`, indices into `row_ids()`, in that order."""
        return GpuOps(self.columns, array_of("I", rows if self.rows is None else map(self.rows.__getitem__, rows)))

    def _column(self, column: Sequence[Any]) -> Sequence[Any]:
        """The values of a column at `rows`, in a container of the column's type (an array of floats stays one)."""
        return column if self.rows is None else _gather(column, self.rows)

    def starts(self) -> Sequence[float]:
        return self._column(self.columns.starts)

    def ends(self) -> Sequence[float]:
        return self._column(self.columns.ends)

    def devices(self) -> Sequence[int]:
        return self._column(self.columns.devices)

    def kinds(self) -> Sequence[int]:
        """Each op's kind, as an index into GPU_KINDS."""
        return self._column(self.columns.kinds)

    def name_ids(self) -> Sequence[int]:
        """Each op's name, as an index into `columns.names` (one for each distinct name)."""
        return self._column(self.columns.name_ids)

    def correlation_ids(self) -> Sequence[int]:
        """Each op's correlation id with the host's call that launched it (NO_ID where the trace gives none)."""
        return self._column(self.columns.correlations)

    def warps_per_sm(self) -> Sequence[float]:
        """Each op's resident warps per SM (a kernel's, from the trace); NaN where the trace gives none."""
        return self._column(self.columns.warps)

    def durations(self) -> array[float]:
        """Each op's `dur`."""
        return self._column(self.columns.durations())  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.row_ids())

    @overload
    def __getitem__(self, index: int) -> GpuOp: ...

    @overload
    def __getitem__(self, index: slice) -> GpuOps: ...

    def __getitem__(self, index: int | slice) -> GpuOp | GpuOps:
        if isinstance(index, slice):
            return GpuOps(self.columns, self.row_ids()[index])
        return self.columns.op(self.row_ids()[index])

    def __iter__(self) -> Iterator[GpuOp]:
        return map(self.columns.op, self.row_ids())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GpuOps | list | tuple):
            return len(self) == len(other) and all(map(eq, self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GpuOps({[astuple(op) for op in self[:3]]}{', ...' if len(self) > 3 else ''}, {len(self)} ops)"
