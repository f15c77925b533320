"""A fork while another thread of the script's process holds one of the recorder's locks: the child, which has no
such thread to release it, never waits on it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.recorder import Recorder


def test_a_child_forked_while_a_thread_holds_the_recorders_locks_goes_on(tmp_path: Path) -> None:
    recorder = Recorder(ChildConfig(run_dir=str(tmp_path)))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with recorder._lock, recorder.events._lock:  # as the GIL probe's thread does, recording into the step
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: what a forked worker's first calls into gpudoctor's hooks take
        recorder.disable_in_forked_child()
        recorder.on_batch_received(0.001)
        recorder.events.write({"kind": "never-written"})
        os._exit(0)
    release.set()
    holder.join()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child waited for a lock its parent's thread held")
