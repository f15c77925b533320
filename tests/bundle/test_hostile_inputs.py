"""Traces and bundles made to break the reader: each is refused with one sentence naming the file (exit 65), or
read with the bad part left out; never a traceback, a hang or a findings.json that is not strict JSON."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import Gpudoctor
from gpudoctor.analysis import Run
from gpudoctor.analysis.trace import parse_trace
from gpudoctor.bundle import jsonio, trace_file, trace_stream
from gpudoctor.errors import BundleError

TRACE = Path(__file__).resolve().parents[2] / "fixtures" / "bundles" / "sync_point_bad" / "trace.json.gz"


def _trace_text() -> str:
    with gzip.open(TRACE, "rt", encoding="utf-8") as f:
        return f.read()


def _write_gz(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data, 1))
    return path


def _refused(path: Path) -> str:
    with pytest.raises(BundleError) as raised:
        parse_trace(path)
    message = str(raised.value)
    assert str(path) in message and "\n" not in message and message.endswith("."), message
    return message


def test_bytes_that_are_not_utf8_are_named(tmp_path: Path) -> None:
    raw = _trace_text().encode()
    assert "not UTF-8" in _refused(_write_gz(tmp_path / "t.json.gz", raw[:5000] + b"\xff\xfe" + raw[5000:]))


def test_an_integer_of_thousands_of_digits_is_refused(tmp_path: Path) -> None:
    text = _trace_text().replace('"dur": ', '"dur": ' + "9" * 5000 + ', "x": ', 1)
    said = _refused(_write_gz(tmp_path / "t.json.gz", text.encode()))
    assert "thousands of digits" in said and "sys.set_int_max_str_digits" not in said, said


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    _refused(_write_gz(tmp_path / "t.json.gz", b"[" * 100_000 + b"]" * 100_000))


@pytest.mark.parametrize("streamed", [True, False])
def test_a_gzip_bomb_is_refused_before_it_is_inflated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      streamed: bool) -> None:
    monkeypatch.setattr(trace_file, "MIN_INFLATED_CAP", 1 << 20)
    bomb = _write_gz(tmp_path / "t.json.gz", b"[" + b" " * (64 << 20) + b"]")  # 64 MB of blanks in ~64 kB
    if streamed:
        assert "gzip bomb" in _refused(bomb)
    else:
        with pytest.raises(BundleError, match="gzip bomb"):
            trace_file.read_trace(bomb)


def test_blanks_padding_a_trace_are_read_past(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 4096)
    text = _trace_text()
    end = text.rindex("]")
    padded = tmp_path / "t.json"
    padded.write_text(text[:end] + " " * (8 << 20) + text[end:])
    assert parse_trace(padded).steps == parse_trace(TRACE).steps


@pytest.mark.parametrize("value", ["NaN", "-5000", "Infinity"])
def test_an_event_with_a_duration_that_is_not_one_is_left_out(tmp_path: Path, value: str) -> None:
    text = _trace_text()
    assert text.count('"cat": "kernel"') > 1
    first_kernel = text.index('"cat": "kernel"')
    dur = text.index('"dur": ', first_kernel)
    bad = text[:dur] + f'"dur": {value}, "was": ' + text[dur + len('"dur": '):]
    data = parse_trace(_write_gz(tmp_path / "t.json.gz", bad.encode()))
    assert data.gpu_ops and all(0 <= op.dur < 1e3 for op in data.gpu_ops)
    assert len(data.gpu_ops) == len(parse_trace(TRACE).gpu_ops) - 1


def test_a_line_longer_than_any_gpudoctor_writes_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonio, "MAX_LINE_BYTES", 1024)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"kind": "torch"}\n' + b"[" * 5000 + b"\n")
    with pytest.raises(BundleError, match="line 2 is longer than"):
        list(jsonio.read_jsonl(path))


def test_a_bare_trace_with_bad_durations_still_gives_strict_json(tmp_path: Path, gd: Gpudoctor) -> None:
    text = _trace_text().replace('"dur": ', '"dur": NaN, "was": ', 40)
    trace = _write_gz(tmp_path / "t.json.gz", text.encode())
    result = gd.run("analyze", str(trace), "--out", "out", "--format", "json")
    assert result.returncode == 0, result

    def refuse(constant: str) -> float:
        raise ValueError(f"findings.json holds {constant}")

    findings = json.loads((gd.cwd / "out" / "findings.json").read_text(), parse_constant=refuse)
    assert all(s >= 0 for s in [findings["run"]["median_step_s"] or 0.0])


def test_a_bundle_of_a_hostile_trace_exits_65_with_one_sentence(tmp_path: Path, gd: Gpudoctor) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for path in TRACE.parent.rglob("*"):
        target = run_dir / path.relative_to(TRACE.parent)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        elif path.name != "trace.json.gz":
            target.write_bytes(path.read_bytes())
    _write_gz(run_dir / "trace.json.gz", b"[" * 100_000 + b"]" * 100_000)
    assert Run.from_bundle(run_dir).trace_file is not None
    result = gd.run("analyze", str(run_dir))
    assert result.returncode == 65, result
    assert len(result.messages) == 1 and "trace.json.gz" in result.first_message and "Traceback" not in result.stderr


def test_a_label_kineto_wrote_unescaped_is_repaired(tmp_path: Path) -> None:
    """A label holding a double quote and a backslash (a record_function's): Kineto writes it as it is, which is not
    JSON; the trace is read as if Kineto had escaped it, every event kept."""
    text = _trace_text()
    kernel = re.search(r'"cat": "kernel", "name": "([^"]+)", "pid"', text).group(1)
    broken = text.replace(f'"name": "{kernel}", "pid"', '"name": "say "hi" \\ now", "pid"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    trace, intact = parse_trace(_write_gz(tmp_path / "t.json.gz", broken.encode())), parse_trace(TRACE)
    assert trace.steps == intact.steps and len(trace.gpu_ops) == len(intact.gpu_ops)
    assert 'say "hi" \\ now' in {op.name for op in trace.gpu_ops} and kernel not in {op.name for op in trace.gpu_ops}


def test_a_bundle_whose_trace_is_cut_short_is_reported_from_what_it_holds(tmp_path: Path, gd: Gpudoctor) -> None:
    bundle = _bundle_copy(tmp_path)
    trace = bundle / "trace.json.gz"
    raw = gzip.decompress(trace.read_bytes())
    trace.write_bytes(gzip.compress(raw[: len(raw) // 2], 1))
    result = gd.run("analyze", str(bundle))
    assert result.returncode == 0, result
    # the events read whole before the cut are kept, in the one streaming read, and the cut is said
    assert result.first_message.startswith(f"gpudoctor: {trace} ends early, "), result.first_message
    assert result.first_message.endswith("the events before that are analysed.")
    findings = json.loads((bundle / "findings.json").read_text())
    assert findings["summary"]["status"] != "no_steps" and findings["run"]["step_s"] is not None
    assert "GD301" not in {row["code"] for row in findings["not_evaluated"]}  # its kernels are there to look at
    assert "ends early" in (bundle / "report.html").read_text()


@pytest.mark.parametrize("name", ["events.jsonl", "samples/host.jsonl", "samples/procs.jsonl", "manifest.json"])
def test_deep_nesting_in_a_bundle_file_is_refused_in_one_sentence(tmp_path: Path, gd: Gpudoctor, name: str) -> None:
    bundle = _bundle_copy(tmp_path)
    path = bundle / name
    deep = b"[" * 100_000 + b"]" * 100_000
    raw = path.read_bytes()
    path.write_bytes(raw + b'{"kind": ' + deep + b"}\n" if name.endswith(".jsonl")
                     else raw.replace(b"{", b'{"deep": ' + deep + b", ", 1))
    result = gd.run("analyze", str(bundle))
    assert result.returncode == 65, result
    assert result.stderr.strip().splitlines() == [result.first_message]
    assert name in result.first_message and "nested too deeply" in result.first_message


@pytest.mark.parametrize("streamed", [True, False])
def test_a_bomb_is_refused_as_soon_as_it_inflates_further_than_a_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      streamed: bool) -> None:
    """200 MB of blanks packed in under 1 MB: its size alone would let it inflate to 40 MB and more; the ratio of
    what came out to what went in stops it a few MB in."""
    monkeypatch.setattr(trace_file, "MIN_INFLATED_CAP", 1 << 20)
    refused_at: list[int] = []

    def too_far(path: Path, inflated: int, read: int) -> bool:
        far = inflated > (1 << 20) and inflated > trace_file.MAX_INFLATION * read
        if far:
            refused_at.append(inflated)
        return far

    monkeypatch.setattr(trace_file, "inflating_too_far", too_far)
    monkeypatch.setattr(trace_stream, "inflating_too_far", too_far)
    bomb = tmp_path / "t.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b"[")
        for _ in range(200):
            f.write(b" " * (1 << 20))
        f.write(b"]")
    if streamed:
        assert "gzip bomb" in _refused(bomb)
    else:
        with pytest.raises(BundleError, match="gzip bomb"):
            trace_file.read_trace(bomb)
    assert refused_at and refused_at[0] < trace_file.inflated_cap(bomb) // 2


def _bundle_copy(tmp_path: Path) -> Path:
    bundle = tmp_path / "run"
    shutil.copytree(TRACE.parent, bundle)
    return bundle


def _first_error(raw: bytes) -> str:
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at byte {exc.pos}"
    raise AssertionError("the cut trace parsed")


def _with_long_name(length: int) -> bytes:
    """The recorded trace with one more event, whose name is `length` bytes of text that gzip hardly shrinks."""
    name = os.urandom(length // 2).hex()
    text = _trace_text().replace('"traceEvents": [', '"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "'
                                 + name + '", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, ', 1)
    assert text.count(name) == 1
    return text.encode()


@pytest.mark.e2e  # its 4 MB trace is inflated in a process (gpudoctor.bundle.inflater)
def test_an_event_longer_than_any_trace_holds_is_refused_in_one_sentence(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_stream, "MAX_EVENT_BYTES", 1 << 20)
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 64 << 10)
    said = _refused(_write_gz(tmp_path / "t.json.gz", _with_long_name(4 << 20)))
    assert "an event longer than 1 MB" in said and "not a profiler trace" in said, said


def test_a_long_event_is_searched_once_not_once_per_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An event of 1 MB read in blocks of 16 kB: every search for a place to cut starts where the last one ended,
    so the bytes searched stay near the trace's length (each search from the event's start made it quadratic)."""
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 16 << 10)
    searched: list[int] = []
    search = trace_stream._last_event_end

    def counted(buf: bytes, lo: int, hi: int) -> int | None:
        searched.append(hi - lo)
        return search(buf, lo, hi)

    monkeypatch.setattr(trace_stream, "_last_event_end", counted)
    data = _with_long_name(1 << 20)
    trace = parse_trace(_write_gz(tmp_path / "t.json.gz", data))
    assert any(len(e.name) == 1 << 20 for e in trace.ops)
    assert sum(searched) < 3 * len(data), (sum(searched), len(data))
