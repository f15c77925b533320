"""A big .gz trace inflated in a process of its own (gpudoctor.bundle.inflater) reads as it does inflated in a thread:
the same events, the same sentences for a file cut short, one that is not gzip and a bomb, the same progress; and the
process never outlives the reading, however the reading ends."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis.trace import TraceData, parse_trace
from gpudoctor.bundle import trace_file, trace_stream
from gpudoctor.errors import BundleError

pytestmark = pytest.mark.e2e  # the process path starts a process

REPO = Path(__file__).resolve().parents[2]
RECORDED = sorted(REPO.glob("fixtures/bundles/*/trace.json.gz"))[:6]
FIXTURE = REPO / "fixtures" / "bundles" / "blocking_copy_bad" / "trace.json.gz"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Every inflating process started."""
    processes: list[subprocess.Popen[bytes]] = []
    start = trace_stream._start_inflater

    def recorded(path: Path) -> subprocess.Popen[bytes]:
        processes.append(start(path))
        return processes[-1]

    monkeypatch.setattr(trace_stream, "_start_inflater", recorded)
    return processes


def _in_a_process(monkeypatch: pytest.MonkeyPatch, yes: bool) -> None:
    monkeypatch.setattr(trace_stream, "INFLATE_PROCESS_MIN_BYTES", 0 if yes else 1 << 62)


def _records(data: TraceData) -> tuple[Any, ...]:
    return (list(data.gpu_ops), data.runtime, data.annotations, data.ops, data.python, data.steps,
            data.device_properties, data.cut_short)


def _refusals(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[str]:
    """What reading `path` is refused with, inflated in a thread, then in a process."""
    said = []
    for in_process in (False, True):
        _in_a_process(monkeypatch, in_process)
        with pytest.raises(BundleError) as refused:
            parse_trace(path, detail=False)
        said.append(str(refused.value))
    return said


def _both(monkeypatch: pytest.MonkeyPatch, read: Any) -> tuple[Any, Any]:
    _in_a_process(monkeypatch, False)
    in_thread = read()
    _in_a_process(monkeypatch, True)
    return in_thread, read()


@pytest.mark.parametrize("chunk", [4096, 1 << 20])
def test_every_recorded_trace_reads_the_same_inflated_in_a_process(
        monkeypatch: pytest.MonkeyPatch, started: list[subprocess.Popen[bytes]], chunk: int) -> None:
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", chunk)
    for path in RECORDED:
        heard: list[list[tuple[int, int]]] = []

        def read(p: Path = path, heard: list[list[tuple[int, int]]] = heard) -> TraceData:
            progress: list[tuple[int, int]] = []
            heard.append(progress)
            return parse_trace(p, lambda done, total: progress.append((done, total)), detail=True)

        thread, process = _both(monkeypatch, read)
        assert _records(process) == _records(thread), path
        size = path.stat().st_size
        for progress in heard:
            assert progress[-1] == (size, size) and progress == sorted(progress)
        assert len(heard[1]) > 1
    assert len(started) == len(RECORDED) and all(p.returncode == 0 for p in started)


def test_a_trace_cut_short_keeps_the_same_events_and_says_where_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[subprocess.Popen[bytes]]) -> None:
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 4096)
    data, path = FIXTURE.read_bytes(), tmp_path / "trace.json.gz"
    path.write_bytes(data[: len(data) // 2])
    thread, process = _both(monkeypatch, lambda: parse_trace(path, detail=False))
    assert process.cut_short is not None and _records(process) == _records(thread)
    assert any(_records(process)[:4])  # what was read before the cut is kept
    path.write_bytes(data[:20])  # the header alone
    said = _refusals(monkeypatch, path)
    assert said[0] == said[1] and "truncated or not gzip" in said[0], said
    assert len(started) == 2


def test_a_file_that_is_not_gzip_is_said_in_the_same_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              started: list[subprocess.Popen[bytes]]) -> None:
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [')[:12] + b"this is not deflate data at all" * 50)
    said = _refusals(monkeypatch, path)
    assert said[0] == said[1] and "truncated or not gzip" in said[0], said
    assert len(started) == 1


def test_a_bomb_is_refused_in_the_same_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                started: list[subprocess.Popen[bytes]]) -> None:
    monkeypatch.setattr(trace_file, "MIN_INFLATED_CAP", 1 << 20)
    bomb = tmp_path / "t.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b"[" + b" " * (64 << 20) + b"]")
    said = _refusals(monkeypatch, bomb)
    assert said[0] == said[1] and "gzip bomb" in said[0], said
    assert len(started) == 1 and started[0].returncode == -signal.SIGKILL  # ended with the reading, not at its end


def test_a_reading_stopped_early_or_interrupted_ends_its_process(
        monkeypatch: pytest.MonkeyPatch, started: list[subprocess.Popen[bytes]]) -> None:
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 4096)
    _in_a_process(monkeypatch, True)
    batches = trace_stream.TraceStream(FIXTURE).batches()
    next(batches)
    assert started[0].poll() is None  # still inflating: the pipe holds a block at a time
    batches.close()
    assert started[0].returncode == -signal.SIGKILL

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        parse_trace(FIXTURE, interrupt)
    assert len(started) == 2 and started[1].returncode == -signal.SIGKILL


def test_a_process_that_ends_early_is_said_and_one_that_cannot_start_leaves_it_to_the_thread(
        monkeypatch: pytest.MonkeyPatch, started: list[subprocess.Popen[bytes]]) -> None:
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 4096)
    _in_a_process(monkeypatch, True)
    batches = trace_stream.TraceStream(FIXTURE).batches()
    next(batches)
    started[0].kill()  # out of memory, or killed by hand
    with pytest.raises(BundleError, match=r"could not be read to its end: the process inflating it ended early "
                                          r"\(exit status -9\)"):
        for _ in batches:
            pass
    in_process = parse_trace(FIXTURE, detail=False)
    monkeypatch.setattr(trace_stream.inflater, "__file__", "/nonexistent/inflater.py")  # ends with no frame
    assert _records(parse_trace(FIXTURE, detail=False)) == _records(in_process)
    monkeypatch.setattr(sys, "executable", "")  # starts no process
    assert _records(parse_trace(FIXTURE, detail=False)) == _records(in_process)
    assert len(started) == 3 and started[1].returncode == 0 and started[2].returncode == 2


def test_the_inflating_process_imports_nothing_beyond_the_standard_library(tmp_path: Path) -> None:
    """It runs with -I -S, as a file, not as gpudoctor's module: an import of gpudoctor (or of anything installed)
    would fail there, and cost the time it is there to save."""
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode()))
    probe = (f"import runpy, sys; sys.argv = ['inflater', {str(path)!r}, '4096']\n"
             f"try:\n    runpy.run_path({trace_stream.inflater.__file__!r}, run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpudoctor', 'msgspec', 'orjson')),"
             " file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, timeout=60, check=True)
    assert done.stderr.strip() == b"[]"
    header, frames, at = trace_stream.HEADER, [], 0
    while at < len(done.stdout):
        kind, length, _ = header.unpack(done.stdout[at:at + header.size])
        frames.append((kind, done.stdout[at + header.size:at + header.size + length]))
        at += header.size + length
    assert [kind for kind, _ in frames] == [trace_stream.START, trace_stream.BLOCK, trace_stream.END]
    assert frames[0][1] == trace_stream.MAGIC and json.loads(frames[1][1]) == {"traceEvents": []}


def test_what_is_not_the_inflaters_output_leaves_the_reading_to_the_thread_or_is_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[subprocess.Popen[bytes]]) -> None:
    """A program that prints something else (an executable that is not a Python running the script) before any
    frame: the thread inflates instead. The inflater's start, then bytes that are no frame: said in one sentence."""
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 4096)
    in_thread = parse_trace(FIXTURE, detail=False)
    _in_a_process(monkeypatch, True)
    other = tmp_path / "other.py"
    other.write_text("print('usage: other [options] FILE')\nraise SystemExit(2)\n")
    monkeypatch.setattr(trace_stream.inflater, "__file__", str(other))
    assert _records(parse_trace(FIXTURE, detail=False)) == _records(in_thread)
    start = trace_stream.HEADER.pack(trace_stream.START, len(trace_stream.MAGIC), 0) + trace_stream.MAGIC
    other.write_text(f"import sys, time\nsys.stdout.buffer.write({start!r} + b'x' * 40)\nsys.stdout.flush()\n"
                     "time.sleep(60)\n")
    with pytest.raises(BundleError, match="the process inflating it wrote what is not one of its frames"):
        parse_trace(FIXTURE, detail=False)
    assert started[0].returncode in (2, -signal.SIGKILL)  # killed if it had not exited when its output was refused
    assert started[1].returncode == -signal.SIGKILL
