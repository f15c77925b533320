"""A try's fix, applied in the script's process (gpudoctor.remedy): the script runs unchanged, and the settings the
fix names are changed where the script makes them.

- DataLoader arguments: set in DataLoader.__init__ for the loaders built at the remedy's line, before the
  loader checks them; each worker's threads are set after the script's own worker_init_fn. A loader that a
  library builds again from the script's (Lightning, to add a DistributedSampler, from the arguments the script
  first gave; Accelerate's prepare_data_loader) counts as built at the script's line, and gets the same settings.
- Intra-op threads: set when torch is imported, and kept when the script sets its own.
- The start method: the default context's, and any context the script asks for by name ("fork").
- Non-blocking copies: a pinned tensor from a loader batch, copied to a GPU with `.to()` or `.cuda()` and no
  non_blocking of its own, gets non_blocking=True (the loader makes a new batch each time, so nothing the
  script writes can reach a copy in flight).

Each change is written to events.jsonl as it is first made (RemedyEvent), so that a try says what it changed,
and a fix that found nothing to change is told apart from one that changed nothing.
"""

from __future__ import annotations

import functools
import inspect
import multiprocessing
import os
import weakref
from collections.abc import Callable
from typing import Any

from gpudoctor.bundle.events import RemedyEvent
from gpudoctor.collect.patches import Patches
from gpudoctor.remedy import LoaderRemedy, Remedy

BATCH_DEPTH = 3  # how deep into a batch's lists, tuples and dicts its tensors are looked for


def for_this_process(remedy: Remedy | None) -> Remedy | None:
    """The remedy, if it applies to this process: every process, or the one rank it names."""
    if remedy is None or remedy.rank is None:
        return remedy
    rank = os.environ.get("RANK")
    return remedy if rank is not None and rank.isdigit() and int(rank) == remedy.rank else None


class Remedies:
    def __init__(self, remedy: Remedy, emit: Callable[[RemedyEvent], None]) -> None:
        self.remedy = remedy
        self._emit = emit
        self._said: set[str] = set()
        self._batch_tensors: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def said(self, applied: str) -> None:
        if applied not in self._said:
            self._said.add(applied)
            self._emit(RemedyEvent(applied=applied))

    # -- before the script runs --------------------------------------------------------------------------
    def install(self, patches: Patches) -> None:
        method = self.remedy.start_method
        if method is not None:
            multiprocessing.set_start_method(method, force=True)
            self._replace_named_contexts(patches, method)
        if self.remedy.intra_op_threads is not None:
            os.environ["OMP_NUM_THREADS"] = str(self.remedy.intra_op_threads)

    def _replace_named_contexts(self, patches: Patches, method: str) -> None:
        said = self.said

        def make_get_context(original: Any) -> Any:
            def get_context(method_asked: str | None = None) -> Any:
                if method_asked is not None and method_asked != method:
                    said(f'multiprocessing.get_context("{method}") where the script asks for "{method_asked}"')
                    method_asked = method
                return original(method_asked)

            return get_context

        patches.wrap(multiprocessing, "get_context", make_get_context)

    # -- once torch is imported --------------------------------------------------------------------------
    def on_torch_imported(self, patches: Patches) -> None:
        import torch

        threads = self.remedy.intra_op_threads
        if threads is not None:
            torch.set_num_threads(threads)
            self.said(f"torch.set_num_threads({threads})")
            patches.wrap(torch, "set_num_threads", self._keep_threads(threads))
        if self.remedy.non_blocking_batches:
            patches.wrap(torch.Tensor, "to", self._non_blocking("to", positional=2))
            patches.wrap(torch.Tensor, "cuda", self._non_blocking("cuda", positional=1))

    def _keep_threads(self, threads: int) -> Callable[[Any], Any]:
        """torch.set_num_threads that keeps the remedy's count in this process. A process forked from it (a
        DataLoader worker, which sets one thread) inherits the patch but not the remedy: it sets what it asks."""
        said, own_pid = self.said, os.getpid()

        def make(original: Any) -> Any:
            def set_num_threads(count: int) -> None:
                if os.getpid() != own_pid:
                    original(count)
                    return
                if count != threads:
                    said(f"torch.set_num_threads({threads}) where the script sets {count}")
                original(threads)

            return set_num_threads

        return make

    # -- DataLoaders -------------------------------------------------------------------------------------
    def loader_arguments(self, init: Any, where: str | None, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments of DataLoader(...) for a loader whose origin is the line `where` ('file:line': the
        script's DataLoader(...), also for a loader a library builds again from it), with the remedy's settings
        where it applies."""
        loader = self.remedy.loader
        if loader is None:
            return args, kwargs
        if loader.at is not None and where != loader.at:
            return args, kwargs
        try:
            bound = inspect.signature(init).bind(None, *args, **kwargs)
        except TypeError:
            return args, kwargs  # DataLoader itself will say what is wrong with them
        arguments = bound.arguments
        changed = _loader_settings(loader, arguments)
        threads = loader.worker_threads
        ours = worker_threads(arguments.get("worker_init_fn"))  # a loader built again from one the remedy changed
        if threads is not None and _workers(arguments) > 0 and ours != threads:
            arguments["worker_init_fn"] = functools.partial(_init_worker, arguments.get("worker_init_fn"), threads)
            changed.append(f"worker_init_fn=... torch.set_num_threads({threads})")
        if changed:
            self.said(f"DataLoader({', '.join(changed)})" + (f" at {where}" if where else ""))
        return bound.args[1:], bound.kwargs

    def on_batch(self, batch: Any) -> None:
        """Remember the pinned tensors of a batch the loader returned, for their copies to be non-blocking."""
        if self.remedy.non_blocking_batches:
            for tensor in _tensors(batch, BATCH_DEPTH):
                if tensor.is_pinned():
                    self._batch_tensors[id(tensor)] = tensor

    def _from_batch(self, tensor: Any) -> bool:
        return self._batch_tensors.get(id(tensor)) is tensor

    def _non_blocking(self, method: str, positional: int) -> Callable[[Any], Any]:
        """A wrapper of Tensor.`method` that adds non_blocking=True to a copy of a pinned loader batch, unless the
        call gives its own: as a keyword, or positionally after `positional` arguments (`.to(device, dtype,
        non_blocking)`, `.cuda(device, non_blocking)`)."""
        from_batch, said = self._from_batch, self.said

        def make(original: Any) -> Any:
            def copy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                if len(args) <= positional and "non_blocking" not in kwargs and from_batch(tensor):
                    kwargs["non_blocking"] = True
                    said(f"non_blocking=True on .{method}() copies of the loader's pinned batches")
                return original(tensor, *args, **kwargs)

            return copy

        return make


def _workers(arguments: dict[str, Any]) -> int:
    workers = arguments.get("num_workers", 0)
    return workers if isinstance(workers, int) else 0


def _loader_settings(loader: LoaderRemedy, arguments: dict[str, Any]) -> list[str]:
    """Set the remedy's DataLoader settings in `arguments`; what was changed, as `name=value`. Settings that need
    workers are left out without them, and pinning without a GPU."""
    changed = []
    for name, value in loader.settings().items():
        if name in ("persistent_workers", "prefetch_factor", "multiprocessing_context") and _workers(arguments) == 0:
            continue
        if name == "pin_memory" and value and not _has_gpu():
            continue
        if name == "multiprocessing_context" and arguments.get(name) is None and (
                multiprocessing.get_start_method(allow_none=True) == value):
            continue  # the loader's workers start that way already
        current = arguments.get(name)
        if current != value:
            arguments[name] = value
            changed.append(f"{name}={value!r}")
    return changed


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def worker_threads(worker_init_fn: object) -> int | None:
    """The intra-op threads a remedy's worker_init_fn sets in each worker; None for any other."""
    if isinstance(worker_init_fn, functools.partial) and worker_init_fn.func is _init_worker:
        threads = worker_init_fn.args[1]
        return threads if isinstance(threads, int) else None
    return None


def _init_worker(script_init: Callable[[int], Any] | None, threads: int, worker_id: int) -> None:
    """A loader worker's start: the script's own worker_init_fn, then the try's intra-op threads."""
    import torch

    if script_init is not None:
        script_init(worker_id)
    torch.set_num_threads(threads)


def _tensors(batch: Any, depth: int) -> list[Any]:
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if depth == 0:
        return []
    if isinstance(batch, (list, tuple)):
        return [t for item in batch for t in _tensors(item, depth - 1)]
    if isinstance(batch, dict):
        return [t for item in batch.values() for t in _tensors(item, depth - 1)]
    return []
