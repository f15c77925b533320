"""The bundle's typed records: a wrong type anywhere in the manifest, the events or the samples is refused at
load, as exit 65 with one sentence that names the file; older bundles without later fields still load."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from conftest import Gpudoctor
from gpudoctor import bundle
from gpudoctor.analysis import Run
from gpudoctor.bundle.events import EVENT_DECODER, StepEvent
from gpudoctor.bundle.manifest import Manifest
from gpudoctor.bundle.records import first_line
from gpudoctor.errors import BundleError

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "bundles" / "blocking_copy_d2h_bad"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(FIXTURE, copy)
    return copy


def _edit_manifest(change: Callable[[dict], None]) -> Callable[[Path], str]:
    def edit(run_dir: Path) -> str:
        path = run_dir / "manifest.json"
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))
        return "manifest.json"
    return edit


def _append(file: str, line: str) -> Callable[[Path], str]:
    def edit(run_dir: Path) -> str:
        with open(run_dir / file, "a") as f:
            f.write(line + "\n")
        return file
    return edit


def _edit_first_step(change: Callable[[dict], None]) -> Callable[[Path], str]:
    def edit(run_dir: Path) -> str:
        path = run_dir / "events.jsonl"
        lines = path.read_text().splitlines()
        index = next(i for i, line in enumerate(lines) if '"kind":"step"' in line)
        event = json.loads(lines[index])
        change(event)
        lines[index] = json.dumps(event)
        path.write_text("\n".join(lines) + "\n")
        return "events.jsonl"
    return edit


MUTATIONS = {
    "files is a number": _edit_manifest(lambda m: m.update(files=5)),
    "host is null": _edit_manifest(lambda m: m.update(host=None)),
    "gpus is a string": _edit_manifest(lambda m: m.update(gpus="A100")),
    "collectors is null": _edit_manifest(lambda m: m.update(collectors=None)),
    "target args is a number": _edit_manifest(lambda m: m["target"].update(args=7)),
    "exit is a list": _edit_manifest(lambda m: m.update(exit=[1])),
    "window is a string": _edit_manifest(lambda m: m.update(window="x")),
    "a gpu's memory is a string": _edit_manifest(lambda m: m["gpus"][0].update(memory_total="lots")),
    "a negative duration": _edit_manifest(lambda m: m.update(duration_s=-3)),
    "a step with no number": _edit_first_step(lambda e: e.update(step=None)),
    "a step whose wall time is text": _edit_first_step(lambda e: e.update(wall_s="x")),
    "a copy whose direction is unknown": _edit_first_step(
        lambda e: e.update(copies=[{"direction": "sideways", "count": 1}])),
    "an event line that is null": _append("events.jsonl", "null"),
    "an event of an unknown kind": _append("events.jsonl", '{"kind": "teleport", "t": 1}'),
    "a host sample without its time": _append("samples/host.jsonl", "{}"),
    "a process sample whose pid is text": _append("samples/procs.jsonl", '{"t": 1, "procs": [{"pid": "one"}]}'),
    "a GPU sample that is a list": _append("samples/gpu.jsonl", "[1, 2]"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_wrong_type_is_refused_at_load_naming_the_file(mutation: str, run_dir: Path) -> None:
    file = MUTATIONS[mutation](run_dir)
    with pytest.raises(BundleError) as raised:
        Run.from_bundle(run_dir).steps  # noqa: B018 - the views read every file
    message = str(raised.value)
    assert file in message and message.endswith(".") and "\n" not in message, message


@pytest.mark.parametrize("mutation",
                         ["host is null", "a step whose wall time is text", "a host sample without its time"])
def test_analyze_exits_65_with_one_sentence(mutation: str, run_dir: Path, gd: Gpudoctor) -> None:
    file = MUTATIONS[mutation](run_dir)
    result = gd.run("analyze", str(run_dir))
    assert result.returncode == 65, result
    assert len(result.messages) == 1 and file in result.first_message, result
    assert "Traceback" not in result.stderr


def test_a_schema_version_written_as_text_is_named_so(run_dir: Path) -> None:
    _edit_manifest(lambda m: m.update(schema_version="1"))(run_dir)
    with pytest.raises(BundleError, match="schema_version is not a whole number"):
        bundle.load(run_dir)


def test_fields_added_later_have_defaults_so_older_bundles_load(run_dir: Path) -> None:
    def drop_late_fields(m: dict) -> None:
        m["window"].pop("every_s", None)
        m["child"]["process"].pop("main_native_id", None)
        m["child"]["process"].pop("switch_interval_s", None)

    _edit_manifest(drop_late_fields)(run_dir)
    run = Run.from_bundle(run_dir)
    assert run.manifest.window is not None and run.manifest.window.every_s is None
    assert run.host.env.switch_interval_s is None and run.host.python_thread_ids is None
    assert run.steps


def test_every_recorded_fixture_reads_and_writes_back_the_same_records() -> None:
    for path in sorted(FIXTURE.parent.iterdir()):
        if not (path / "events.jsonl").is_file():
            continue
        events = list(bundle.read_jsonl(path / "events.jsonl", EVENT_DECODER))
        assert [EVENT_DECODER.decode(bundle.jsonio.encode(e)) for e in events] == events, path.name
        manifest = bundle.read_manifest(path)
        assert msgspec.json.decode(bundle.jsonio.encode(manifest), type=Manifest) == manifest, path.name
        assert any(isinstance(e, StepEvent) for e in events), path.name


@pytest.mark.parametrize(("message", "line"), [
    ("bad batch", "bad batch"),
    ("Load failed. Read \x1b[1monly if you trust it\x1b[0m. \n\tdetails", "Load failed. Read only if you trust it."),
    ("\n  CUDA out of memory.  \nmore", "CUDA out of memory."),
    ("", ""),
    (None, ""),
])
def test_an_exceptions_message_is_quoted_by_its_first_line_without_terminal_codes(message: str | None,
                                                                                    line: str) -> None:
    assert first_line(message) == line


def test_a_quoted_message_is_cut_at_its_limit() -> None:
    assert first_line("x" * 300) == "x" * 200 and first_line("abcdef", 3) == "abc"


def test_a_long_message_ends_at_a_whole_sentence_or_word() -> None:
    """CUDA's out-of-memory message on an H200: its first line runs on for 400 characters."""
    oom = ("CUDA out of memory. Tried to allocate 279.60 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
           "138.99 GiB is free. Including non-PyTorch memory, this process has 826.00 MiB memory in use. Of the "
           "allocated memory 64.00 MiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated.")
    assert first_line(oom) == ("CUDA out of memory. Tried to allocate 279.60 GiB. GPU 0 has a total capacity of "
                               "139.80 GiB of which 138.99 GiB is free. Including non-PyTorch memory, this process "
                               "has 826.00 MiB memory in use.")
    assert first_line("the batch of images, labels and masks", 20) == "the batch of images…"
