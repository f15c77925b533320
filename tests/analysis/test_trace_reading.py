"""Reading a trace in chunks (gpudoctor.bundle.trace_stream.TraceStream) and parsing it compactly
(analysis.trace.parse_trace).

Whatever the chunk size, the layout of the JSON or the parser's path (chunks decoded into Structs, events picked
out of the bytes, or whole chunks parsed into dicts), the result must be what a plain json.loads of the whole file
gives: the views computed straight from it, and every record the builder makes of its dicts.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis import Run, trace
from gpudoctor.analysis.trace import SYNC_RUNTIME, TraceData, parse_trace
from gpudoctor.bundle import trace_stream
from gpudoctor.errors import BundleError
from gpudoctor.ui.trace_progress import TraceProgress

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "bundles" / "blocking_copy_bad" / "trace.json.gz"  # with CPU operators


def _rows(items: list[Any]) -> list[tuple]:
    return [dataclasses.astuple(x) for x in items]


def _reference(raw: dict[str, Any]) -> dict[str, Any]:
    """What the views need, computed straight from the whole JSON."""
    base = float(raw.get("baseTimeNanoseconds", 0)) / 1e9
    gpu, syncs, steps = [], [], {}
    for e in raw["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        start = base + float(e["ts"]) / 1e6
        end = start + float(e.get("dur", 0)) / 1e6
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append((e["name"], start, end))
        elif e.get("cat") == "cuda_runtime" and e["name"] in SYNC_RUNTIME:
            syncs.append((e["name"], start, end))
        elif e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            steps[int(e["name"].split("#")[1])] = (start, end)
    return {"gpu": sorted(gpu, key=lambda r: r[1]), "syncs": sorted(syncs, key=lambda r: r[1]), "steps": steps}


def _views(data: TraceData) -> dict[str, Any]:
    return {"gpu": [(o.name, o.start, o.end) for o in data.gpu_ops],
            "syncs": [(r.name, r.start, r.end) for r in data.runtime if r.name in SYNC_RUNTIME], "steps": data.steps}


def _records(data: TraceData) -> dict[str, Any]:
    """Everything a parse keeps, as plain tuples."""
    return {"gpu_ops": _rows(data.gpu_ops), "runtime": _rows(data.runtime), "annotations": _rows(data.annotations),
            "python": _rows(data.python), "ops": _rows(data.ops), "steps": data.steps,
            "device_properties": data.device_properties, "detail": data.detail}


def _straight(raw: dict[str, Any] | list[Any], path: Path, detail: bool) -> TraceData:
    """The whole JSON, parsed at once, through the builder's rules for dicts (the reader before Structs)."""
    trace_obj = raw if isinstance(raw, dict) else {"traceEvents": raw}
    meta = {k: v for k, v in trace_obj.items() if k != "traceEvents"}
    return trace._parse(path, iter([trace_obj["traceEvents"]]), meta, detail)


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many chunks decoded into Structs ("typed") and how many did not ("fallback")."""
    counts = {"typed": 0, "fallback": 0}
    decode = trace_stream.TypedEvents.decode

    def counted(self: trace_stream.TypedEvents[Any], data: bytes) -> list[Any] | None:
        events = decode(self, data)
        counts["typed" if events is not None else "fallback"] += 1
        return events

    monkeypatch.setattr(trace_stream.TypedEvents, "decode", counted)
    return counts


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    with gzip.open(FIXTURE, "rb") as f:
        return json.loads(f.read())


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 4096)  # dozens of chunks even for a small fixture


def _write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_compact_and_detailed_parses_agree_on_the_views(raw: dict[str, Any], small_chunks: None) -> None:
    detailed, compact = parse_trace(FIXTURE, detail=True), parse_trace(FIXTURE, detail=False)
    assert detailed.detail and not compact.detail
    assert _views(detailed) == _views(compact) == _reference(raw)
    assert _rows(compact.gpu_ops) == _rows(detailed.gpu_ops)
    assert compact.ops == [] and compact.python == [] and detailed.ops
    assert all(r.name in SYNC_RUNTIME for r in compact.runtime) and any(r.name in SYNC_RUNTIME for r in compact.runtime)
    assert compact.device_properties == raw["deviceProperties"]


def test_findings_of_a_compact_parse_are_those_of_a_detailed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.pipeline import RuleSelection, diagnose_run, prepare_rules, report_of

    prepared = prepare_rules(RuleSelection())
    reports = []
    for detail in (True, False):
        run = Run.from_bundle(FIXTURE.parent)
        run.__dict__["trace"] = parse_trace(FIXTURE, detail=detail)
        report = report_of(diagnose_run(run, prepared))
        reports.append((report["findings"], {**report["run"], "budget": _merged_host(report["run"]["budget"])}))
    assert reports[0] == reports[1]


def _merged_host(budget: dict[str, Any] | None) -> dict[str, Any] | None:
    """The budget with its host and unexplained slices as one: a compact parse keeps no launch calls, so it
    cannot tell them apart (analysis.budget); every other slice must be the same."""
    if budget is None:
        return None
    slices = {s["slice"]: s for s in budget["slices"]}
    host, unexplained = slices.pop("host"), slices.pop("unexplained")
    merged = {key: round(host[key] + unexplained[key], 6) for key in ("seconds", "share")}
    return {**budget, "slices": [*slices.values(), merged]}


@pytest.mark.parametrize("layout", ["indented", "compact", "events_first", "bare_list"])
@pytest.mark.parametrize("suffix", [".json.gz", ".json"])
@pytest.mark.parametrize("detail", [True, False])
def test_any_layout_in_any_chunks_reads_as_json_loads(raw: dict[str, Any], tmp_path: Path, small_chunks: None,
                                                      layout: str, suffix: str, detail: bool) -> None:
    events = raw["traceEvents"]
    if layout == "indented":
        text = json.dumps(raw, indent=2)
    elif layout == "compact":
        text = json.dumps(raw, separators=(",", ":"))
    elif layout == "events_first":  # baseTimeNanoseconds after the events: they wait for it
        text = json.dumps({"traceEvents": events, **{k: v for k, v in raw.items() if k != "traceEvents"}})
    else:
        text = json.dumps(events)
    data = parse_trace(_write(tmp_path / f"trace{suffix}", text), detail=detail)
    expected = raw if layout != "bare_list" else {"traceEvents": events}
    assert _views(data) == _reference(expected)
    assert _records(data) == _records(_straight(expected, data.path, detail))


def test_awkward_events_are_parsed_whole_not_lost(raw: dict[str, Any], tmp_path: Path, small_chunks: None) -> None:
    """Separators inside strings and arrays of objects inside args defeat picking events out of the bytes: the
    chunk is then parsed whole, and nothing is lost."""
    events = [_made_awkward(i, dict(e)) for i, e in enumerate(raw["traceEvents"])]
    text = json.dumps({**raw, "traceEvents": events}, indent=1)
    data = parse_trace(_write(tmp_path / "trace.json.gz", text), detail=False)
    assert _views(data) == _reference({**raw, "traceEvents": events})
    assert _records(data) == _records(_straight({**raw, "traceEvents": events}, data.path, False))


def _made_awkward(i: int, e: dict[str, Any]) -> dict[str, Any]:
    """Event number i, changed in place or replaced, by the rules of the test above."""
    if e.get("cat") == "kernel" and i % 3 == 0:
        e["name"] = e["name"] + '"}, {"cat": "kernel"'
    if e.get("cat") == "cpu_op" and i % 5 == 0:
        e["args"] = {"inputs": [{"cat": "kernel", "ph": "X"}, {"n": 1}], **(e.get("args") or {})}
    if e.get("cat") == "cuda_runtime" and i % 7 == 0:  # the name before the category
        e = {"name": e["name"], **e}
    if e.get("cat") == "cuda_runtime" and e["name"] in SYNC_RUNTIME and i % 2 == 0:  # a '}, {' before the name
        name = e.pop("name")
        e["args"] = {"list": [{"a": 1}, {"b": 2}], **(e.get("args") or {})}
        e["name"] = name
    return e


RECORDED = sorted((ROOT / "fixtures" / "bundles").glob("*/trace.json.gz"))


@pytest.mark.parametrize("detail", [True, False])
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.parent.name)
def test_every_recorded_trace_decodes_into_structs_as_a_straight_parse(
        path: Path, detail: bool, decoded: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_stream, "CHUNK_BYTES", 64 << 10)
    with gzip.open(path, "rb") as f:
        raw = json.loads(f.read())
    data = parse_trace(path, detail=detail)
    assert _records(data) == _records(_straight(raw, path, detail))
    assert decoded["typed"] > 0 and decoded["fallback"] == 0, decoded  # no chunk of a recorded trace falls back


def _made_odd(i: int, e: dict[str, Any]) -> Any:
    """Event number i with a value of another type than the Structs take, which the rules for dicts keep (converted)
    or skip; or, now and then, something that is not an event at all."""
    cat, rule = e.get("cat"), i % 17
    if i % 211 == 0:
        return [7, None, "event", [], {"ph": 1}][i % 5]
    if cat == "kernel":
        args = e.get("args") or {}
        changes = [{"ts": str(e.get("ts"))}, {"args": {**args, "device": "0"}}, {"args": {**args, "stream": None}},
                   {"pid": True, "args": {k: v for k, v in args.items() if k != "device"}}, {"args": []},
                   {"args": [1]}, {"dur": None}, {"name": 5}, {"args": {**args, "bytes": 1.5}},
                   {"ts": 9007199254740993}, {"cat": ["kernel"]}, {"dur": True},
                   {"args": {**args, "warps per SM": "3"}}, {"args": {**args, "warps per SM": True}}]
        return {**e, **changes[rule]} if rule < len(changes) else e
    if cat == "cuda_runtime" and e.get("name") in SYNC_RUNTIME and rule < 3:
        return {**e, "tid": ["x", "not hashable", {"a": 1}][rule]}
    if cat == "user_annotation" and rule < 2:
        return {**e, "dur": [True, "1.5"][rule]}
    if cat == "python_function" and rule == 0:
        return {**e, "args": {**(e.get("args") or {}), "Python id": "7"}}
    if "ts" in e and rule == 5:
        return {k: v for k, v in e.items() if k != "ts"}
    return e


@pytest.mark.parametrize("detail", [True, False])
def test_chunks_the_structs_cannot_take_are_read_as_dicts_by_the_same_rules(
        raw: dict[str, Any], tmp_path: Path, small_chunks: None, decoded: dict[str, int], detail: bool) -> None:
    events = [_made_odd(i, e) for i, e in enumerate(raw["traceEvents"])]
    odd = {**raw, "traceEvents": events}
    data = parse_trace(_write(tmp_path / "trace.json.gz", json.dumps(odd, indent=1)), detail=detail)
    assert _records(data) == _records(_straight(odd, data.path, detail))
    assert decoded["typed"] > 0 and decoded["fallback"] > 0, decoded
    assert any(isinstance(op.name, int) for op in data.gpu_ops) and any(op.bytes == 1.5 for op in data.gpu_ops)


@pytest.mark.parametrize(("key", "value"), [
    ("dur", "-5"), ("dur", "-0.001"), ("dur", "Infinity"), ("dur", "NaN"), ("dur", "1e400"), ("dur", "null"),
    ("dur", '"x"'), ("ts", "1e400"), ("ts", "-1e400"), ("ts", "NaN"), ("ts", "null"), ("ts", "[1]"),
])
def test_a_kernel_without_a_finite_start_or_duration_is_left_out_on_every_path(
        raw: dict[str, Any], tmp_path: Path, small_chunks: None, key: str, value: str) -> None:
    """Negative durations decode into the Structs and are skipped there; the rest fall back to dicts (or, for what
    orjson refuses, to the whole file read by the json module) and are skipped there."""
    text = json.dumps(raw, indent=1)
    at = text.index(f'"{key}": ', text.rindex("{", 0, text.index('"cat": "kernel"')))
    bad = text[:at] + f'"{key}": {value}, "was": ' + text[at + len(key) + 4:]
    data = parse_trace(_write(tmp_path / "trace.json.gz", bad), detail=False)
    assert data.gpu_ops and all(0 <= op.dur < 1e3 for op in data.gpu_ops)
    assert len(data.gpu_ops) == len(parse_trace(FIXTURE, detail=False).gpu_ops) - 1


def test_a_truncated_gzip_trace_keeps_what_it_read_and_says_where_it_ends(tmp_path: Path,
                                                                        small_chunks: None) -> None:
    path = tmp_path / "trace.json.gz"
    data = FIXTURE.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    found = parse_trace(path, detail=False)
    assert found.cut_short is not None and 0 < found.cut_short <= len(data) // 2
    path.write_bytes(data[:20])  # the header alone: no event to keep, and the sentence as before
    with pytest.raises(BundleError, match="truncated or not gzip"):
        parse_trace(path, detail=False)


@pytest.mark.parametrize("detail", [True, False])
def test_a_truncated_json_trace_says_so(raw: dict[str, Any], tmp_path: Path, small_chunks: None,
                                        detail: bool) -> None:
    text = json.dumps(raw, indent=2)
    path = _write(tmp_path / "trace.json", text[: len(text) // 2])
    with pytest.raises(BundleError, match="is not a complete JSON trace"):
        parse_trace(path, detail=detail)


def test_json_that_is_not_a_trace_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path / "trace.json", json.dumps({"traceEvents": {"not": "a list"}}))
    with pytest.raises(BundleError, match="not a Chrome trace"):
        parse_trace(path)


def test_progress_hears_each_chunk_and_is_closed(tmp_path: Path, small_chunks: None) -> None:
    heard: list[tuple[int, int]] = []

    class Progress:
        closed = False

        def __call__(self, done: int, total: int) -> None:
            heard.append((done, total))

        def close(self) -> None:
            self.closed = True

    progress = Progress()
    parse_trace(FIXTURE, progress, detail=False)
    size = FIXTURE.stat().st_size
    assert len(heard) > 3 and heard[-1] == (size, size) and progress.closed
    assert [d for d, _ in heard] == sorted(d for d, _ in heard)


def test_trace_progress_draws_only_on_a_terminal_and_clears_its_line() -> None:
    assert TraceProgress.on_terminal(io.StringIO()) is None  # piped or redirected: nothing at all
    out = io.StringIO()
    progress = TraceProgress(out, delay_s=0.0, interval_s=0.0)
    progress(25, 100)
    progress.close()
    assert "reading the trace:  25% (0 of 0 MB)" in out.getvalue() and out.getvalue().endswith("\r\x1b[2K")


def test_a_trace_that_cannot_be_read_is_read_once_and_before_any_rule(tmp_path, monkeypatch) -> None:
    """A received trace that is no JSON (a gzip bomb's zeros, once) was read again by each of 23 rules, inside each
    one's time limit: now one read, before the rules, whose error is the analysis's one sentence."""
    from gpudoctor.analysis import run as run_module
    from gpudoctor.analysis.run import Run
    from gpudoctor.engine import builtin_rules, run_rules
    from gpudoctor.errors import BundleError

    reads = []
    real = run_module.parse_trace

    def counted(*args, **kwargs):
        reads.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "parse_trace", counted)
    bad = tmp_path / "trace.json"
    bad.write_bytes(b"\0" * 4096)
    run = Run.from_trace(bad)
    with pytest.raises(BundleError):
        run_rules(run, builtin_rules())
    with pytest.raises(BundleError):
        _ = run.trace
    assert len(reads) == 1


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_trace_cut_short_keeps_the_events_read_and_says_where_it_ends(tmp_path, suffix: str) -> None:
    """A run killed while its trace was written: the events before the cut are analysed, in the one streaming
    read (never the whole file again with json.loads), and the trace says where it ends."""
    import gzip as gzip_module

    from gpudoctor.analysis.trace import parse_trace
    from gpudoctor.testing.fixtures import fixture_path

    whole = gzip_module.decompress((fixture_path("small_batch_bad") / "trace.json.gz").read_bytes())
    full = parse_trace(_written(tmp_path / "whole.json", whole))
    cut = tmp_path / f"cut{suffix}"
    if suffix == ".json":
        cut.write_bytes(whole[:len(whole) * 7 // 10])
    else:
        packed = gzip_module.compress(whole)
        cut.write_bytes(packed[:len(packed) * 7 // 10])
    found = parse_trace(cut)
    assert found.cut_short is not None and full.cut_short is None
    assert 0 < len(found.gpu_ops) < len(full.gpu_ops)


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


def test_a_run_whose_trace_was_cut_short_is_reported_from_what_it_holds(tmp_path) -> None:
    import shutil

    from gpudoctor.analysis.run import Run
    from gpudoctor.engine import builtin_rules, run_rules
    from gpudoctor.report.model import build_report
    from gpudoctor.testing.fixtures import fixture_path

    bundle = tmp_path / "run"
    shutil.copytree(fixture_path("small_batch_bad"), bundle)
    trace = bundle / "trace.json.gz"
    packed = trace.read_bytes()
    trace.write_bytes(packed[:len(packed) * 6 // 10])
    run = Run.from_bundle(bundle)
    assert run.trace is not None and run.trace.cut_short is not None and run.gpu_work.kernels is not None
    report = build_report(run, run_rules(run, builtin_rules()))
    [row] = [r for r in report["not_measured"] if r["what"] == "the end of the profiler trace"]
    assert "ends early" in row["reason"] and "the events before that are analysed" in row["reason"]
