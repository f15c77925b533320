"""A program that evaluates before it trains (nanoGPT, a sanity check) has its evaluation calls counted as steps
until the optimizer's first step takes over: the window then starts over on the training steps, and the analysis
reads those alone."""

from __future__ import annotations

import statistics

from conftest import Gpudoctor, Result, script
from gpudoctor.analysis import Run
from gpudoctor.bundle.events import ForwardSiteEvent, StepEvent, WindowEvent

SLEEP_S = 0.02  # each training step's sleep: an evaluation call takes well under it


def _window_states(result) -> list[str]:
    return [e.state for e in result.events(WindowEvent)]


def _usual_step_s(result: Result) -> float:
    """The run's median step: what a training step took on this machine while it ran. Load on a shared machine
    slows every step's sleep, and the pace with it, by as much as it is under the bounds on SLEEP_S (a stalled run
    on two loaded cores paced 34-43 ms), while a few evaluations or a stall leave the median where it is."""
    return statistics.median(s.wall_s for s in Run.from_bundle(result.run_dir).step_view.all_steps)


def test_the_window_measures_the_training_steps_after_an_evaluation(gd: Gpudoctor) -> None:
    # 12 evaluation calls: the window (wait 1, warm-up 1, active 2, detail 1) opens and closes among them.
    result = gd.profile(script("eval_then_train.py"), "--eval-calls", "12", "--steps", "10")
    assert result.returncode == 0, result
    assert _window_states(result) == ["opened", "closed", "restarted", "opened", "closed"]
    run = result.findings()["run"]
    assert run["step_source"] == "optimizer"
    assert run["steps_total"] == 10
    assert run["steps_analysed"] == 2
    assert run["median_step_s"] >= SLEEP_S
    analysed = Run.from_bundle(result.run_dir)
    # the first also holds the last evaluation call
    assert all(s.wall_s >= SLEEP_S for s in analysed.step_view.all_steps[1:])
    # Numbered from 0 again, as a rank of the same job without the evaluation numbers them: the window opened one
    # step in (its wait), after a warm-up step.
    assert [s.index for s in analysed.step_view.all_steps] == list(range(10))
    assert [s.index for s in analysed.steps] == [2, 3]
    assert [w.first_step for w in analysed.windows] == [1]
    # Both windows' detail steps saw where the model is called; only the training loop's line is the run's.
    recorded = {e.site.function for e in result.events(ForwardSiteEvent) if e.site}
    assert recorded == {"evaluate", "main"}
    assert {e.site.function for e in analysed.events(ForwardSiteEvent) if e.site} == {"main"}
    assert [p.name for p in result.run_dir.glob("trace*")] == ["trace.json.gz"]


def test_a_window_open_when_training_begins_is_written_then_replaced(gd: Gpudoctor) -> None:
    # 3 evaluation calls: the window is still profiling when the optimizer's first step comes.
    result = gd.profile(script("eval_then_train.py"), "--eval-calls", "3", "--steps", "10")
    assert result.returncode == 0, result
    assert _window_states(result) == ["opened", "closed", "restarted", "opened", "closed"]
    recorded = result.events(StepEvent)
    restarted_at = next(e.first_step for e in result.events(WindowEvent) if e.state == "restarted")
    assert [e.window for e in recorded if e.step >= restarted_at - 1][:4] == ["waiting", "warmup", "active", "active"]
    run = result.findings()["run"]
    assert run["steps_total"] == 10 and run["steps_analysed"] == 2
    assert run["median_step_s"] >= SLEEP_S
    assert [p.name for p in result.run_dir.glob("trace*")] == ["trace.json.gz"]


def test_training_too_short_for_a_new_window_keeps_the_evaluations(gd: Gpudoctor) -> None:
    # The default window: 5 steps' wait, 2 warm-up, 5 active, 5 detail. 3 training steps never reach a new one.
    result = gd.profile(script("eval_then_train.py"), "--eval-calls", "20", "--steps", "3", options=())
    assert result.returncode == 0, result
    assert _window_states(result) == ["opened", "closed", "restarted", "ended_early"]
    run = result.findings()["run"]
    assert run["steps_analysed"] == 5  # the evaluation's window, measured before the restart, is what there is
    assert run["steps_total"] == 23
    assert run["step_source"] == "forward"  # what counted the analysed steps: the optimizer came after them
    assert (result.run_dir / "trace.json.gz").is_file()


def test_steps_that_run_an_evaluation_are_left_out_of_the_runs_pace(gd: Gpudoctor) -> None:
    # Every 8th training step (20 ms) also evaluates: 40 model calls of 5 ms. The pace is the training steps'.
    result = gd.profile(script("eval_then_train.py"), "--eval-calls", "0", "--steps", "40", "--eval-every", "8")
    assert result.returncode == 0, result
    run = result.findings()["run"]
    assert run["step_s_basis"] == "unprofiled"
    assert run["step_s_evaluations"] == 4  # steps 16, 24, 32 and 40: the window and its next step hold step 8
    # With them the pace would be 47 ms against 20 ms steps: 4 evaluations of 200 ms over 30 steps.
    assert SLEEP_S <= run["step_s"] < 2 * _usual_step_s(result)
    said = f"(the mean of {run['step_s_steps']} steps after the profiling window; 4 with an evaluation left out)"
    assert said in result.stderr


def test_a_rare_stall_is_left_out_of_the_runs_pace(gd: Gpudoctor) -> None:
    # Training step 40 of 80 (20 ms each) also sleeps 3 s, outside any wait for data: 150 times the usual step, and
    # still over STALL_FACTOR's 20 when load on two shared cores slows the steps to 40-50 ms (a 1 s stall was not).
    result = gd.profile(script("eval_then_train.py"), "--eval-calls", "0", "--steps", "80", "--stall-at", "40",
                        "--stall-s", "3")
    assert result.returncode == 0, result
    run = result.findings()["run"]
    assert (run["step_s_stalls"], run["step_s_evaluations"]) == (1, 0)
    # With it the pace would be 61 ms against 20 ms steps: 3 s over 73 steps.
    assert SLEEP_S <= run["step_s"] < 1.5 * _usual_step_s(result)
    assert "; 1 stalled left out)" in result.stderr


def test_a_training_loop_that_starts_at_once_opens_its_window_as_before(gd: Gpudoctor) -> None:
    result = gd.profile(script("eval_then_train.py"), "--eval-calls", "0", "--steps", "8")
    assert result.returncode == 0, result
    assert _window_states(result) == ["opened", "closed"]
    assert [e.window for e in result.events(StepEvent)][:2] == ["waiting", "warmup"]
