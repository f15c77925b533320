"""Step spans: a long run's plain steps summarised as they are written, and read back as the steps they hold."""

from __future__ import annotations

import itertools
import random
import statistics

import msgspec
import pytest

from builtin_rules.test_rules_cpu_e2e import SCRIPT_TIMEOUT_S, WINDOW, assert_fires, evidence, line_of, rule_script
from conftest import Gpudoctor
from gpudoctor.bundle.events import StepEvent, StepSpanEvent
from gpudoctor.bundle.step_spans import RAW_STEPS, StepSpans, expand


def _steps(count: int, stall_every: int = 0, seed: int = 1) -> list[StepEvent]:
    """Steps of 10 ms +-10%, every 7th waiting 3 ms for data, and with `stall_every` a 200 ms stall that often."""
    rng, t, steps = random.Random(seed), 1000.0, []
    for n in range(count):
        wall = 0.01 * rng.uniform(0.9, 1.1) + (0.2 if stall_every and n % stall_every == stall_every - 1 else 0.0)
        wait = 0.003 if n % 7 == 0 else 0.0
        steps.append(StepEvent(step=n, t0=t, t1=t + wall, wall_s=wall, data_wait_s=wait, data_wait_cpu_s=wait / 2,
                               batches=1, backwards=1, forwards=1, source="optimizer", window="closed"))
        t += wall + 1e-4
    return steps


def _written(steps: list[StepEvent], spans: StepSpans) -> list[StepEvent | StepSpanEvent]:
    written = [event for step in steps for event in spans.take(step)]
    return written + spans.flush()


def _read_back(written: list[StepEvent | StepSpanEvent]) -> list[StepEvent]:
    return [s for e in written for s in (expand(e) if isinstance(e, StepSpanEvent) else [e])]


def test_the_first_steps_are_written_one_by_one_and_the_rest_as_spans_of_some_seconds() -> None:
    written = _written(_steps(3000), StepSpans(span_s=10.0, raw_steps=500))
    raw = [e for e in written if isinstance(e, StepEvent)]
    spans = [e for e in written if isinstance(e, StepSpanEvent)]
    assert [e.step for e in raw] == list(range(500))
    assert len(spans) == 3  # 2500 steps of ~10 ms: 25 s in spans of 10 s
    assert all(s.t1 - s.t0 < 10.1 for s in spans)
    assert spans[0].first_step == 500 and spans[-1].last_step == 2999


def test_a_span_reads_back_as_its_steps_with_their_median_total_and_waits() -> None:
    steps = _steps(3000)
    back = _read_back(_written(steps, StepSpans(raw_steps=0)))
    assert [s.step for s in back] == list(range(3000))
    assert statistics.median(s.wall_s for s in back) == pytest.approx(statistics.median(s.wall_s for s in steps),
                                                                      rel=0.01)
    assert sum(s.wall_s for s in back) == pytest.approx(sum(s.wall_s for s in steps), rel=0.005)
    assert sum(s.data_wait_s for s in back) == pytest.approx(sum(s.data_wait_s for s in steps), rel=0.005)
    assert sum(s.data_wait_cpu_s or 0 for s in back) == pytest.approx(sum(s.data_wait_cpu_s or 0 for s in steps))
    assert sum(s.batches for s in back) == 3000 and sum(s.backwards for s in back) == 3000
    assert all(s.plain for s in back)
    assert all(a.t1 <= b.t0 + 1e-9 for a, b in itertools.pairwise(back))  # in order, never overlapping
    assert back[0].t0 == steps[0].t0 and back[-1].t1 == steps[-1].t1


def test_the_stalls_stay_at_their_own_steps() -> None:
    steps = _steps(3000, stall_every=100)
    back = _read_back(_written(steps, StepSpans(raw_steps=0)))
    stalled = [s.step for s in back if s.wall_s > 0.1]
    assert stalled == [s.step for s in steps if s.wall_s > 0.1] == list(range(99, 3000, 100))
    by_number = {s.step: s for s in steps}
    assert all(s.t0 == by_number[s.step].t0 for s in back if s.wall_s > 0.1)


def test_the_expanded_steps_have_no_trend() -> None:
    """The summarised steps' order is lost; the one they take must not make the run look slower as it goes."""
    back = _read_back(_written(sorted(_steps(3000), key=lambda s: s.step), StepSpans(raw_steps=0)))
    half = len(back) // 2
    first, second = (statistics.mean(s.wall_s for s in part) for part in (back[:half], back[half:]))
    assert second == pytest.approx(first, rel=0.02)


def test_a_window_step_or_a_new_label_ends_the_span_before_it() -> None:
    steps = _steps(40)
    detail = msgspec.structs.replace(steps[20], window="active", window_index=1)
    warmed = [msgspec.structs.replace(s, window="waiting") for s in steps[21:30]]
    written = _written([*steps[:20], detail, *warmed, *steps[30:]], StepSpans(raw_steps=0))
    assert [type(e).__name__ for e in written] == ["StepSpanEvent", "StepEvent", "StepSpanEvent", "StepSpanEvent"]
    assert [s.step for s in _read_back(written)] == list(range(40))


def test_a_span_of_hours_of_steps_stays_small() -> None:
    """What one span costs on disk does not grow with the steps in it: 100 steps or 1000 of them in 10 s."""
    sizes = []
    for per_step in (0.1, 0.01):
        count = round(10 / per_step)
        steps = [StepEvent(step=n, t0=n * per_step, t1=(n + 1) * per_step, wall_s=per_step * (1 + (n % 13) / 100),
                           batches=1, backwards=1, source="optimizer", window="closed") for n in range(count)]
        (span,) = StepSpans(span_s=100.0, raw_steps=0).take(steps[0]) or [None]  # nothing written yet
        assert span is None
        written = _written(steps, StepSpans(span_s=100.0, raw_steps=0))
        sizes.append(sum(len(msgspec.json.encode(e)) for e in written))
    assert sizes[1] < 1.5 * sizes[0] and sizes[1] < 2000


@pytest.mark.e2e
def test_a_long_runs_stalls_are_found_at_their_line_through_the_spans(gd: Gpudoctor) -> None:
    """1500 steps: the first 500 written one by one, the rest as spans; a save every 40 steps, 25 of them in
    the spans, found at its line, and every step counted. Each save costs about 5% of the steps' time here, GD701's
    own threshold (4.6% to 5.1% in three runs on a 2-core VM): the test asks for 2%, since what it checks is that
    the spans keep the stalls, not where the threshold is."""
    script = rule_script("checkpoint_stall.py")
    result = gd.profile(str(script), "--every", "40", "--steps", "1500", timeout=SCRIPT_TIMEOUT_S,
                        options=(*WINDOW, "--rule-option", "GD701.min_share=0.02"))
    assert result.returncode == 0, result
    spans = result.events(StepSpanEvent)
    assert spans and spans[0].first_step >= RAW_STEPS
    plain_steps = [s for s in result.events(StepEvent) if s.step >= RAW_STEPS]
    assert len(plain_steps) < 20  # only a stall alone in its span, or a window's step, is written by itself
    assert result.findings()["run"]["steps_total"] == 1500
    finding = assert_fires(result, "GD701", "periodic_stall", script, line_of(script, "SAVE"))
    assert evidence(finding)["every"] == 40


def test_a_windows_steps_are_written_one_by_one_even_when_they_carry_nothing_else() -> None:
    """On a CPU-only run the first window's warm-up and active steps carry no CUDA memory figures and look plain:
    they are still written whole, the trace being aligned by their times."""
    steps = [msgspec.structs.replace(s, window="active") for s in _steps(20)]
    assert all(s.plain for s in steps)
    written = _written(steps, StepSpans(raw_steps=0))
    assert written == steps
