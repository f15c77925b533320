"""What a rank says of its torch.distributed process group at exit, once say_group_at_shutdown(rank) was called:

- in an atexit handler of the script's own, registered as this module is imported (at the script's top, before
  anything the rank runs): whether the group is still there for the script's handlers to use;
- as the interpreter starts to shut down, after every atexit handler: whether the group is still held, and how many
  of gloo's threads are alive, which the shutdown itself would then have to end (spawn_ddp.py says why that can
  abort the process). The object that says it sits in sys.modules, which is emptied first at shutdown.
"""

import atexit
import os
import sys

import torch.distributed as dist

_rank: int | None = None


def _held() -> str:
    return "held" if dist.is_initialized() else "none"


def _gloo_threads() -> int:
    """Nothing here may import: at shutdown the import system is gone (Python 3.12 clears sys.meta_path first)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read())
        except OSError:  # a thread that ended since the listing (NCCL's, as the group ends)
            continue
    return sum("gloo" in name for name in names)


def _say_in_the_scripts_handler() -> None:
    if _rank is not None:
        os.write(1, f"rank {_rank}: process group in the script's atexit handler: {_held()}\n".encode())


class _SayAtShutdown:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __del__(self) -> None:
        line = f"rank {self.rank}: process group at shutdown: {_held()}, gloo threads: {_gloo_threads()}\n"
        os.write(1, line.encode())


def say_group_at_shutdown(rank: int) -> None:
    global _rank  # noqa: PLW0603 - the rank this process says it is, for its handler at exit
    _rank = rank
    sys.modules["_group_at_exit_probe"] = _SayAtShutdown(rank)  # type: ignore[assignment]


atexit.register(_say_in_the_scripts_handler)
