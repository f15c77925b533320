"""What a test hands `BundleBuilder` (tuples, dicts, numbers), validated into the bundle's records.

Every dict a test gives goes through `msgspec.convert`, as the file's reader would decode it: a wrong key type
or a negative count is a ValueError where the test gives it, not a corrupt bundle found later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Literal, TypeVar

import msgspec

from gpudoctor.bundle.events import CopyRow, CudaMemory, GilSummary, SyncRow
from gpudoctor.bundle.layout import SAMPLE_FILES
from gpudoctor.bundle.records import Site
from gpudoctor.bundle.samples import GpuRow, HostRow, Merged, ProcsRow
from gpudoctor.testing.spec import DEFAULT_STREAM, EnvSpec

T = TypeVar("T")
Row = TypeVar("Row", CopyRow, SyncRow)

GIL_PROBE_INTERVAL_S = 0.005  # a step's GIL samples, when a test gives only the mean delay
COPY_DEFAULTS: dict[str, object] = {
    "direction": "h2d", "pinned": False, "non_blocking": False, "bytes": 4 * 1024 * 1024, "host_s": 0.001, "count": 1,
}
SYNC_DEFAULTS: dict[str, object] = {"kind": "item", "host_s": 0.001, "count": 1}
SAMPLE_ROWS: dict[str, type[Merged]] = {"host": HostRow, "procs": ProcsRow, "gpu": GpuRow}
OP_NAMES = {"kernel": "void at::native::vectorized_elementwise_kernel",
            "memcpy": "Memcpy HtoD (Pageable -> Device)", "memset": "Memset (Device)"}


class OpSpec(msgspec.Struct, kw_only=True):
    """One op of kernels(): in step `step`, `at` seconds from its start, or at `start` (seconds since the epoch)."""

    step: int | None = None
    at: float = 0.0
    start: float | None = None
    dur: float
    name: str | None = None
    kind: Literal["kernel", "memcpy", "memset"] = "kernel"
    device: int = 0
    stream: int = DEFAULT_STREAM
    bytes: int | None = None
    warps_per_sm: float | None = None  # a kernel's resident warps per SM (CUPTI's "warps per SM")


def convert(data: object, kind: type[T], what: str) -> T:
    """`data` as a `kind`, validated; a ValueError naming `what` when it is not one."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{what}: {exc}") from None


def to_site(site: object) -> Site | None:
    """A call site given as a (file, line, function) tuple, a dict with the same keys, or None."""
    if site is None or isinstance(site, Site):
        return site
    if isinstance(site, (tuple, list)):
        site = dict(zip(("file", "line", "function"), site))
    return convert(site, Site, f"call site {site!r}")


def copy_row(fields: Mapping[str, object]) -> CopyRow:
    """A copy row from copy()'s keys (see its defaults); max_s defaults to the mean copy."""
    direction = fields.get("direction", "h2d")
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction must be h2d or d2h, not {direction!r}")
    return _call_site_row(CopyRow, COPY_DEFAULTS, fields, "copy")


def sync_row(fields: Mapping[str, object]) -> SyncRow:
    """A sync row from sync()'s keys (see its defaults); max_s defaults to the mean call."""
    return _call_site_row(SyncRow, SYNC_DEFAULTS, fields, "sync")


def _call_site_row(kind: type[Row], defaults: Mapping[str, object], fields: Mapping[str, object], what: str) -> Row:
    given = {**defaults, **fields}
    site = to_site(given.pop("site", None))
    if given.get("max_s") is None:
        given.pop("max_s", None)
    row = convert(given, kind, f"{what} row {dict(fields)!r}")
    max_s = row.max_s if "max_s" in given else row.host_s / max(row.count, 1)
    return msgspec.structs.replace(row, max_s=max_s, site=site)


def gil_summary(gil: float | Mapping[str, object] | None, wall_s: float) -> GilSummary | None:
    """The GIL probe over one step: its mean delay alone (one sample per probe interval), or its summary."""
    if gil is None:
        return None
    if isinstance(gil, Mapping):
        p95 = gil.get("p95_s", gil.get("mean_s"))
        defaults = {"samples": 10} if p95 is None else {"samples": 10, "p95_s": p95, "max_s": p95}
        return convert({**defaults, **gil}, GilSummary, "gil")
    mean = float(gil)
    return GilSummary(samples=max(1, int(wall_s / GIL_PROBE_INTERVAL_S)), mean_s=mean, p95_s=mean, max_s=mean)


def cuda_memory(given: Mapping[str, int] | None) -> CudaMemory | None:
    return convert(given, CudaMemory, "cuda_memory") if given else None


def with_env(env: EnvSpec, facts: Mapping[str, object]) -> EnvSpec:
    """`env` with env()'s facts, each validated as its field (gpus become `GpuInfo`s, cuda_device a `CudaDevice`)."""
    known = [f.name for f in fields(EnvSpec)]
    unknown = set(facts) - set(known)
    if unknown:
        raise TypeError(f"unknown env fact(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    current = {name: getattr(env, name) for name in known}
    return convert({**current, **facts}, EnvSpec, "env()")


def sample_rows(kind: str, rows: Iterable[Mapping[str, object]]) -> list[Merged]:
    """Raw rows of samples/<kind>.jsonl as their records (`HostRow`, `ProcsRow` or `GpuRow`)."""
    if kind not in SAMPLE_FILES:
        raise ValueError(f"kind must be one of {', '.join(SAMPLE_FILES)}, not {kind!r}")
    return [convert(row, SAMPLE_ROWS[kind], f"sample_rows({kind!r}) row {i}") for i, row in enumerate(rows)]


def op_spec(op: Mapping[str, object] | tuple[object, ...]) -> OpSpec:
    """One op of kernels(): a dict, or a tuple (step, at, dur[, name])."""
    given = dict(zip(("step", "at", "dur", "name"), op)) if isinstance(op, tuple) else dict(op)
    kind = given.get("kind", "kernel")
    if kind not in OP_NAMES:
        raise ValueError(f"kind must be kernel, memcpy or memset, not {kind!r}")
    return convert(given, OpSpec, f"op {op!r}")
