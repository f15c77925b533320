"""Runs `gpudoctor analyze` on many inputs in one process, each as the command line would, and prints one JSON line
per input: its exit status, what gpudoctor said on stderr, and whether it ran past the time allowed.

    python tests/cli/fuzz_driver.py SECONDS_PER_CASE PATH...

tests/cli/test_fuzz.py runs it in a subprocess with a memory cap, so that a case that hangs or eats memory is caught
without taking the test session down; starting one process for all the cases keeps hundreds of them fast.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import sys


class _TooLong(Exception):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _TooLong


def run_case(path: str, seconds: int) -> dict[str, object]:
    from gpudoctor.cli import main

    stderr = io.StringIO()
    sys.argv = ["gpudoctor", "analyze", path, "--format", "json"]
    status: object = None
    signal.alarm(seconds)
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            main()
    except SystemExit as exc:
        status = exc.code
    except _TooLong:
        status = "hang"
    finally:
        signal.alarm(0)
    return {"path": path, "status": status, "stderr": stderr.getvalue()}


def main() -> None:
    seconds = int(sys.argv[1])
    signal.signal(signal.SIGALRM, _on_alarm)
    for path in sys.argv[2:]:
        print(json.dumps(run_case(path, seconds)), flush=True)


if __name__ == "__main__":
    main()
