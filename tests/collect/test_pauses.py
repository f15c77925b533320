"""The pauses gpudoctor watches for in the script's process (collect/pauses.py) never change how the script ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.collect import pauses
from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.pauses import PauseWatch
from gpudoctor.collect.recorder import Recorder


def test_ctrl_c_in_the_collections_callback_still_stops_the_script(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpudoctor profile --timeout 2` of a script that allocates in a loop: the SIGINT came while Python ran the
    callback gpudoctor gives the garbage collector, which prints and drops what a callback raises ("Exception
    ignored in ... _on_gc ... KeyboardInterrupt"), and the script would have run on. The interrupt reaches the
    script's own code once the callback has returned."""
    watch = PauseWatch(Recorder(ChildConfig(run_dir=str(tmp_path))))

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
