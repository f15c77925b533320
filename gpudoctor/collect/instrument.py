"""Instrumentation installed in the script's process before the script runs.

Always on, because each costs one Python call per step or less: step detection (optimizer hooks,
DataLoader batches), data-wait timing, loader settings, thread starts and forks. Only in the window's
detail steps, after the profiled ones: phase timing (forward, backward), host<->device copy and
synchronization call sites, and the GIL probe, since those wrap calls that a step makes many times and
would slow the steps whose times the figures come from.
"""

from __future__ import annotations

import functools
import importlib.abc
import multiprocessing
import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any

import msgspec

from gpudoctor.bundle.events import (
    BackwardSiteEvent,
    CudaDevice,
    EnvWindowEvent,
    ForkEvent,
    ForwardSiteEvent,
    LoaderEvent,
    ProcessStartEvent,
    RankEvent,
    ThreadStartEvent,
    TorchEvent,
)
from gpudoctor.bundle.records import Site
from gpudoctor.collect.callsite import location, user_frame_from, user_location
from gpudoctor.collect.compile_safe import compiling_check, plain_tensor_types, quietly
from gpudoctor.collect.gilprobe import GilProbe
from gpudoctor.collect.hostlines import HostLines
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder
from gpudoctor.collect.step_hooks import KeptHooks, find_outermost_model, hook_backward_steps

perf_counter = time.perf_counter


class Instrumentation:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._always = Patches()
        self._in_window = Patches()
        self._window_hooks: list[Any] = []
        self._step_hooks: list[Any] = []  # module hooks that find steps (removed at the end)
        self._optimizer_hooks: list[Any] = []  # the global optimizer hooks (removed at the end)
        self._kept_hooks = KeptHooks()  # those hooks, kept when the model they found is compiled
        self._local = threading.local()  # per-thread: the optimizer step's start, re-entrancy guard
        self._host_lines = HostLines(recorder.config.gil_probe_interval_s)
        self._probe = GilProbe(recorder.config.gil_probe_interval_s, recorder.add_gil_delay, self._host_lines.sample)
        # What gpudoctor learns of the script's loaders, held beside them and never on them: where each was made
        # (and by which library), and the number its loader event gives it once it is first iterated.
        self._loader_sites: weakref.WeakKeyDictionary[Any, LoaderOrigin] = weakref.WeakKeyDictionary()
        self._loader_numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        recorder.on_window_change(self._on_window_change)

    # -- installation ----------------------------------------------------------------------------
    def install(self) -> None:
        self._patch_threads()
        self._patch_processes()
        os.register_at_fork(before=self._before_fork, after_in_child=self._after_fork_in_child)
        if "torch" in sys.modules:
            self.on_torch_imported()
        else:
            sys.meta_path.insert(0, _TorchImportWatcher(self))

    def on_torch_imported(self) -> None:
        import torch

        self._patch_dataloader()
        self._hook_optimizers()
        self._patch_process_group()
        hook_backward_steps(self.recorder, self._always)
        find_outermost_model(self.recorder, self._step_hooks, self._kept_hooks)
        self.recorder.emit(TorchEvent(version=torch.__version__, cuda_build=torch.version.cuda,
                                      cuda_built=torch.backends.cuda.is_built()))

    def uninstall(self) -> None:
        self._on_window_change(False)
        self._remove_hooks()

    def abandon(self) -> None:
        """Take everything off without writing (a forked child that records on its own from here): its threads
        did not survive the fork, and the window's hooks go with the rest."""
        for handle in self._window_hooks:
            handle.remove()
        self._window_hooks.clear()
        self._in_window.restore()
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in [*self._step_hooks, *self._optimizer_hooks]:
            handle.remove()
        self._step_hooks.clear()
        self._optimizer_hooks.clear()
        self._always.restore()

    # -- always on -------------------------------------------------------------------------------
    def _patch_threads(self) -> None:
        recorder = self.recorder

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

        self._always.wrap(threading.Thread, "start", make)

    def _patch_processes(self) -> None:
        recorder = self.recorder

        def make(original: Any) -> Any:
            def start(process: Any) -> None:
                # Read before starting it: start() lets go of the target once the child has it.
                event = _process_start_event(process, user_location(), _in_dataloader_stack())
                original(process)
                recorder.emit(msgspec.structs.replace(event, pid=process.pid, start_method=_start_method(process)))

            return start

        self._always.wrap(multiprocessing.process.BaseProcess, "start", make)

    def _before_fork(self) -> None:
        torch = sys.modules.get("torch")
        cuda_initialized = bool(torch is not None and torch.cuda.is_initialized())
        self.recorder.emit(ForkEvent(
            parent_pid=os.getpid(), cuda_initialized=cuda_initialized,
            start_method=multiprocessing.get_start_method(allow_none=True), site=user_location(),
            dataloader_worker=_in_dataloader_stack(),
        ))

    def _after_fork_in_child(self) -> None:
        self.recorder.disable_in_forked_child()

    def _patch_dataloader(self) -> None:
        from torch.utils.data import dataloader

        recorder, markers = self.recorder, self.recorder.markers
        sites, numbers = self._loader_sites, self._loader_numbers

        def first_iteration(loader: Any) -> None:
            # A loader that cannot be weakly referenced or hashed (a subclass with __eq__ only) is not kept:
            # its event is then written at each of its iterations.
            try:
                if loader in numbers:
                    return
                numbers[loader] = number = len(numbers)
            except TypeError:
                number = len(numbers)
            recorder.emit(_loader_event(loader, number, _origin_of(sites, loader)))

        def make_init(original: Any) -> Any:
            def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
                original(loader, *args, **kwargs)
                quietly(remember, loader, sys._getframe(1))

            return __init__

        def remember(loader: Any, caller: FrameType) -> None:
            if loader not in sites:  # a subclass's __init__ calls this one's: its caller is the one to keep
                sites[loader] = _loader_origin(caller, sites)

        def make_iter(original: Any) -> Any:
            def __iter__(loader: Any) -> Any:
                quietly(first_iteration, loader)
                return original(loader)

            return __iter__

        def make_next(original: Any) -> Any:
            def __next__(iterator: Any) -> Any:
                recorder.on_batch_requested()
                handle = markers.begin("data_wait")
                started = perf_counter()
                try:
                    batch = original(iterator)
                finally:
                    markers.end(handle)
                recorder.on_batch_received(perf_counter() - started)
                return batch

            return __next__

        self._always.wrap(dataloader.DataLoader, "__init__", make_init)
        self._always.wrap(dataloader.DataLoader, "__iter__", make_iter)
        self._always.wrap(dataloader._BaseDataLoaderIter, "__next__", make_next)

    def _hook_optimizers(self) -> None:
        from torch.optim import optimizer

        recorder, markers, local = self.recorder, self.recorder.markers, self._local

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            local.optimizer = (markers.begin("optimizer"), perf_counter())

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            handle, started = getattr(local, "optimizer", (None, perf_counter()))
            markers.end(handle)
            recorder.on_optimizer_step(opt, perf_counter() - started)

        self._optimizer_hooks += [optimizer.register_optimizer_step_pre_hook(pre),
                                  optimizer.register_optimizer_step_post_hook(post)]

    def _patch_process_group(self) -> None:
        """When the process joins a torch.distributed group, its rank and the world's size, as torch numbers them."""
        import torch.distributed

        if not torch.distributed.is_available():
            return
        from torch.distributed import distributed_c10d

        recorder = self.recorder

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
            self._always.wrap(owner, "init_process_group", make)

    # -- only in the window's detail steps -------------------------------------------------------
    def _on_window_change(self, hooked: bool) -> None:
        if hooked and not self._window_hooks:
            self._install_window_hooks()
            self._probe.start()
            self.recorder.emit(_torch_runtime_facts())
        elif not hooked and self._window_hooks:
            self._probe.stop()
            lines = self._host_lines.event()
            if lines is not None:
                self.recorder.emit(lines)
            for handle in self._window_hooks:
                handle.remove()
            self._window_hooks.clear()
            self._in_window.restore()

    def _install_window_hooks(self) -> None:
        import torch

        self._window_hooks.extend(self._forward_hooks())
        self._patch_backward()
        self._patch_copies(torch)
        self._patch_syncs(torch)

    def _forward_hooks(self) -> list[Any]:
        from torch.nn.modules import module

        recorder, markers, compiling = self.recorder, self.recorder.markers, compiling_check()
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

        if self._kept_hooks.kept:  # a compiled model: the hooks that found it time it, and none are added
            return [self._kept_hooks.time_with(pre, post)]
        try:
            post_handle = module.register_module_forward_hook(post, always_call=True)
        except TypeError:  # torch before 2.0 has no always_call
            post_handle = module.register_module_forward_hook(post)
        return [module.register_module_forward_pre_hook(pre), post_handle]

    def _patch_backward(self) -> None:
        import torch.autograd

        recorder, markers, compiling = self.recorder, self.recorder.markers, compiling_check()
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

        self._in_window.wrap(torch.autograd, "backward", make)

    def _patch_copies(self, torch: Any) -> None:
        recorder, local, compiling, plain = self.recorder, self._local, compiling_check(), plain_tensor_types()

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
            self._in_window.wrap(torch.Tensor, name, make_to)
        self._in_window.wrap(torch.Tensor, "copy_", make_copy_)

    def _patch_syncs(self, torch: Any) -> None:
        recorder, local, compiling, plain = self.recorder, self._local, compiling_check(), plain_tensor_types()

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
            self._in_window.wrap(torch.Tensor, name, functools.partial(timed, kind, on_cuda_tensor=True))
        if torch.cuda.is_available():
            for name in ("synchronize", "empty_cache"):
                self._in_window.wrap(torch.cuda, name, functools.partial(timed, name, on_cuda_tensor=False))


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Installs the torch hooks right after the script imports torch, so gpudoctor never imports it first."""

    def __init__(self, instrumentation: Instrumentation) -> None:
        self._instrumentation = instrumentation

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        original_exec, instrumentation = spec.loader.exec_module, self._instrumentation

        def exec_module(module: Any) -> None:
            original_exec(module)
            instrumentation.on_torch_imported()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


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


def _in_dataloader_stack() -> bool:
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


LoaderOrigin = tuple["Site | None", "str | None"]  # where a DataLoader was made, and the library that made it
FRAMES_SEARCHED = 30  # how far up from a library's DataLoader() the loader it re-creates is looked for


def _loader_origin(caller: FrameType, sites: weakref.WeakKeyDictionary[Any, LoaderOrigin]) -> LoaderOrigin:
    """Where a DataLoader was made: the user's line that led to it and the library that called DataLoader() (None
    when the user's code did). A library that re-creates a loader the script made (Lightning adds a distributed
    sampler, Accelerate shards it) holds the script's loader in a frame on the way: the new one keeps its origin,
    the line where the script set its settings."""
    user = user_frame_from(caller)
    if user is caller or caller.f_code.co_filename.startswith("<"):
        return location(user), None
    made_by = str(caller.f_globals.get("__name__", "")).split(".")[0] or None
    frame: FrameType | None = caller
    for _ in range(FRAMES_SEARCHED):
        if frame is None or frame is user:
            break
        for value in list(frame.f_locals.values()):
            try:
                known = sites.get(value) if isinstance(value, _dataloader_class()) else None
            except TypeError:
                known = None
            if known is not None:
                return known[0], known[1] or made_by
        frame = frame.f_back
    return location(user), made_by


def _dataloader_class() -> type:
    from torch.utils.data import DataLoader

    return DataLoader


def _origin_of(sites: weakref.WeakKeyDictionary[Any, LoaderOrigin], loader: Any) -> LoaderOrigin:
    try:
        return sites.get(loader) or (None, None)
    except TypeError:  # a loader that cannot be kept had its origin left out
        return None, None


def _loader_event(loader: Any, number: int, origin: LoaderOrigin) -> LoaderEvent:
    context = loader.multiprocessing_context
    site, made_by = origin
    return LoaderEvent(
        loader_id=number, site=site, made_by=made_by, num_workers=loader.num_workers,
        pin_memory=loader.pin_memory, batch_size=loader.batch_size, prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers, drop_last=loader.drop_last,
        dataset=type(loader.dataset).__qualname__, dataset_len=_safe_len(loader.dataset),
        start_method=context.get_start_method() if context is not None else
        multiprocessing.get_start_method(allow_none=True), sampler=type(loader.sampler).__qualname__,
    )


def _safe_len(obj: Any) -> int | None:
    try:
        return len(obj)
    except Exception:  # noqa: BLE001 - an IterableDataset has no length, and a dataset's own __len__ may raise anything
        return None


def _torch_runtime_facts() -> EnvWindowEvent:
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
FRAMEWORK_MODULES = {"lightning": ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"),
                     "transformers": ("transformers.trainer",), "accelerate": ("accelerate.accelerator",)}


def _frameworks() -> list[str]:
    return [name for name, modules in FRAMEWORK_MODULES.items() if any(m in sys.modules for m in modules)]
