"""A torch.profiler (Kineto) Chrome trace read whole (`read_trace`), and the bounds on what any trace may inflate to
(the chunked reader, gpudoctor.bundle.trace_stream, keeps to them too)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

from gpudoctor.errors import BundleError

# A profiler trace compresses 13 to 19 times with gzip (every trace in fixtures/): one that inflates to more
# than MAX_INFLATION times its size, or past MAX_TRACE_BYTES, is not a trace (a gzip bomb, or padding).
MAX_INFLATION = 200
MIN_INFLATED_CAP = 64 << 20  # a small file may inflate further: never refuse one under this
MAX_TRACE_BYTES = 64 << 30


def json_size(path: Path) -> int:
    """The size of a trace as JSON: the file's, or for .gz what its gzip trailer says (mod 4 GiB)."""
    size = path.stat().st_size
    if path.suffix != ".gz" or size < 18:
        return size
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


# Compressing in 1 MB blocks at level 6 took 0.03 s for a 7 MB trace on a 2-core VM; torch's own .gz export
# (level 9, one write per line) took 0.41 s for it, with the script standing still. Level 9 saves 11% of the size.
GZIP_LEVEL = 6
GZIP_BLOCK = 1 << 20


def gzip_file(source: Path, target: Path) -> None:
    """Compress `source` into `target` (gzip), in blocks."""
    with open(source, "rb") as plain, gzip.open(target, "wb", compresslevel=GZIP_LEVEL) as packed:
        shutil.copyfileobj(plain, packed, GZIP_BLOCK)


def inflated_cap(path: Path) -> int:
    """How many bytes of JSON the trace at `path` may hold once inflated."""
    size = path.stat().st_size
    if path.suffix != ".gz":
        return MAX_TRACE_BYTES
    return min(MAX_TRACE_BYTES, max(MIN_INFLATED_CAP, MAX_INFLATION * size))


def too_big(path: Path, cap: int) -> BundleError:
    return BundleError(f"{path} inflates to more than {cap / 1e6:,.0f} MB of JSON, {MAX_INFLATION} times its "
                       "size or more: it is not a profiler trace (a gzip bomb, or padded).")


def read_trace(path: Path) -> dict[str, Any]:
    """Load a Chrome trace (.json or .json.gz) and check it is one; raise BundleError saying what is wrong."""
    cap = inflated_cap(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read(cap + 1)
        else:
            raw = path.read_bytes()
    except (EOFError, OSError, zlib.error) as exc:
        raise BundleError(f"{path} is truncated or not gzip: {exc}.") from None
    if len(raw) > cap:
        raise too_big(path, cap)
    trace = _parse_whole(path, raw)
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise BundleError(f"{path} is JSON but not a Chrome trace: it has no traceEvents list.")
    return trace


def _parse_whole(path: Path, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path} is not a complete JSON trace ({exc.msg} at byte {exc.pos}).") from None
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path} is not a JSON trace: byte {exc.start} is not UTF-8 text.") from None
    except RecursionError:
        raise BundleError(f"{path} is not a profiler trace: its JSON is nested too deeply.") from None
    except ValueError:  # an integer of thousands of digits: Python refuses to convert it
        raise BundleError(f"{path} is not a profiler trace: it holds a number of thousands of digits.") from None
