"""A measured try says, beside its speed-up, how far it moved the loss and how long compiling took."""

from __future__ import annotations

from gpudoctor.report.tried import tried_text


def test_a_numerics_try_says_how_far_the_loss_moved_and_the_compile_time_apart() -> None:
    finding = {"saving_s": 0.002, "tried": {"status": "measured", "step_s": 0.0036, "speedup": 1.03,
                                            "tier": "numerics", "loss_delta": 0.001457, "compile_s": 12.34}}
    assert tried_text(0.0037, finding) == ("predicted ~1.7 ms/step, measured 3.6 ms/step with the fix "
                                           "(no faster (1.03×)); the loss moved 0.15% from the diagnosed run's, "
                                           "compiling took 12.3 s, before the steps timed")


def test_a_try_that_left_the_loss_as_it_was_says_so_and_an_older_one_says_nothing_more() -> None:
    same = {"tried": {"status": "measured", "step_s": 0.002, "speedup": 2.0, "tier": "same", "loss_delta": 0.0,
                      "compile_s": None}}
    assert tried_text(None, same).endswith("(2.00× faster); the loss did not move from the diagnosed run's")
    older = {"tried": {"status": "measured", "step_s": 0.002, "speedup": 2.0}}
    assert tried_text(None, older).endswith("(2.00× faster)")


def test_a_try_that_keeps_the_computation_and_moved_the_loss_says_what_moved_it() -> None:
    """Workers drawing a dataset's random samples moved the loss 1.81% (a Lightning script on the CPU): the fix
    keeps the computation, and the sentence must not read as though it changed the numerics."""
    workers = {"tried": {"status": "measured", "step_s": 0.0062, "speedup": 7.52, "tier": "same",
                         "loss_delta": 0.0181, "compile_s": None}}
    assert tried_text(None, workers).endswith(
        "the loss moved 1.81% from the diagnosed run's (this fix keeps the computation: the script's own randomness, "
        "such as random data drawn in loader workers, or sums rounded in another order, moved it)")
    numerics = {"tried": {**workers["tried"], "tier": "numerics"}}
    assert tried_text(None, numerics).endswith("the loss moved 1.81% from the diagnosed run's")
