"""Hooks of the window's detail steps, after the profiled ones: the forward and backward phases, host<->device
copies and synchronizing calls with the lines that make them, and torch's threads and device. Each wraps a call a
step makes many times, so they are on only in those steps.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any

from gpudoctor.bundle.events import BackwardSiteEvent, CudaDevice, EnvWindowEvent, ForwardSiteEvent
from gpudoctor.bundle.records import Site
from gpudoctor.collect.callsite import location, user_frame_from, user_location
from gpudoctor.collect.compile_safe import compiling_check, plain_tensor_types, quietly
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder
from gpudoctor.collect.step_hooks import KeptHooks

perf_counter = time.perf_counter


def forward_hooks(recorder: Recorder, kept: KeptHooks) -> list[Any]:
    """Where the script calls its outermost model, and the forward phase's time; the hooks' handles."""
    from torch.nn.modules import module

    markers, compiling = recorder.markers, compiling_check()
    # Fresh for each window: a forward that a thread was in when the hooks last went off never closed.
    local = threading.local()
    sites_seen: set[tuple[str, int]] = set()

    def pre(mod: Any, args: Any) -> None:
        if compiling():
            return
        depth = getattr(local, "depth", 0)
        if depth == 0:
            local.forward = (markers.begin("forward"), perf_counter())
            site = user_location()
            key = (site.file, site.line) if site else ("", 0)
            if key not in sites_seen:  # where the model is called: once per line
                sites_seen.add(key)
                recorder.emit(ForwardSiteEvent(module=type(mod).__qualname__, site=site))
        local.depth = depth + 1

    def post(mod: Any, args: Any, output: Any) -> None:
        if compiling():
            return
        depth = getattr(local, "depth", 0)
        if depth == 0:  # a forward that began before the hooks were on (in this thread): nothing to close
            return
        local.depth = depth = depth - 1
        if depth == 0:
            handle, started = local.forward
            markers.end(handle)
            recorder.add_phase("forward", perf_counter() - started)

    if kept.kept:  # a compiled model: the hooks that found it time it, and none are added
        return [kept.time_with(pre, post)]
    try:
        post_handle = module.register_module_forward_hook(post, always_call=True)
    except TypeError:  # torch before 2.0 has no always_call
        post_handle = module.register_module_forward_hook(post)
    return [module.register_module_forward_pre_hook(pre), post_handle]


def patch_backward(patches: Patches, recorder: Recorder) -> None:
    """Where the script calls backward(), and the backward phase's time."""
    import torch.autograd

    markers, compiling = recorder.markers, compiling_check()
    sites_seen: set[tuple[str, int]] = set()

    def make(original: Any) -> Any:
        def backward(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            site = user_location()
            key = (site.file, site.line) if site else ("", 0)
            if key not in sites_seen:  # where the script calls backward(): once per line
                sites_seen.add(key)
                recorder.emit(BackwardSiteEvent(site=site))
            handle, started = markers.begin("backward"), perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                markers.end(handle)
                recorder.add_phase("backward", perf_counter() - started)

        return backward

    patches.wrap(torch.autograd, "backward", make)


def patch_copies(patches: Patches, recorder: Recorder, local: threading.local, torch: Any) -> None:
    """Each host<->device copy: direction, pinned or not, non_blocking, bytes, time and line."""
    compiling, plain = compiling_check(), plain_tensor_types()

    def record(source: Any, result: Any, args: tuple, kwargs: dict, seconds: float) -> None:
        if type(result) not in plain or type(source) not in plain or result is source:
            return
        direction = _direction(source.device.type, result.device.type)
        if direction is None:
            return
        host = source if direction == "h2d" else result
        recorder.add_copy(
            direction, bool(host.is_pinned()), _non_blocking(args, kwargs),
            source.numel() * source.element_size(), seconds, user_location(3),
        )

    def make_to(original: Any) -> Any:
        def to(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling() or getattr(local, "busy", False):
                return original(tensor, *args, **kwargs)
            local.busy = True
            try:
                started = perf_counter()
                result = original(tensor, *args, **kwargs)
                quietly(record, tensor, result, args, kwargs, perf_counter() - started)
                return result
            finally:
                local.busy = False

        return to

    def make_copy_(original: Any) -> Any:
        def copy_(dest: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(dest, src, *args, **kwargs)
            started = perf_counter()
            result = original(dest, src, *args, **kwargs)
            if isinstance(src, torch.Tensor) and not getattr(local, "busy", False):
                local.busy = True
                try:
                    quietly(record, src, dest, args, kwargs, perf_counter() - started)
                finally:
                    local.busy = False
            return result

        return copy_

    for name in ("to", "cuda", "cpu"):
        patches.wrap(torch.Tensor, name, make_to)
    patches.wrap(torch.Tensor, "copy_", make_copy_)


def patch_syncs(patches: Patches, recorder: Recorder, local: threading.local, torch: Any) -> None:
    """Each call that makes the host wait for the GPU: which, how long, and the line (and the library) that made it."""
    compiling, plain = compiling_check(), plain_tensor_types()

    def record(kind: str, seconds: float) -> None:
        recorder.add_sync(kind, seconds, *_site_and_library(4))  # record, quietly, the wrapper, its caller

    def timed(kind: str, original: Any, on_cuda_tensor: bool) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if (compiling() or getattr(local, "busy", False)
                    or (on_cuda_tensor and (type(args[0]) not in plain or not args[0].is_cuda))):
                return original(*args, **kwargs)
            local.busy = True
            try:
                started = perf_counter()
                result = original(*args, **kwargs)
                quietly(record, kind, perf_counter() - started)
                return result
            finally:
                local.busy = False

        return wrapper

    tensor_methods = {
        "item": "item", "tolist": "tolist", "__bool__": "bool", "__float__": "float", "__int__": "int",
        "__repr__": "print", "__format__": "print",
    }
    for name, kind in tensor_methods.items():
        patches.wrap(torch.Tensor, name, functools.partial(timed, kind, on_cuda_tensor=True))
    if torch.cuda.is_available():
        for name in ("synchronize", "empty_cache"):
            patches.wrap(torch.cuda, name, functools.partial(timed, name, on_cuda_tensor=False))


def _direction(source: str, destination: str) -> str | None:
    if source == "cpu" and destination != "cpu":
        return "h2d"
    if source != "cpu" and destination == "cpu":
        return "d2h"
    return None


def _non_blocking(args: tuple, kwargs: dict) -> bool:
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    # In to(device, dtype, non_blocking, copy), cuda(device, non_blocking) and copy_(src, non_blocking)
    # the first positional bool is non_blocking.
    return next((a for a in args if isinstance(a, bool)), False)


def _site_and_library(depth: int = 2) -> tuple[Site | None, str | None]:
    """The user's line that led to the wrapped call, and the module that made the call for it when that is a
    library's (GradScaler.step() reading .item() for the script's scaler.step line), from one walk of the stack.
    `depth`: how many frames up the call into the wrapper is (2: this function's caller is the wrapper)."""
    caller = sys._getframe(depth)
    user = user_frame_from(caller)
    made_by_user = user is caller or caller.f_code.co_filename.startswith("<")
    return location(user), None if made_by_user else caller.f_globals.get("__name__")


def torch_runtime_facts() -> EnvWindowEvent:
    import torch

    device = None
    if torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        device = CudaDevice(index=index, name=props.name, total_memory=total, free_memory=free,
                            capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
    return EnvWindowEvent(intra_op_threads=torch.get_num_threads(), inter_op_threads=torch.get_num_interop_threads(),
                          cuda_initialized=torch.cuda.is_initialized(), cuda_device=device,
                          frameworks=_frameworks() or None)


# A framework the script trains through, by a module that is imported only when it is used (its trainer's)


# A framework the script trains through, by a module that is imported only when it is used (its trainer's)
FRAMEWORK_MODULES = {"lightning": ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"),
                     "transformers": ("transformers.trainer",), "accelerate": ("accelerate.accelerator",)}


def _frameworks() -> list[str]:
    return [name for name, modules in FRAMEWORK_MODULES.items() if any(m in sys.modules for m in modules)]
