"""A torch.profiler (Kineto) Chrome trace read whole (`read_trace`), and the bounds on what any trace may inflate to
(the chunked reader, gpudoctor.bundle.trace_stream, keeps to them too)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import zlib
from pathlib import Path
from typing import Any

from gpudoctor.errors import BundleError, TraceNotJsonError

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


def inflating_too_far(path: Path, inflated: int, read: int) -> bool:
    """Whether a .gz file that gave `inflated` bytes of JSON from its first `read` bytes inflates more than any
    trace does: past MAX_INFLATION times what was read, once past MIN_INFLATED_CAP (a 2 MB file of gzip'd blanks
    is refused after 64 MB, not after the 400 MB its size alone would allow)."""
    return inflated > MIN_INFLATED_CAP and inflated > MAX_INFLATION * read


def not_gzip(path: Path, exc: BaseException) -> TraceNotJsonError:
    return TraceNotJsonError(f"{path} is truncated or not gzip: {exc}.")


def read_trace(path: Path) -> dict[str, Any]:
    """Load a Chrome trace (.json or .json.gz) and check it is one; raise BundleError saying what is wrong
    (TraceNotJsonError when it is not JSON, even repaired)."""
    cap = inflated_cap(path)
    try:
        raw = _inflated(path, cap) if path.suffix == ".gz" else path.read_bytes()
    except (EOFError, OSError, zlib.error) as exc:
        raise not_gzip(path, exc) from None
    trace = _parse_whole(path, raw)
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise BundleError(f"{path} is JSON but not a Chrome trace: it has no traceEvents list.")
    return trace


def _inflated(path: Path, cap: int) -> bytes:
    """A .gz trace inflated, in blocks, refused as soon as it inflates further than a trace does."""
    blocks, inflated = [], 0
    with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
        while block := f.read(GZIP_BLOCK * 16):
            inflated += len(block)
            if inflated > cap or inflating_too_far(path, inflated, raw.tell()):
                raise too_big(path, cap)
            blocks.append(block)
    return b"".join(blocks)


# Kineto writes a label (a record_function's, a string argument) as it is: a double quote or a backslash in one
# ends the JSON string early. Its events put "name" first on its line, the next key after it.
_LABEL = re.compile(rb'("name": ")(.*)(", "(?:pid|tid|bp|ph|cat|ts|id|dur|args)":)')


def repair_labels(raw: bytes) -> bytes:
    """The trace with the quotes and backslashes of every "name" escaped, as Kineto should have written them."""
    return b"\n".join(_LABEL.sub(_escaped_label, line) if b'"name": "' in line else line
                      for line in raw.split(b"\n"))


def _escaped_label(match: re.Match[bytes]) -> bytes:
    value = match.group(2).replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return match.group(1) + value + match.group(3)


def _parse_whole(path: Path, raw: bytes) -> Any:
    try:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return json.loads(repair_labels(raw))  # a label Kineto wrote unescaped (a quote in a record_function's)
    except json.JSONDecodeError as exc:
        raise TraceNotJsonError(f"{path} is not a complete JSON trace ({exc.msg} at byte {exc.pos}).") from None
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path} is not a JSON trace: byte {exc.start} is not UTF-8 text.") from None
    except RecursionError:
        raise BundleError(f"{path} is not a profiler trace: its JSON is nested too deeply.") from None
    except ValueError:  # an integer of thousands of digits: Python refuses to convert it
        raise BundleError(f"{path} is not a profiler trace: it holds a number of thousands of digits.") from None
