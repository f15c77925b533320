"""The run's events as Run holds them: steps outside the windows in columns, every event read back as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor import bundle
from gpudoctor.analysis import Run
from gpudoctor.analysis.events import RunEvents, StepLog
from gpudoctor.bundle.events import EVENT_DECODER, Phases, ProcessEvent, StepEvent, WindowEvent

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "bundles"


def plain(step: int, t0: float, window: str = "closed", **fields: object) -> StepEvent:
    values: dict = {"step": step, "t0": t0, "t1": t0 + 0.1, "wall_s": 0.1, "data_wait_s": 0.02, "batches": 1,
                    "source": "optimizer", "window": window, "t": t0 + 0.1000001, **fields}
    return StepEvent(**values)


def test_every_step_reads_back_equal_in_order() -> None:
    profiled = plain(2, 3.0, "active", window_index=0, phases=Phases(forward=0.01), copies=[])
    untimed = plain(3, 4.0, t=None)  # written without its own `t`: read back without one
    repeated_window = plain(4, 5.0, "active", window_index=1)
    events = [plain(0, 1.0, "waiting"), plain(1, 2.0, "warmup"), profiled, untimed, repeated_window,
              plain(5, 6.0), plain(6, 7.0, source="dataloader"), plain(7, 8.0, backwards=1)]
    log = StepLog()
    for event in events:
        log.append(event)
    read = list(log)
    assert read == events
    assert read[3].t is None and read[0].t == events[0].t
    assert list(log.between(2, 4)) == events[2:4] and list(log.between(5, 99)) == events[5:]
    assert read[7].backwards == 1  # one backward() a step: held in the columns, not kept whole
    assert list(log.numbers) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [mark[:2] for mark in log.window_marks()] == [("waiting", 0), ("warmup", 0), ("active", 0), ("closed", 0),
                                                          ("active", 1), ("closed", 0), ("closed", 0), ("closed", 0)]
    assert list(log.window_marks())[2][2:] == (3.0, 3.1)


def test_only_steps_outside_the_windows_are_held_as_columns() -> None:
    log = StepLog()
    log.append(plain(0, 1.0))
    log.append(plain(1, 2.0, "active", phases=Phases()))
    assert list(log._kept_whole) == [1]


def test_run_events_split_steps_from_the_rest() -> None:
    events = [ProcessEvent(pid=1), plain(0, 1.0), WindowEvent(state="opened", index=0, first_step=1, t=1.5),
              plain(1, 2.0)]
    split = RunEvents(iter(events))  # read once, as the bundle streams them
    assert list(split.steps) == [events[1], events[3]]
    assert split.others == [events[0], events[2]]
    assert list(split.steps_of(0)) == [events[1], events[3]]
    assert split.others_of(0, WindowEvent) == [events[2]] and split.others_of(0, ProcessEvent) == [events[0]]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if (p / "events.jsonl").is_file()))
def test_a_recorded_bundles_events_read_back_as_written(name: str) -> None:
    written = list(bundle.read_jsonl(FIXTURES / name / "events.jsonl", EVENT_DECODER))
    run = Run.from_bundle(FIXTURES / name)
    steps = [e for e in written if isinstance(e, StepEvent)]
    assert list(run._whole.steps) == steps
    assert [e for e in written if not isinstance(e, StepEvent)] == run._whole.others
    # Each window's Run reads its own steps, which together are the run's.
    by_window = [e for w in run.windows or [None] for e in (run.for_window(w.index) if w else run).step_events()]
    assert by_window == steps
