"""What a rank says as its interpreter starts to shut down, after every atexit handler has run: whether
torch.distributed still holds a process group then, which the shutdown itself would have to end (spawn_ddp.py says
why that can abort the process). The object that says it sits in sys.modules, which is emptied first at shutdown."""

import os
import sys

import torch.distributed as dist


class _SayAtShutdown:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __del__(self) -> None:
        held = "held" if dist.is_initialized() else "none"
        os.write(1, f"rank {self.rank}: process group at shutdown: {held}\n".encode())


def say_group_at_shutdown(rank: int) -> None:
    sys.modules["_group_at_exit_probe"] = _SayAtShutdown(rank)  # type: ignore[assignment]
