"""The run's events as Run holds them: steps outside the windows in columns, every event read back as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor import bundle
from gpudoctor.analysis import Run
from gpudoctor.analysis.events import RunEvents, StepLog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"


def plain(step: int, t0: float, window: str = "closed") -> dict:
    return {"kind": "step", "step": step, "t0": t0, "t1": t0 + 0.1, "wall_s": 0.1, "data_wait_s": 0.02,
            "batches": 1, "source": "optimizer", "window": window, "t": t0 + 0.1000001}


def test_every_step_reads_back_equal_in_order() -> None:
    profiled = {**plain(2, 3.0, "active"), "window_index": 0, "phases": {"forward": 0.01}, "copies": []}
    odd_types = {**plain(3, 4.0), "t0": 4}  # an int where the recorder writes a float: kept whole, type and all
    extra_field = {**plain(4, 5.0), "note": "x"}
    other_order = dict(reversed(list(plain(5, 6.0).items())))
    events = [plain(0, 1.0, "waiting"), plain(1, 2.0, "warmup"), profiled, odd_types, extra_field, other_order,
              {**plain(6, 7.0), "source": "dataloader"}]
    log = StepLog()
    for event in events:
        log.append(event)
    read = list(log)
    assert read == events
    assert [list(e) for e in read] == [list(e) for e in events]  # the fields in the order written
    assert type(read[3]["t0"]) is int and type(read[0]["t0"]) is float
    assert list(log.between(2, 4)) == events[2:4] and list(log.between(5, 99)) == events[5:]
    assert list(log.numbers) == [0, 1, 2, 3, 4, 5, 6]
    assert [mark[:2] for mark in log.window_marks()] == [("waiting", 0), ("warmup", 0), ("active", 0)] + [
        ("closed", 0)] * 4
    assert list(log.window_marks())[2][2:] == (3.0, 3.1)


def test_run_events_split_steps_from_the_rest() -> None:
    events = [{"kind": "process", "pid": 1}, plain(0, 1.0), {"kind": "window", "state": "opened", "index": 0,
                                                              "first_step": 1, "t": 1.5}, plain(1, 2.0)]
    split = RunEvents(iter(events))  # read once, as the bundle streams them
    assert list(split.steps) == [events[1], events[3]]
    assert split.others == [events[0], events[2]]
    assert list(split.steps_of(0)) == [events[1], events[3]] and split.others_of(0) == split.others


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if (p / "events.jsonl").is_file()))
def test_a_recorded_bundles_events_read_back_as_written(name: str) -> None:
    written = list(bundle.read_jsonl(FIXTURES / name / "events.jsonl"))
    run = Run.from_bundle(FIXTURES / name)
    steps = [e for e in written if e.get("kind") == "step"]
    assert list(run._whole.steps) == steps
    assert [e for e in written if e.get("kind") != "step"] == run._whole.others
    # Each window's Run reads its own steps, which together are the run's.
    by_window = [e for w in run.windows or [None] for e in (run.for_window(w.index) if w else run).events("step")]
    assert by_window == steps
