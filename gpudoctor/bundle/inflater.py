"""A gzip file's members inflated block by block (`gunzipped`), and the process that does it beside the reader of a
big trace (`main`, run as a script: `python -I -S inflater.py TRACE BLOCK_BYTES`).

A trace's reading is inflating and decoding. In a thread, the inflating overlapped little with the decode: zlib lets
go of the GIL while it inflates, but msgspec holds it while it decodes a chunk, and the thread waits for it at each
block to hand the block over; the two added up (0.17 s and 0.26 s for 120 MB of JSON, 0.45 s together, on 2 cores).
In a process of its own it runs beside the decode (0.33 s): it writes each block to a pipe, in frames, and the
reader (gpudoctor.bundle.trace_stream) reads them. This module imports only the standard library, so that the
process starts in about 10 ms.

A frame is a header (`HEADER`: its kind, its payload's length, the file's bytes consumed so far) and its payload:
START, first, its payload MAGIC (what the reader checks it runs this script, not some other program that
`sys.executable` names); BLOCK, inflated JSON; END, the last member ended where the file does; CUT, the file ends
inside a member (a trace cut short); ERROR, the file is not gzip (the payload: zlib's words, UTF-8, at most
MAX_MESSAGE bytes).
"""

from __future__ import annotations

import signal
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

BLOCK_BYTES = 1 << 20  # JSON inflated at a time
GZIP_READ = 64 << 10  # compressed bytes read at a time: the bomb check weighs what came out against what went in
HEADER = struct.Struct("<BIQ")  # kind, payload length, bytes of the file consumed
BLOCK, END, CUT, ERROR, START = range(5)
MAGIC = b"gpudoctor inflater 1"
MAX_MESSAGE = 4096


def gunzipped(raw: BinaryIO, stopped: Callable[[], bool] = lambda: False,
              block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[bytes, int]]:
    """A gzip file's members inflated, at most `block_bytes` a block, each with the compressed bytes consumed so far
    (what the bomb check weighs it against), then b"" at its end; EOFError where the file ends inside a member,
    once every byte inflated before that was given (GzipFile's read gives none of its last call's). Zeros after the
    last member (padding) are skipped, as gzip does."""
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    pending, begun, read = b"", False, 0
    while not stopped():
        if not pending:
            pending = raw.read(GZIP_READ)
            read += len(pending)
            if not pending:
                if begun and not inflater.eof:
                    raise EOFError("the file ended before the end of its compressed stream")
                yield b"", read
                return
        begun = True
        block = inflater.decompress(pending, block_bytes)
        if inflater.eof:
            pending = inflater.unused_data
            if pending.strip(b"\0"):
                inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)  # the next member
            else:
                pending, begun = b"", False  # padding, or the end
        else:
            pending = inflater.unconsumed_tail
        if block:
            yield block, read - len(pending)


def write_frames(raw: BinaryIO, out: BinaryIO, block_bytes: int = BLOCK_BYTES) -> None:
    """The file inflated into frames on `out`, at most `block_bytes` of JSON a frame, after the START frame."""
    out.write(HEADER.pack(START, len(MAGIC), 0) + MAGIC)
    try:
        for block, consumed in gunzipped(raw, block_bytes=block_bytes):
            if not block:
                out.write(HEADER.pack(END, 0, consumed))
                return
            out.write(HEADER.pack(BLOCK, len(block), consumed))
            out.write(block)
    except EOFError:
        out.write(HEADER.pack(CUT, 0, raw.tell()))
    except BrokenPipeError:
        raise
    except (OSError, zlib.error) as exc:
        message = str(exc).encode("utf-8", "replace")[:MAX_MESSAGE]
        out.write(HEADER.pack(ERROR, len(message), raw.tell()))
        out.write(message)


def main(path: str, block_bytes: int) -> int:
    # A Ctrl-C reaches the reader too, which ends this process: here it would only end the frames early.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with open(path, "rb") as raw:
            write_frames(raw, sys.stdout.buffer, block_bytes)
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the reader stopped reading (it had what it wanted, or it ended)
        return 0
    except OSError as exc:  # the file could not be opened or read: said by the reader, which opened it too
        message = str(exc).encode("utf-8", "replace")[:MAX_MESSAGE]
        try:
            sys.stdout.buffer.write(HEADER.pack(START, len(MAGIC), 0) + MAGIC + HEADER.pack(ERROR, len(message), 0)
                                    + message)
            sys.stdout.buffer.flush()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
