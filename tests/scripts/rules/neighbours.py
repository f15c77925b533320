"""Busy-loop neighbour processes outside the caller's process tree, for GD504.

`python neighbours.py launch OWNER_PID COUNT SECONDS` starts COUNT spinners in their own sessions, prints
their pids, one a line, and exits at once, so the spinners are re-parented away from the caller's tree.
`python neighbours.py spin OWNER_PID SECONDS` burns one core until SECONDS have passed or OWNER_PID is gone.
"""

import os
import subprocess
import sys
import time


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def spin(owner: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and alive(owner):
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass


def launch(owner: int, count: int, seconds: float) -> None:
    for _ in range(count):
        spinner = subprocess.Popen([sys.executable, __file__, "spin", str(owner), str(seconds)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        print(spinner.pid, flush=True)


if __name__ == "__main__":
    mode, owner = sys.argv[1], int(sys.argv[2])
    if mode == "spin":
        spin(owner, float(sys.argv[3]))
    else:
        launch(owner, int(sys.argv[3]), float(sys.argv[4]))
