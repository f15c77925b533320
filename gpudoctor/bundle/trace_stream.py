"""Reading a torch.profiler (Kineto) Chrome trace chunk by chunk (`TraceStream`); gpudoctor.bundle.trace_file reads one
whole (`read_trace`) and bounds what a trace may inflate to.

A trace can be gigabytes of JSON. `TraceStream` reads it a few MB at a time, gzip inflated beside the decoding (in
a process of its own, gpudoctor.bundle.inflater, for a file of a MB or more; in a second thread for a smaller one),
so that memory stays a small fraction of the trace's size. Each chunk of events is decoded at once
into small msgspec Structs that name only the keys the views use (`TypedEvents`: the other keys are skipped
without building anything); a chunk they cannot take goes to `EventFilter`, which picks the events worth
parsing out of the raw bytes, or is parsed into dicts. The analysis (gpudoctor.analysis.trace) turns the
events into views.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import types
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from gpudoctor.bundle import inflater
from gpudoctor.bundle.inflater import BLOCK, CUT, END, ERROR, HEADER, MAGIC, MAX_MESSAGE, START, gunzipped
from gpudoctor.bundle.jsonio import loads as _loads
from gpudoctor.bundle.trace_file import inflated_cap, inflating_too_far, not_gzip, too_big
from gpudoctor.errors import BundleError, TraceNotJsonError

# -- reading a big trace in chunks -----------------------------------------------------------------
CHUNK_BYTES = 1 << 20  # JSON read at a time: memory is a few times this, whatever the trace's size (4 MB cost 12 MB
# more peak memory on a 151 MB trace of GPU ops, and no less time)
# A .gz trace from this size up is inflated in a process of its own (gpudoctor.bundle.inflater), which starts in
# about 10 ms; a smaller one in a thread.
INFLATE_PROCESS_MIN_BYTES = 1 << 20
_EXIT_WAIT_S = 5.0  # how long an inflating process that wrote its last frame is given to exit before it is killed
_KEY_OVERLAP = 256  # how far back a search of the next block starts: the key and the blanks around it
_HEADER_MAX = 64 << 20  # the top-level keys before traceEvents (deviceProperties, ...) are small
# The longest event read: the longest in fixtures/ is under 20 kB (a kernel's templated name and its args). One
# longer (a string of hundreds of MB) is no profiler's, and reading it would hold it whole in memory.
MAX_EVENT_BYTES = 32 << 20
_WS = b" \t\r\n"
_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*')
_SEPARATOR = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")  # between two events (and, rarely, inside one)


class TraceNotStreamable(Exception):
    """The chunked reader cannot follow this file's layout (or it is corrupt): read it whole instead."""


class EventFilter:
    """The events worth parsing, picked out of the raw JSON before parsing it.

    An event is kept if its "cat" is one of `categories` and, for a category in `names`, its name is one of
    those. Most events of a big trace (cpu_op, python_function, flows, most CUDA runtime calls) are then
    never turned into Python objects: a regular expression finds the `"cat": "..."` of the wanted ones in
    the chunk, and only those events are parsed, one by one. Each is checked (it parses, it is an object,
    its "cat" is the one found); if one is not, the whole chunk is parsed instead, so an unusual layout
    costs time, never events.
    """

    def __init__(self, categories: Iterable[str], names: dict[str, Iterable[str]] | None = None) -> None:
        def alternatives(words: Iterable[str]) -> bytes:
            return b"|".join(re.escape(json.dumps(w).encode()[1:-1]) for w in sorted(words))

        self.categories = frozenset(categories)
        self._cat = re.compile(rb'"cat"[ \t\r\n]*:[ \t\r\n]*"(' + alternatives(self.categories) + rb')"')
        self._names = {cat.encode(): re.compile(rb'"(?:' + alternatives(allowed) + rb')"')
                       for cat, allowed in (names or {}).items()}

    def pick(self, buf: bytes, lo: int, hi: int) -> list[dict[str, Any]] | None:
        """The wanted events among the whole events in buf[lo:hi], or None if one could not be cut out."""
        events: list[dict[str, Any]] = []
        last, previous = -1, lo
        names, separator = self._names, _SEPARATOR
        matches = list(self._cat.finditer(buf, lo, hi))
        for i, match in enumerate(matches):
            cat = match.group(1)
            allowed = names.get(cat)
            if allowed is not None:
                # The whole event lies between the previous match and the next one: a name found there but
                # outside the event only costs a parse (its own name is checked once parsed).
                following = matches[i + 1].start() if i + 1 < len(matches) else hi
                if allowed.search(buf, previous, following) is None:
                    previous = match.end()
                    continue
            previous = match.end()
            after = separator.search(buf, match.end(), hi)
            end = after.start() + 1 if after is not None else hi
            cut = _last_event_end(buf, lo, match.start())
            start = buf.find(b"{", lo if cut is None else cut, match.start())
            if start < 0:
                return None
            if start == last:
                continue  # a second "cat" in one event
            last = start
            try:
                event = _loads(buf[start:end])
            except ValueError:
                return None
            if type(event) is not dict or event.get("cat") != cat.decode():
                return None
            events.append(event)
        return events


E = TypeVar("E", bound=msgspec.Struct)


class TypedEvents(Generic[E]):
    """Every event of a chunk decoded at once into `event_type`, a msgspec Struct naming only the keys that are
    used: msgspec skips the others (and their nesting) without building a dict, a string or a number.

    On 150 MB traces scaled up from a recorded one (bench/analyze.py), decoding a chunk this way took 1.0 ms a MB
    of JSON where the events are GPU ops only, against 7.6 ms for EventFilter (which hands each of them to orjson)
    and 10 for orjson into dicts; and 1.65 ms against EventFilter's 2.1 on the recorded mix, where only 9% of the
    events are used: picking events out of the bytes no longer pays even there. A chunk that does not decode (an
    event that is not an object, a value of another type than the Struct's, bytes that are not JSON there) is
    handed to `fallback` (without one, it is parsed into dicts), so a surprise costs time, never events.
    """

    def __init__(self, event_type: type[E], fallback: EventFilter | None = None) -> None:
        self.event_type = event_type
        self._decoder: msgspec.json.Decoder[list[E]] = msgspec.json.Decoder(types.GenericAlias(list, (event_type,)))
        self.fallback = fallback

    def decode(self, data: bytes) -> list[E] | None:
        """The events of a JSON list, or None if they do not all decode into `event_type`."""
        try:
            return self._decoder.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # ValidationError is a DecodeError
            return None

    def pick(self, buf: bytes, lo: int, hi: int) -> list[Any] | None:
        """The whole events in buf[lo:hi]: as `event_type`, or as the fallback picks them; None if neither can."""
        events = self.decode(b"".join((b"[", memoryview(buf)[lo:hi], b"]")))
        if events is None and self.fallback is not None:
            return self.fallback.pick(buf, lo, hi)
        return events


Select = EventFilter | TypedEvents[Any]


@dataclass
class TraceStream:
    """A Chrome trace read chunk by chunk: `batches()` yields lists of events, each from about
    CHUNK_BYTES of JSON; `meta` holds the other top-level keys (those before traceEvents as soon as the
    first batch comes, those after it once the last one has).

    `progress(done, total)` is called after each chunk read, in bytes of the file (compressed for .gz).
    The chunked reader relies only on JSON: each cut between two events is checked by parsing the events
    before it (or, with an EventFilter, each event picked), so a cut inside a string or a nested object
    fails and an earlier one is tried. A file it cannot follow, or a corrupt one, raises
    `TraceNotStreamable` from `batches()`; the caller then falls back to `read_trace`, which reads the
    file whole and says what is wrong with it.
    """

    path: Path
    progress: Callable[[int, int], None] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # Where the trace ends early (a run killed while its trace was written): the bytes of the file read, and the
    # events before that are what `batches()` gives; None for a trace that ends where it should.
    cut_short: int | None = None
    _top: str = field(default="object", init=False, repr=False)  # an object, or a bare list of events
    _yielded: bool = field(default=False, init=False, repr=False)  # some events were given already

    def batches(self, select: Select | None = None) -> Iterator[list[Any]]:
        """Lists of events (dicts, or with TypedEvents, mostly its Structs: each list holds one or the other); with
        an EventFilter, only (at least) the events it keeps, except in the last batch."""
        chunks = self._chunks()
        try:
            yield from self._split(_utf8_checked(chunks), select)
        finally:
            chunks.close()

    # -- bytes in --------------------------------------------------------------------------------
    def _chunks(self) -> Generator[bytes, None, None]:
        """The decompressed file, in pieces of CHUNK_BYTES; a .gz one is inflated beside the parsing, in a process of
        its own (`_inflate_in_process`) or, for a small one or where no process starts, in a second thread."""
        path, total = self.path, self.path.stat().st_size
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise not_gzip(path, exc) from None
        with raw:
            if path.suffix != ".gz":
                while block := raw.read(CHUNK_BYTES):
                    self._report(raw.tell(), total)
                    yield block
                return
            cap = inflated_cap(path)
            if total >= INFLATE_PROCESS_MIN_BYTES:
                try:
                    yield from _inflate_in_process(path, total, self._report, cap, self._cut_at)
                    return
                except _NoInflater:
                    pass
            yield from _inflate_in_thread(raw, total, self._report, path, cap, self._cut_at)

    def _cut_at(self, done: int) -> None:
        self.cut_short = done

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    # -- events out ------------------------------------------------------------------------------
    def _split(self, chunks: Iterator[bytes], select: Select | None) -> Iterator[list[Any]]:
        buf, pos = self._read_header(chunks)
        searched = pos  # buf[pos:searched] holds no cut: a long event is searched once, not once per block
        read = len(buf)  # bytes of JSON read, for saying where an event too long begins
        while True:
            cut = None
            if len(buf) - pos >= CHUNK_BYTES:
                cut = _last_event_end(buf, max(pos, searched - _KEY_OVERLAP), len(buf))
                searched = len(buf)
            if cut is None:  # too little to parse yet, or one event longer than all that was read
                if len(buf) - pos > MAX_EVENT_BYTES + CHUNK_BYTES:
                    raise TraceNotJsonError(
                        f"{self.path} holds an event longer than {MAX_EVENT_BYTES >> 20} MB (from byte "
                        f"{read - (len(buf) - pos):,} of its JSON): it is not a profiler trace.")
                block = next(chunks, None)
                if block is None:
                    yield self._last_events(buf, pos, select)
                    return
                read += len(block)
                # A block of blanks alone (padding between or after events) adds nothing to parse: keep one
                # blank, so that the buffer, and each search of it for a cut, stays as long as the events.
                searched -= pos
                buf = buf[pos:] + (block if block.strip(_WS) else b" ")
                pos = 0
                continue
            events = select.pick(buf, pos, cut) if select is not None else None
            if events is None:
                events, pos = _parse_before(buf, pos, cut)
            else:
                pos = buf.index(b"{", cut)
            searched = pos
            self._yielded = True
            yield events

    def _read_header(self, chunks: Iterator[bytes]) -> tuple[bytes, int]:
        """Read up to the '[' that opens traceEvents (or the whole trace, for a bare list of events). Each block is
        appended and searched once (a header that never ends, a gzip bomb's zeros, costs its length, not its
        square), up to _HEADER_MAX."""
        buf, searched, begun = bytearray(), 0, False
        for block in chunks:
            if not begun:
                first = block.removeprefix(b"\xef\xbb\xbf").lstrip(_WS)
                if not first:  # blanks before the trace: nothing to keep
                    continue
                begun = True
                if first[:1] == b"[":
                    self._top = "list"
                    return first, 1
                buf += first
            else:
                buf += block
            key = _EVENTS_KEY.search(buf, max(0, searched - _KEY_OVERLAP))
            searched = len(buf)
            if key is not None and key.end() < len(buf):
                if buf[key.end()] != 0x5B:  # '['
                    raise TraceNotStreamable("traceEvents is not a list")
                head = bytes(buf[:key.start()]).rstrip(_WS)
                try:
                    meta = _loads(head[:-1] + b"}") if head.endswith(b",") else {}
                except ValueError:
                    raise TraceNotStreamable("unexpected header") from None
                if not isinstance(meta, dict) or (not head.endswith(b",") and head.lstrip(_WS) != b"{"):
                    raise TraceNotStreamable("unexpected header")
                self.meta.update(meta)
                self._top = "object"
                return bytes(buf), key.end() + 1
            if len(buf) > _HEADER_MAX:
                break
        raise TraceNotStreamable("no traceEvents list near the start")

    def _last_events(self, buf: bytes, pos: int, select: Select | None) -> list[Any]:
        """The events left at the end; of a trace cut short (its list never closed), those read whole before the
        cut, the cut said in `cut_short`, rather than a second read of the whole file."""
        try:
            return self._read_last(buf[pos:], select if isinstance(select, TypedEvents) else None)
        except TraceNotStreamable:
            cut = _last_event_end(buf, pos, len(buf))
            ends_whole = buf.rstrip(_WS)[-1:] in (b"}", b"]")  # a whole JSON document ends so; one cut short, not
            if (self.cut_short is None and ends_whole) or (cut is None and not self._yielded):
                raise  # a layout the chunked reader does not follow, or nothing to keep: the file is read whole
            if self.cut_short is None:
                self.cut_short = self.path.stat().st_size
            if cut is None:  # what is left is the event the cut went through
                return []
            events = select.pick(buf, pos, cut) if select is not None else None
            return events if events is not None else _parse_before(buf, pos, cut)[0]

    def _read_last(self, rest: bytes, typed: TypedEvents[Any] | None = None) -> list[Any]:
        """The events left, up to the ']' that closes traceEvents, and the top-level keys after it."""
        end = len(rest)
        for _ in range(64):
            close = rest.rfind(b"]", 0, end)
            if close < 0:
                break
            end = close
            tail = rest[close + 1:].strip(_WS)
            if self._top == "list":
                if tail:
                    continue
                meta: Any = {}
            else:
                if not tail.endswith(b"}"):
                    continue
                inner = tail[:-1].strip(_WS)
                if inner and not inner.startswith(b","):
                    continue
                try:
                    meta = _loads(b"{" + inner[1:] + b"}") if inner else {}
                except ValueError:
                    continue
            events: list[Any] | None = typed.decode(b"[" + rest[:close] + b"]") if typed is not None else None
            if events is None:
                try:
                    events = _loads(b"[" + rest[:close] + b"]")
                except ValueError:
                    break
            self.meta.update(meta)
            return events
        raise TraceNotStreamable("the end of traceEvents is not where it should be")


def _inflate_in_thread(raw: Any, total: int, report: Callable[[int, int], None], path: Path,
                       cap: int, cut_at: Callable[[int], None]) -> Iterator[bytes]:
    out: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def put(item: Any) -> None:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def inflate() -> None:
        inflated = 0
        try:
            for block, consumed in gunzipped(raw, stop.is_set, CHUNK_BYTES):
                inflated += len(block)
                if inflated > cap or inflating_too_far(path, inflated, consumed):
                    put(too_big(path, cap))
                    return
                put((block, consumed))
                if not block:
                    return
        except EOFError:  # the file ends before its compressed stream does: a trace cut short
            put(_CutShort(raw.tell()))
        except (OSError, zlib.error) as exc:
            put(not_gzip(path, exc))
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            put(exc)

    thread = threading.Thread(target=inflate, name="gpudoctor-inflate", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, _CutShort):
                cut_at(item.done)
                report(total, total)
                return
            block, done = item
            if not block:
                report(total, total)
                return
            report(min(done, total), total)
            yield block
    finally:
        stop.set()
        thread.join()


class _NoInflater(Exception):
    """The inflating process did not start, or ended before its first frame: the thread inflates instead."""


def _inflate_in_process(path: Path, total: int, report: Callable[[int, int], None], cap: int,
                        cut_at: Callable[[int], None]) -> Iterator[bytes]:
    """The blocks of a .gz file as gpudoctor.bundle.inflater's process writes them, refused as the thread refuses
    them (a bomb, bytes that are not gzip); the process ends with the reading, however it ends."""
    process = _start_inflater(path)
    inflated, started, ended = 0, False, False
    try:
        pipe = process.stdout
        assert pipe is not None
        while True:
            header = pipe.read(HEADER.size)
            ended_early = len(header) < HEADER.size
            kind, length, consumed = (None, 0, 0) if ended_early else HEADER.unpack(header)
            expected = (kind == START and length == len(MAGIC)) if not started else (
                (kind == BLOCK and length <= CHUNK_BYTES) or (kind == ERROR and length <= MAX_MESSAGE)
                or (kind in (END, CUT) and length == 0))
            payload = pipe.read(length) if expected and length else b""
            ended_early = ended = ended_early or (expected and len(payload) < length)  # its output ended
            if not started:
                if not expected or payload != MAGIC:
                    raise _NoInflater  # it ended before its first frame, or this is not its output
                started = True
                continue
            if ended_early:
                raise BundleError(f"{path} could not be read to its end: the process inflating it ended early "
                                  f"(exit status {_status(process)}).")
            if not expected:
                raise BundleError(f"{path} could not be read to its end: the process inflating it wrote what is "
                                  "not one of its frames.")
            if kind == BLOCK:
                inflated += length
                if inflated > cap or inflating_too_far(path, inflated, consumed):
                    raise too_big(path, cap)
                report(min(consumed, total), total)
                yield payload
            elif kind in (END, CUT):
                if kind == CUT:
                    cut_at(consumed)
                ended = True
                report(total, total)
                return
            else:
                raise not_gzip(path, OSError(payload.decode("utf-8", "replace")))
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_EXIT_WAIT_S if ended else 0)  # it exits once its output has ended
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _status(process: subprocess.Popen[bytes]) -> int | str:
    """The exit status of a process whose output ended ("still running" if it has not exited soon after)."""
    try:
        return process.wait(_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return "still running"


def _start_inflater(path: Path) -> subprocess.Popen[bytes]:
    """gpudoctor.bundle.inflater run as a script on `path` (-I -S: nothing of the environment or of site-packages is
    read), its frames on a pipe widened to a block where the platform allows it. Not where Python is frozen into
    another program, whose executable runs no script, nor where the module is no file."""
    script = getattr(inflater, "__file__", None)
    if not sys.executable or getattr(sys, "frozen", False) or not script:
        raise _NoInflater
    try:
        process = subprocess.Popen([sys.executable, "-I", "-S", script, os.fspath(path), str(CHUNK_BYTES)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except (OSError, ValueError, TypeError):
        raise _NoInflater from None
    if sys.platform.startswith("linux") and process.stdout is not None:
        import fcntl

        with contextlib.suppress(OSError):
            fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, CHUNK_BYTES)
    return process


@dataclass(frozen=True)
class _CutShort:
    done: int  # bytes of the file read


def _last_event_end(buf: bytes, lo: int, hi: int) -> int | None:
    """Where the last '}' in buf[lo:hi] that is followed by ',' and '{' (blanks between) ends, if any."""
    brace = buf.rfind(b"{", lo, hi)
    while brace > lo:
        k = brace - 1
        while k > lo and buf[k] in _WS:
            k -= 1
        if buf[k] == 0x2C:  # ','
            k -= 1
            while k > lo and buf[k] in _WS:
                k -= 1
            if buf[k] == 0x7D:  # '}'
                return k + 1
        brace = buf.rfind(b"{", lo, brace)
    return None


def _utf8_checked(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The chunks as they come, once each is known to be UTF-8 (msgspec skips the keys a Struct does not name
    without reading them, so bytes that are not text there would pass unseen). ASCII, the usual trace, costs a
    scan; other chunks are decoded, a character split between two of them included."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    for chunk in chunks:
        if not chunk.isascii():
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                raise TraceNotStreamable("not UTF-8") from None
        yield chunk


def _parse_before(buf: bytes, pos: int, cut: int) -> tuple[list[Any], int]:
    """Parse the events in buf[pos:cut]; if the cut is not between two events, try a few earlier ones."""
    for _ in range(8):
        try:
            events = _loads(b"[" + buf[pos:cut] + b"]")
        except ValueError:
            earlier = _last_event_end(buf, pos, cut - 1)
            if earlier is None:
                break
            cut = earlier
            continue
        return events, buf.index(b"{", cut)
    raise TraceNotStreamable("no place to cut between two events")
