"""The script's threads, processes and forks, and the process group it joins: always on, one call each."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from types import FrameType
from typing import Any

import msgspec

from gpudoctor.bundle.events import ForkEvent, ProcessStartEvent, RankEvent, ThreadStartEvent
from gpudoctor.collect.callsite import user_location
from gpudoctor.collect.compile_safe import quietly
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder


def patch_threads(patches: Patches, recorder: Recorder) -> None:
    """Each thread the script starts: its name, target and the line that started it."""

    def make(original: Any) -> Any:
        def start(thread: threading.Thread) -> None:
            if thread.name.startswith("gpudoctor-"):
                original(thread)
                return
            target = getattr(thread, "_target", None)
            site = user_location()
            original(thread)  # returns once the thread runs, so its native id is known
            recorder.emit(ThreadStartEvent(
                name=thread.name, daemon=thread.daemon, native_id=getattr(thread, "native_id", None),
                target=getattr(target, "__qualname__", type(target).__name__ if target else None),
                module=getattr(target, "__module__", None), site=site,
            ))

        return start

    patches.wrap(threading.Thread, "start", make)


def patch_processes(patches: Patches, recorder: Recorder) -> None:
    """Each process the script starts through multiprocessing: what it runs, how, and the line that started it."""

    def make(original: Any) -> Any:
        def start(process: Any) -> None:
            # Read before starting it: start() lets go of the target once the child has it.
            event = _process_start_event(process, user_location(), in_dataloader_stack())
            original(process)
            recorder.emit(msgspec.structs.replace(event, pid=process.pid, start_method=_start_method(process)))

        return start

    patches.wrap(multiprocessing.process.BaseProcess, "start", make)


def watch_forks(recorder: Recorder) -> None:
    """Each fork: whether CUDA was initialized before it, and where; a forked child records nothing."""

    def before() -> None:
        torch = sys.modules.get("torch")
        cuda_initialized = bool(torch is not None and torch.cuda.is_initialized())
        recorder.emit(ForkEvent(
            parent_pid=os.getpid(), cuda_initialized=cuda_initialized,
            start_method=multiprocessing.get_start_method(allow_none=True), site=user_location(),
            dataloader_worker=in_dataloader_stack(),
        ))

    os.register_at_fork(before=before, after_in_child=recorder.disable_in_forked_child)


def patch_process_group(patches: Patches, recorder: Recorder) -> None:
    """When the process joins a torch.distributed group, its rank and the world's size, as torch numbers them."""
    import torch.distributed

    if not torch.distributed.is_available():
        return
    from torch.distributed import distributed_c10d

    def joined() -> None:
        recorder.emit(RankEvent(rank=torch.distributed.get_rank(), world_size=torch.distributed.get_world_size(),
                                backend=str(torch.distributed.get_backend()), source="init_process_group"))

    def make(original: Any) -> Any:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            quietly(joined)
            return result

        return init_process_group

    # torch.distributed re-exports the function: a script may call it by either name.
    for owner in (distributed_c10d, torch.distributed):
        patches.wrap(owner, "init_process_group", make)


def in_dataloader_stack() -> bool:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("torch", "utils", "data", "dataloader.py")):
            return True
        frame = frame.f_back
    return False


def _process_start_event(process: Any, site: Any, in_loader: bool) -> ProcessStartEvent:
    target = getattr(process, "_target", None)
    args = getattr(process, "_args", ())
    if getattr(target, "__module__", None) == "torch.multiprocessing.spawn" and args and callable(args[0]):
        target = args[0]  # spawn's own wrapper runs the function the script gave it
    return ProcessStartEvent(target=getattr(target, "__qualname__", None), module=getattr(target, "__module__", None),
                             site=site, dataloader_worker=in_loader)


def _start_method(process: Any) -> str | None:
    """Its context's start method; a plain Process uses the default one, fixed by the time it has started."""
    return getattr(process, "_start_method", None) or multiprocessing.get_start_method(allow_none=True)
