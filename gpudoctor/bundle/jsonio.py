"""JSON in and out of a bundle: one encoder, one line reader, one line writer, one tail follower, one atomic write.

Records are msgspec Structs (gpudoctor.bundle.manifest, .events, .samples): decoding a line into its record
type parses and validates it in one pass, several times faster than parsing into dicts. A wrong type is a
`BundleError` naming the file, the line and the field. Untyped JSON (trace events) is parsed with orjson
where it is installed, else with the json module.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import msgspec

from gpudoctor.bundle.free_space import FreeSpaceCheck
from gpudoctor.errors import BundleError

try:  # several times faster than the json module on untyped JSON
    import orjson

    loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency
    loads = json.loads

T = TypeVar("T")
# The longest line a bundle's JSONL files hold is a process sample with every thread's CPU: kilobytes. A longer
# line than this is not one gpudoctor wrote, and is refused before it fills the memory.
MAX_LINE_BYTES = 64 << 20

# A value msgspec cannot encode (a Path, a numpy scalar) is written as its text, never lost. NaN and
# infinities become null: the files stay strict JSON.
_encoder = msgspec.json.Encoder(enc_hook=str)


def encode(record: object) -> bytes:
    """A record (a Struct, or plain JSON data) as compact JSON."""
    return _encoder.encode(record)


def encode_pretty(record: object) -> bytes:
    return msgspec.json.format(_encoder.encode(record), indent=2)


def decode_error(path: Path, exc: msgspec.DecodeError | UnicodeDecodeError | RecursionError,
                 line: int | None = None) -> BundleError:
    """The one-sentence message for a record that cannot be read."""
    where = f"line {line}: " if line is not None else ""
    if isinstance(exc, RecursionError):  # msgspec's decoder stops at a depth no record of gpudoctor's has
        return BundleError(f"{path} is corrupt: {where}its JSON is nested too deeply.")
    if isinstance(exc, UnicodeDecodeError):
        return BundleError(f"{path} is corrupt: {where}byte {exc.start} is not UTF-8 text.")
    reason = str(exc).replace(" - at `$", " at `$")
    if not reason[1:2].isupper():  # "Expected `int`..." reads on in the sentence; "JSON is malformed" keeps its case
        reason = reason[:1].lower() + reason[1:]
    return BundleError(f"{path} is corrupt: {where}{reason}.")


ANY_JSON: msgspec.json.Decoder[Any] = msgspec.json.Decoder()  # plain JSON data: dicts, lists, numbers, strings


@overload
def read_jsonl(path: Path) -> Iterator[Any]: ...
@overload
def read_jsonl(path: Path, decoder: msgspec.json.Decoder[T]) -> Iterator[T]: ...


def read_jsonl(path: Path, decoder: msgspec.json.Decoder[Any] = ANY_JSON) -> Iterator[Any]:
    """The records of a JSONL file, read line by line (with `decoder`, as its records; without, as plain JSON);
    a last line cut short by a crash is skipped, any other bad line is a BundleError."""
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(line) > MAX_LINE_BYTES:
                raise BundleError(f"{path} is corrupt: line {number} is longer than {MAX_LINE_BYTES >> 20} MB.")
            if not line.strip():
                continue
            try:
                yield decoder.decode(line)
            except (msgspec.ValidationError, RecursionError) as exc:
                raise decode_error(path, exc, number) from None
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                if not line.endswith(b"\n"):  # only the last line can lack its newline: the writer was killed
                    return
                raise decode_error(path, exc, number) from None


def read_json(path: Path, decoder: msgspec.json.Decoder[T]) -> T:
    """One JSON document, decoded and validated."""
    try:
        return decoder.decode(path.read_bytes())
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise decode_error(path, exc) from None


def write_json_atomic(path: Path, record: object) -> None:
    """Write JSON so that a reader never sees half a file: write beside it, then rename over it."""
    write_replacing(path, encode_pretty(record) + b"\n")


def write_replacing(path: Path, data: bytes) -> None:
    """Write `path` whole, replacing what is there: written beside it under a name of its own, then renamed over
    it. A reader never sees half a file, and a link at `path` (or at the name beside it) is replaced, never written
    through: a run directory received from someone else may hold a findings.json that is a link to another file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    # O_EXCL: a new file, never one that is there (a link included); the mode as the umask has it, as write_bytes'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class JsonlWriter:
    """Appends one JSON record per line and flushes each, so a crash loses at most the line being written.

    A write the file system refuses (disk full, file too large, the directory gone) never raises: the writer
    stops, keeps the error in `failed`, and tells `on_failure` once; what was written before stays whole. So does
    a write once the disk has less free than gpudoctor leaves to the script (bundle.free_space).
    """

    def __init__(self, path: Path, on_failure: Callable[[Path, OSError], None] | None = None,
                 keep_free: bool = True) -> None:
        """`keep_free` False: a file written once the script has ended (nothing of the script's left to protect)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.failed: OSError | None = None
        self._on_failure = on_failure
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        # Reentrant: a signal handler that writes (SIGTERM in the script's process) can interrupt a write
        # on the same thread, and must not wait for a lock that thread holds.
        self._lock = threading.RLock()
        self._space = FreeSpaceCheck(path.parent) if keep_free else None

    def write(self, record: object) -> None:
        line = encode(record) + b"\n"
        # ValueError: closed, possibly by a signal handler that interrupted this very write
        with self._lock, contextlib.suppress(ValueError):
            if self.failed is None:
                short = self._space.short() if self._space is not None else None
                if short is not None:
                    self._fail(short)
                    return
                try:
                    self._file.write(line)
                except OSError as exc:
                    self._fail(exc)

    def forget_lock(self) -> None:
        """In a forked child: a lock another thread of the parent held at the fork would never be released."""
        self._lock = threading.RLock()

    def _fail(self, exc: OSError) -> None:
        self.failed = exc
        with contextlib.suppress(OSError):
            self._file.close()
        if self._on_failure is not None:
            self._on_failure(self.path, exc)

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._file.close()


class JsonlTail(Generic[T]):
    """The records appended to a JSONL file since the last `read()`: a line still being written waits for
    the next read, and a line that cannot be decoded is skipped (the file's reader will say what is wrong)."""

    def __init__(self, path: Path, decoder: msgspec.json.Decoder[T]) -> None:
        self.path = path
        self._decoder = decoder
        self._offset = 0

    def read(self) -> list[T]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        records: list[T] = []
        for line in complete.splitlines():
            try:
                records.append(self._decoder.decode(line))
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                continue
        return records
