"""The pauses gpudoctor watches for in the script's process (collect/pauses.py) never change how the script ends."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpudoctor.collect import pauses
from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.pauses import PauseWatch
from gpudoctor.collect.recorder import Recorder


def test_ctrl_c_in_the_collections_callback_still_stops_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   request: pytest.FixtureRequest) -> None:
    """`gpudoctor profile --timeout 2` of a script that allocates in a loop: the SIGINT came while Python ran the
    callback gpudoctor gives the garbage collector, which prints and drops what a callback raises ("Exception
    ignored in ... _on_gc ... KeyboardInterrupt"), and the script would have run on. The interrupt reaches the
    script's own code once the callback has returned."""
    watch = PauseWatch(Recorder(ChildConfig(run_dir=str(tmp_path))))
    # Python's own handler of Ctrl-C, as a script on a terminal has it: a test suite started in the background
    # inherits SIGINT ignored, and the interrupt handed back to the script would then do nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

    def interrupted() -> float:
        raise KeyboardInterrupt  # where the signal's handler would raise it

    monkeypatch.setattr(pauses, "perf_counter", interrupted)
    returned = False
    with pytest.raises(KeyboardInterrupt):
        watch._on_gc("start", {"generation": 2})
        returned = True
        for _ in range(10_000_000):  # the script's code after the collection, where the interrupt is raised
            pass
    assert returned, "the callback raised the interrupt itself, where the collector would drop it"


def test_ctrl_c_at_the_callbacks_first_instruction_still_stops_the_script(tmp_path: Path) -> None:
    """A SIGINT that comes while a collection runs is handled at the callback's first instruction, before its
    `try`: the collector hands the KeyboardInterrupt to sys.unraisablehook, which printed "Exception ignored in ...
    _on_gc" and dropped it (tests/launch/test_endings.py::test_timeout, now and then). gpudoctor's hook delivers that
    one again to the script's own code, and leaves every other unraisable exception to the hook there was."""
    import sys
    import types

    watch = PauseWatch(Recorder(ChildConfig(run_dir=str(tmp_path))))
    seen: list[object] = []
    before, theirs = sys.unraisablehook, seen.append
    sys.unraisablehook = theirs
    try:
        watch._guard_unraisable()
        other = types.SimpleNamespace(exc_value=ValueError("x"), object=print)
        sys.unraisablehook(other)
        assert seen == [other]
        with pytest.raises(KeyboardInterrupt):
            sys.unraisablehook(types.SimpleNamespace(exc_value=KeyboardInterrupt(), object=watch._on_gc))
            for _ in range(10_000_000):  # the script's code after the collection, where the interrupt is raised
                pass
        assert seen == [other]  # not printed
        watch.uninstall()
        assert sys.unraisablehook is theirs
    finally:
        sys.unraisablehook = before
