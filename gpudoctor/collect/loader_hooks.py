"""The script's DataLoaders: where each was made (and by which library), its settings once it is first iterated,
and the wait for each batch, which ends a step when the loader marks them. Always on: one call per batch.

What gpudoctor learns of a loader is held beside it, in weak-keyed tables, never on it.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import weakref
from types import FrameType
from typing import Any

from gpudoctor.bundle.events import LoaderEvent
from gpudoctor.bundle.records import Site
from gpudoctor.collect.callsite import location, user_frame_from
from gpudoctor.collect.compile_safe import quietly
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder
from gpudoctor.collect.remedies import Remedies, worker_threads

perf_counter = time.perf_counter
thread_time = time.thread_time  # CPU time of the calling thread only
LoaderOrigin = tuple["Site | None", "str | None"]  # where a DataLoader was made, and the library that made it
FRAMES_SEARCHED = 30  # how far up from a library's DataLoader() the loader it re-creates is looked for


class LoaderHooks:
    def __init__(self, remedies: Remedies | None = None) -> None:
        self.remedies = remedies  # a try's fix: DataLoader arguments it sets, batches whose copies it makes async
        # Where each loader was made (and by which library), and the number its loader event gives it once it is
        # first iterated.
        self.sites: weakref.WeakKeyDictionary[Any, LoaderOrigin] = weakref.WeakKeyDictionary()
        self.numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def install(self, patches: Patches, recorder: Recorder) -> None:
        from torch.utils.data import dataloader

        markers = recorder.markers
        sites, numbers, remedies = self.sites, self.numbers, self.remedies

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
                origin = _origin_or_none(sys._getframe(1), sites)
                if remedies is not None:
                    # A loader a library builds again from the script's (Lightning's, with a DistributedSampler)
                    # has the script's line for its origin: the remedy applies to it as to the script's own.
                    args, kwargs = remedies.loader_arguments(original, _built_at(origin), args, kwargs)
                original(loader, *args, **kwargs)
                if origin is not None:
                    quietly(remember, loader, origin)

            return __init__

        def remember(loader: Any, origin: LoaderOrigin) -> None:
            if loader not in sites:  # a subclass's __init__ calls this one's: its caller is the one to keep
                sites[loader] = origin

        def make_iter(original: Any) -> Any:
            def __iter__(loader: Any) -> Any:
                quietly(first_iteration, loader)
                return original(loader)

            return __iter__

        def make_next(original: Any) -> Any:
            def __next__(iterator: Any) -> Any:
                recorder.on_batch_requested()
                handle = markers.begin("data_wait")
                started, cpu_started = perf_counter(), thread_time()
                try:
                    batch = original(iterator)
                finally:
                    markers.end(handle)
                recorder.on_batch_received(perf_counter() - started, thread_time() - cpu_started)
                if remedies is not None:
                    remedies.on_batch(batch)
                return batch

            return __next__

        patches.wrap(dataloader.DataLoader, "__init__", make_init)
        patches.wrap(dataloader.DataLoader, "__iter__", make_iter)
        patches.wrap(dataloader._BaseDataLoaderIter, "__next__", make_next)


def _origin_or_none(caller: FrameType, sites: weakref.WeakKeyDictionary[Any, LoaderOrigin]) -> LoaderOrigin | None:
    """`_loader_origin`, or None where finding it failed (its failure never reaches the script's call)."""
    try:
        return _loader_origin(caller, sites)
    except Exception:  # noqa: BLE001 - measuring must not change what the script's code does
        return None


def _built_at(origin: LoaderOrigin | None) -> str | None:
    """The origin's line as 'file:line', as a remedy names the loaders it changes (gpudoctor.remedy.LoaderRemedy)."""
    site = origin[0] if origin is not None else None
    return f"{site.file}:{site.line}" if site is not None else None


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
        pin_memory=loader.pin_memory, batch_size=_batch_size(loader), prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers, drop_last=loader.drop_last,
        dataset=type(loader.dataset).__qualname__, dataset_len=_safe_len(loader.dataset),
        start_method=context.get_start_method() if context is not None else
        multiprocessing.get_start_method(allow_none=True), sampler=type(loader.sampler).__qualname__,
        worker_threads=worker_threads(loader.worker_init_fn),
    )


def _safe_len(obj: Any) -> int | None:
    try:
        return len(obj)
    except Exception:  # noqa: BLE001 - an IterableDataset has no length, and a dataset's own __len__ may raise anything
        return None


def _batch_size(loader: Any) -> int | None:
    """The loader's batch: its batch_size, or its batch sampler's when it was given one (Hugging Face's Trainer
    and Accelerate pass a batch sampler, and batch_size is then None)."""
    if loader.batch_size is not None:
        return int(loader.batch_size)
    size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if type(size) is int else None
